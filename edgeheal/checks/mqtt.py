"""MQTT broker reachability, one check per ``[[mqtt.targets]]`` entry (check name = target).

Why per path: in the field incident the host reached the cloud broker while the containers
did not, because the container path runs through Flannel's WireGuard tunnel and the host
path does not. A ``tunnel`` target and a ``direct`` target side by side turn that
difference into a diagnosis (:mod:`edgeheal.core.path_verdict`).

Two ways of observing, both free of threads and subprocesses:

- an ordinary target is probed every ``interval`` (default 60 s) over a session kept
  open between probes (:class:`edgeheal.boundaries.mqtt.session.Session`): the first probe
  is a CONNECT answered by CONNACK, every later one a PINGREQ answered by PINGRESP (160
  bytes instead of a connection's 644); a session lost between probes is made again in
  the probe, one that does not answer fails it and the next probe connects afresh (with
  TLS resuming the previous session); a failed tunnel-path probe asks the alert link to
  confirm itself at once (:meth:`edgeheal.boundaries.mqtt.link.Link.confirm`), so the
  direct path's verdict is fresh when the paths are compared. Frugal in health, quick
  in doubt: after a failed probe (or while the target is not ok) the agent re-probes
  after ``retry_interval`` (2 s) rather than ``interval``, so ``fail_after`` and
  ``recover_after`` are reached in seconds; and the WireGuard check, when its counters
  raise a suspicion, asks for the tunnel-path probe at once (``Context.hasten``). The
  scheduling is the agent's (:func:`edgeheal.agent.cadence.next_due`); the reasoning behind the
  defaults is in ``docs/mqtt.md``;
- the ``[alerts] target`` is never probed: its kept-open connection
  (``Context.alert_link``, built once by the agent and run by the alert engine) already
  proves or disproves reachability with its keepalive, so the check only reads the link's
  state, at the agent's ``check_interval`` (reading costs nothing on the wire). Without a
  link in the context (a context built by hand) the alert target is probed like any other.

Reasons (closed table; every reason maps to one state):

==================  =======  ===========================================================
reason              state    meaning
==================  =======  ===========================================================
``ok``              ok       CONNACK received (probe), or the alert link is up
``refused``         failed   the broker rejected us: credentials/authorization (config)
``tls_error``       failed   TLS handshake failed (trust, name, not a TLS port)
``timeout``         failed   no CONNACK / keepalive answer within the deadline
``unreachable``     failed   refused, no route, unresolvable host, connection lost
``protocol_error``  failed   the peer is not an MQTT broker
``config_error``    failed   password_file or a TLS file cannot be read, or a setting
                             cannot be sent (host name, client id)
``internal_error``  failed   an unexpected error in edgeheal while connecting (logged)
``connecting``      unknown  the alert link has not finished its first attempt
==================  =======  ===========================================================

Metrics: ``edgeheal_mqtt_up{target,path}`` (1/0) and ``edgeheal_mqtt_connect_seconds
{target}`` (CONNECT -> CONNACK of the last successful connect).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat
from edgeheal.checks import Check, Registration, register
from edgeheal.model import CheckResult, Context, Kind, State

if TYPE_CHECKING:
    from edgeheal.boundaries.mqtt import ProbeResult
    from edgeheal.boundaries.mqtt.session import Session
    from edgeheal.config import CheckSettings, Config, MqttTarget
    from edgeheal.model import AlertLink

log = logging.getLogger(__name__)

STATES = {"ok": State.OK, "refused": State.FAILED, "tls_error": State.FAILED,
          "timeout": State.FAILED, "unreachable": State.FAILED,
          "protocol_error": State.FAILED, "config_error": State.FAILED,
          "internal_error": State.FAILED, "connecting": State.UNKNOWN}
"""The closed reason -> state table (see the module docstring)."""


class _Metrics:
    def __init__(self, ctx: Context) -> None:
        from prometheus_client import Gauge

        self.up = Gauge("edgeheal_mqtt_up", "1 if the MQTT target answered its last probe "
                        "(or its kept-open connection is up).", ["target", "path"],
                        registry=ctx.registry)
        self.connect_seconds = Gauge("edgeheal_mqtt_connect_seconds",
                                     "CONNECT to CONNACK round trip of the last successful "
                                     "connect, seconds.", ["target"], registry=ctx.registry)

    def record(self, target: MqttTarget, up: bool, rtt: float | None) -> None:
        self.up.labels(target=target.name, path=target.path).set(1 if up else 0)
        if rtt is not None:
            self.connect_seconds.labels(target=target.name).set(rtt)


def _detail(target: MqttTarget) -> dict[str, Any]:
    return {"host": target.host, "port": target.port, "path": target.path,
            "protocol": target.protocol, "tls": target.tls}


class MqttProbeCheck:
    """Probes one target per run: a PINGREQ on its kept-open session, or a CONNECT."""

    def __init__(self, ctx: Context, target: MqttTarget, metrics: _Metrics) -> None:
        self.name = target.name
        self.settings: CheckSettings = target
        self.ctx, self.target, self.metrics = ctx, target, metrics
        self._session: Session | None = None

    async def run(self) -> CheckResult:
        if self._session is None:
            from edgeheal.boundaries.mqtt.session import Session  # the boundary on demand

            self._session = Session(self.target, self.ctx.config.node)
        result: ProbeResult = await self._session.check()
        if not result.ok and self.target.path == "tunnel" and self.ctx.alert_link is not None:
            self.ctx.alert_link.confirm()  # is it the tunnel, or the uplink? ask now
        self.metrics.record(self.target, result.ok, result.rtt_seconds)
        detail = {**_detail(self.target), "kept_open": True,
                  "connects": self._session.connects}
        if result.rtt_seconds is not None:
            detail["connect_seconds"] = round(result.rtt_seconds, 6)
        if result.ping_seconds is not None:
            detail["ping_seconds"] = round(result.ping_seconds, 6)
        return CheckResult(STATES[result.reason], result.reason, result.message, detail)

    async def close(self) -> None:
        """The agent's shutdown: DISCONNECT the kept-open session."""
        if self._session is not None:
            await self._session.close()


class MqttLinkCheck:
    """Reads the kept-open alert connection's state; never opens a connection itself."""

    def __init__(self, ctx: Context, target: MqttTarget, metrics: _Metrics,
                 link: AlertLink) -> None:
        self.name = target.name
        self.settings: CheckSettings = dataclasses.replace(
            target, interval=ctx.config.agent.check_interval)
        self.ctx, self.target, self.metrics = ctx, target, metrics
        self.link = link

    async def run(self) -> CheckResult:
        if self.link.state.reason == "connecting":  # give the first attempt its time
            with contextlib.suppress(*compat.TimeoutErrors):
                async with compat.timeout(max(0.1, self.target.timeout * 0.9)):
                    while self.link.state.reason == "connecting":
                        await self.link.wait_change()
        state = self.link.state
        self.metrics.record(self.target, state.up, state.rtt_seconds if state.up else None)
        detail = {**_detail(self.target), "kept_open": True, "connects": state.connects,
                  "keepalive_seconds": self.target.keepalive}
        if state.up and state.rtt_seconds is not None:
            detail["connect_seconds"] = round(state.rtt_seconds, 6)
        return CheckResult(STATES.get(state.reason, State.FAILED), state.reason,
                           state.message, detail)


def _factory(ctx: Context) -> list[Check]:
    targets = ctx.config.mqtt.targets
    if not targets:
        return []
    metrics = _Metrics(ctx)
    checks: list[Check] = []
    for target in targets:
        if target.name == ctx.config.alerts.target and ctx.alert_link is not None:
            checks.append(MqttLinkCheck(ctx, target, metrics, ctx.alert_link))
        else:
            checks.append(MqttProbeCheck(ctx, target, metrics))
    return checks


KINDS: dict[str, Kind] = {
    "mqtt.unreachable": Kind(
        "critical", "An MQTT target cannot be reached or refuses us (critical for required "
        "targets, warning otherwise). `detail.reason` says how, `detail.path` which path.",
        problem=True),
    "mqtt.recovered": Kind("info", "The MQTT target answers again (clears the problem)."),
}


def _names(config: Config) -> tuple[str, ...]:
    return tuple(t.name for t in config.mqtt.targets)


def _validate(config: Config) -> None:
    """``[[mqtt.targets]]`` rules beyond the common keys, and ``alerts.target`` naming one."""
    import re  # the hook's imports stay with the hook

    from edgeheal.checks import registrations
    from edgeheal.config import ConfigError

    seen: dict[str, str] = {}
    for reg in registrations():
        if reg.module != "mqtt":
            seen.update(dict.fromkeys((reg.module, *reg.names(config)), reg.module))
    for i, target in enumerate(config.mqtt.targets):
        key = f"mqtt.targets[{i}]"
        if not target.name:
            raise ConfigError(f"{key}.name", "is required")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", target.name):
            raise ConfigError(f"{key}.name",
                              "use letters, digits, '-', '_' and '.' (it is a URL path part)")
        if target.name in seen:
            raise ConfigError(f"{key}.name", f"duplicate check name {target.name!r} "
                              f"(also {seen[target.name]})")
        seen[target.name] = key
        if not target.host:
            raise ConfigError(f"{key}.host", "is required")
        from edgeheal.boundaries.mqtt import client_id, host_problem, string_problem
        if (problem := host_problem(target.host)) is not None:
            raise ConfigError(f"{key}.host", problem)
        if (problem := string_problem(client_id(target, config.node))) is not None:
            raise ConfigError(f"{key}.client_id", f"the client id {problem}")
        if (problem := string_problem(target.username)) is not None:
            raise ConfigError(f"{key}.username", problem)
        if not 0 < target.port < 65536:
            raise ConfigError(f"{key}.port", f"expected 1-65535, got {target.port}")
        if target.tls is False and (target.ca_file or target.cert_file or target.key_file):
            raise ConfigError(f"{key}.tls",
                              "ca_file/cert_file/key_file are set but tls = false")
        if bool(target.cert_file) != bool(target.key_file):
            raise ConfigError(f"{key}.key_file", "cert_file and key_file go together")
        if target.keepalive < 1 or target.keepalive > 65535:
            raise ConfigError(f"{key}.keepalive", "expected 1s to 65535s")
        if target.password_file and not target.username and target.protocol == "3.1.1":
            raise ConfigError(f"{key}.username",
                              "MQTT 3.1.1 sends a password only with a user name")
    names = [t.name for t in config.mqtt.targets]
    if config.alerts.target and config.alerts.target not in names:
        raise ConfigError("alerts.target", f"no [[mqtt.targets]] entry named "
                          f"{config.alerts.target!r} ({', '.join(names) or 'none configured'})")


register(Registration("mqtt", _factory, names=_names, doc=__doc__ or "", kinds=KINDS,
                      alert=lambda status: ("mqtt.unreachable", "mqtt.recovered"),
                      validate=_validate, reasons=tuple(STATES), default_enabled=True))
