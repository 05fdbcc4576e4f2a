"""``edgeheal doctor``: is this node set up to stay connected?

Before the agent can help, the node must be sane: a WireGuard implementation, the tunnel's
keepalive, an MTU that fits the cellular link, offload off, a synchronized clock, a
writable state directory, reachable brokers, credentials that grant what remediation needs,
the service itself. Each is a small function in a module of this package, returning
:class:`~edgeheal.tools.doctor.finding.Finding` rows (check, ok/warn/fail/skip, what was found,
how to fix it), against a :class:`~edgeheal.tools.doctor.system.System` that tests replace:

==================  ===========================================================
module              checks
==================  ===========================================================
``mtu``             ``mtu`` (tunnel MTU + overhead <= uplink MTU), ``mtu.probe``
``config_files``    ``config``, ``config.files``
``wireguard``       ``wireguard.available``, ``.interfaces``, ``.keepalive``,
                    ``.route``
``offload``         ``offload``
``clock``           ``time``
``state``           ``state.dir``, ``state.outbox``, ``state.formats``
``reach``           ``mqtt.direct``, ``mqtt.tunnel``
``kubernetes``      ``kubernetes.api``, ``kubernetes.rbac``
``k3s_service``     ``k3s-service.unit``, ``k3s-service.polkit``
``service``         ``service``, ``service.hardening``
==================  ===========================================================

Read-only (see :mod:`edgeheal.tools.doctor.system` for the two small exceptions) and bounded:
every network call has its own deadline, so the whole run takes a few seconds (up to ~25 s
more with ``--probe-mtu``). An MTU mismatch is the first row when there is one. The
command (:mod:`edgeheal.cli.doctor`) turns the rows into a table or JSON
(``schemas/doctor.schema.json``) and the exit status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from edgeheal.tools.doctor import (
    clock,
    config_files,
    k3s_service,
    kubernetes,
    mtu,
    offload,
    reach,
    service,
    state,
    wireguard,
)
from edgeheal.tools.doctor.finding import Finding, Result, fail
from edgeheal.tools.doctor.system import System

if TYPE_CHECKING:
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.doctor")  # the name operators grep for

__all__ = ["Finding", "Result", "System", "examine", "exit_code", "render", "to_json"]


async def _guard(name: str, work: Callable[[], Awaitable[Any]]) -> list[Finding]:
    """Run one group of checks; a bug in it becomes a failing row, not a crash."""
    try:
        found = await work()
    except Exception as err:
        log.debug("doctor check %s raised", name, exc_info=True)
        return [fail(name, f"the check itself failed: {type(err).__name__}: {err}",
                     "a bug in edgeheal doctor: please report it with this line")]
    return list(found) if isinstance(found, list) else [found]


async def examine(config: Config, system: System, *, probe_mtu: bool = False,
                  ) -> list[Finding]:
    """Every check, in the table's order (a failing MTU row first)."""
    tunnel = await wireguard.observe(config, system)

    async def now(value: Any) -> Any:
        return value

    def sync(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
        return lambda: now(fn())

    async def k3s() -> list[Finding]:
        found, unit = await k3s_service.unit(config, system)
        return [found, await k3s_service.polkit(config, system, unit)]

    async def the_service() -> list[Finding]:
        props = await service.read(system)
        return [service.running(props), service.hardening(props)]

    async def mtus() -> list[Finding]:
        rows = await mtu.static(config, tunnel, system)
        return rows + (await mtu.probe(config, tunnel, system) if probe_mtu else [])

    # the network checks wait on others: run them alongside the local ones
    remote = asyncio.gather(_guard("mqtt", lambda: reach.brokers(config, system)),
                            _guard("kubernetes", lambda: kubernetes.api(config, system)))
    try:
        local: Sequence[list[Finding]] = [
            await _guard("config", sync(lambda: config_files.valid(config))),
            await _guard("config.files", sync(lambda: config_files.files(config))),
            await _guard("wireguard.available", sync(lambda: wireguard.available(system))),
            await _guard("wireguard.interfaces",
                         sync(lambda: wireguard.interfaces(config, tunnel))),
            await _guard("wireguard.keepalive",
                         sync(lambda: wireguard.keepalive(config, tunnel))),
            await _guard("wireguard.route", lambda: wireguard.routes(config, tunnel, system)),
            await _guard("mtu", mtus),
            await _guard("offload", sync(lambda: offload.features(config, system))),
            await _guard("time", sync(lambda: clock.synchronized(system))),
            await _guard("state.dir", sync(lambda: state.directory(config))),
            await _guard("state.outbox", sync(lambda: state.outbox(config, system))),
            await _guard("state.formats", sync(lambda: state.formats(config))),
        ]
        network = await remote
    except BaseException:
        remote.cancel()
        raise
    rest = [await _guard("k3s-service", k3s), await _guard("service", the_service)]
    rows = [row for group in (*local, *network, *rest) for row in group]
    first = [r for r in rows if r.check.startswith("mtu") and r.result is Result.FAIL]
    return first + [r for r in rows if r not in first]


def exit_code(findings: Sequence[Finding]) -> int:
    """0 nothing fails (warnings allowed), 1 something fails."""
    return 1 if any(f.result is Result.FAIL for f in findings) else 0


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {r.value: sum(1 for f in findings if f.result is r) for r in Result}


def overall(findings: Sequence[Finding]) -> str:
    counts = summary(findings)
    return "fail" if counts["fail"] else "warn" if counts["warn"] else "ok"


def to_json(config: Config, findings: Sequence[Finding]) -> dict[str, Any]:
    """The ``--json`` document (``schemas/doctor.schema.json``)."""
    from edgeheal import __version__

    return {"node": config.node, "version": __version__, "config": config.source,
            "result": overall(findings), "exit_code": exit_code(findings),
            "counts": summary(findings), "findings": [f.to_json() for f in findings]}


def render(findings: Sequence[Finding], *, width: int = 100) -> str:
    """The table: check, result, what was found and, under it, the fix."""
    import textwrap

    check_w = max([len("CHECK"), *(len(f.check) for f in findings)])
    indent = " " * (check_w + 2 + 6 + 2)
    text_w = max(30, width - len(indent))
    lines = [f"{'CHECK'.ljust(check_w)}  RESULT  FOUND / FIX"]
    for f in findings:
        body = textwrap.wrap(f.found, text_w, break_on_hyphens=False) or [""]
        lines.append(f"{f.check.ljust(check_w)}  {f.result.value.ljust(6)}  {body[0]}")
        lines += [indent + more for more in body[1:]]
        if f.fix:
            lines += [indent + part for part in textwrap.wrap("fix: " + f.fix, text_w,
                                                             break_on_hyphens=False)]
    counts = summary(findings)
    lines.append("")
    lines.append(", ".join(f"{counts[r.value]} {r.value}" for r in Result))
    return "\n".join(lines)
