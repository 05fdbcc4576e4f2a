"""Fault injection: the API server's bad moments, on demand and counted.

Why: the agent's client must survive what a loaded or restarting API server does — 429
``TooManyRequests`` with ``Retry-After`` (API Priority and Fairness), 500, 503 and 504
with the API server's own ``Status`` wording — and a race is only testable when it happens
at an exact moment. So a test arms a :class:`Fault` for the next ``times`` requests that
match a method, a path and a query: :meth:`Faults.fail` answers in place of the handler,
:meth:`Faults.slow` waits first, :meth:`Faults.before` runs a change just before the
request is handled (e.g. the pod recreated under the same name before a DELETE). Faults
act after authentication and before authorization, as a real server's overload does.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from edgeheal.lab.kubeapi.wire import error_response


@dataclass
class Fault:
    status: int = 0
    delay: float = 0.0
    retry_after: float | None = None
    times: int = 1
    method: str | None = None
    path: str | None = None
    """A regular expression searched in the request path."""
    query: str | None = None
    """A regular expression searched in the (encoded) query string."""
    call: Callable[[], object] | None = None
    """Run just before the request is handled (e.g. :meth:`FakeKube.compact`)."""

    def matches(self, request: web.Request) -> bool:
        return (self.times > 0 and (self.method is None or request.method == self.method)
                and (self.path is None or re.search(self.path, request.path) is not None)
                and (self.query is None
                     or re.search(self.query, request.query_string) is not None))



class Faults:
    """The armed faults, first match wins (see the module docstring)."""

    def _setup_faults(self) -> None:
        self._faults: list[Fault] = []

    def fail(self, status: int, *, times: int = 1, retry_after: float | None = None,
             method: str | None = None, path: str | None = None,
             query: str | None = None) -> Fault:
        fault = Fault(status=status, retry_after=retry_after, times=times, method=method,
                      path=path, query=query)
        self._faults.append(fault)
        return fault

    def slow(self, delay: float, *, times: int = 1, method: str | None = None,
             path: str | None = None, query: str | None = None) -> Fault:
        fault = Fault(delay=delay, times=times, method=method, path=path, query=query)
        self._faults.append(fault)
        return fault

    def before(self, call: Callable[[], object], *, times: int = 1, method: str | None = None,
               path: str | None = None, query: str | None = None) -> Fault:
        """Run ``call`` just before matching requests are handled (a race made exact)."""
        fault = Fault(call=call, times=times, method=method, path=path, query=query)
        self._faults.append(fault)
        return fault

    async def _inject(self, request: web.Request) -> web.Response | None:
        """Play the first fault matching ``request``: the answer in place of the
        handler's, or None to go on."""
        for fault in self._faults:
            if fault.matches(request):
                fault.times -= 1
                if fault.call is not None:
                    fault.call()
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status:
                    return self._injected(fault)
                break
        return None

    @staticmethod
    def _injected(fault: Fault) -> web.Response:
        reasons = {429: ("TooManyRequests", "Too many requests, please try again later."),
                   500: ("InternalError", "Internal error occurred: injected"),
                   503: ("ServiceUnavailable", "the server is currently unable to handle "
                         "the request"),
                   504: ("Timeout", "the server was unable to return a response in the "
                         "time allotted, but may still be processing the request")}
        reason, message = reasons.get(fault.status, ("InternalError",
                                                     f"injected {fault.status}"))
        details = ({"retryAfterSeconds": math.ceil(fault.retry_after)}
                   if fault.retry_after is not None else {})
        injected = error_response(fault.status, reason, message, **details)
        if fault.retry_after is not None:
            injected.headers["Retry-After"] = f"{fault.retry_after:g}"
        return injected
