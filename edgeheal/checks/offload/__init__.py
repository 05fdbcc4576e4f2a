"""Check ``offload``: TX checksum offload stays off on the configured interfaces.

Why: a NIC that checksums in hardware can get WireGuard-encapsulated packets wrong (the
field incident: the cloud gateway dropped the node's rekey packets for bad checksums).
The work is done by the reconciler in :mod:`edgeheal.checks.offload.enforcer`: this check's
``serve()`` runs it on rtnetlink link events (an interface appearing, re-created or changed is fixed
at once), and each ``run()`` is a full re-verification pass -- a safety net that also
corrects, with cause ``recheck``. With ``[offload] interfaces`` empty there is no check.

Reasons (closed table):

=====================  ==========  =====================================================
reason                 state       meaning
=====================  ==========  =====================================================
``ok``                 ok          every configured feature is off (or fixed off, or not
                                   present) on every present matching interface
``drift_corrected``    ok          as ``ok``, but since the last run a feature was found
                                   on again and was turned off (counted, and emitted as
                                   ``offload.drift_corrected``)
``cannot_disable``     degraded    a feature is on and fixed (``fixed-on``), the driver
                                   refused to turn it off, or the driver failed
``offload_on``         degraded    ``enforce = false`` (observe only) and a feature is on
``interface_missing``  ok/failed   no present interface matches; ``failed`` when
                                   ``require_interface = true``
``permission_denied``  unknown     turning features off needs CAP_NET_ADMIN
=====================  ==========  =====================================================

Metrics: ``edgeheal_offload_feature_enabled{interface,feature}`` (0/1) and
``edgeheal_offload_corrections_total{interface,cause}`` (``boot``, ``link_event``,
``recheck``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from edgeheal.checks import Check, Registration, register
from edgeheal.checks.offload.enforcer import Correction, Enforcer, Outcome, Report, report_detail
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, State

if TYPE_CHECKING:
    from edgeheal.config import CheckSettings, Config, OffloadSettings

log = logging.getLogger(__name__)

NAME = "offload"
REASONS = ("ok", "drift_corrected", "cannot_disable", "offload_on", "interface_missing",
           "permission_denied")
"""The closed reason table (the module docstring says what each means)."""


def judge(report: Report, settings: OffloadSettings, drift: list[Correction]) -> CheckResult:
    """Pure: one pass's report (+ drift since the last run) -> the check's result."""
    detail = report_detail(report)
    detail["enforce"] = settings.enforce
    if drift:
        detail["drift_corrected"] = [
            {"interface": d.interface, "features": list(d.features), "cause": d.cause}
            for d in drift]
    denied = [i for i in report.interfaces if i.error == "permission_denied"]
    if denied:
        return CheckResult(State.UNKNOWN, "permission_denied",
                           f"{denied[0].message}; run the agent as root", detail)
    if not report.interfaces and settings.require_interface:
        return CheckResult(
            State.FAILED, "interface_missing",
            f"no interface matches {', '.join(settings.interfaces)} "
            "(require_interface = true)", detail)
    bad = report.outcomes(Outcome.FIXED_ON, Outcome.REFUSED)
    broken = [i for i in report.interfaces if i.error == "error"]
    if bad or broken:
        parts = [f"{n}: {r.feature} {r.outcome.value}" for n, r in bad]
        parts += [i.message for i in broken]
        return CheckResult(State.DEGRADED, "cannot_disable",
                           "cannot turn off: " + "; ".join(parts), detail)
    on = report.outcomes(Outcome.ON)
    if on:
        return CheckResult(State.DEGRADED, "offload_on",
                           "offload is on (enforce = false): "
                           + ", ".join(f"{n}: {r.feature}" for n, r in on), detail)
    if not report.interfaces:
        return CheckResult(State.OK, "interface_missing",
                           f"no interface matches {', '.join(settings.interfaces)}; "
                           "it is fixed as soon as one appears", detail)
    names = ", ".join(i.interface for i in report.interfaces)
    if drift:
        fixed = "; ".join(f"{d.interface}: {', '.join(d.features)} ({d.cause})"
                          for d in drift)
        return CheckResult(State.OK, "drift_corrected",
                           f"offload was on again and was turned off: {fixed}", detail)
    return CheckResult(State.OK, "ok", f"TX checksum offload off on {names}", detail)


class OffloadCheck:
    """The ``offload`` check and its link-event reconciler."""

    name = NAME

    def __init__(self, ctx: Context, settings: OffloadSettings, *,
                 enforcer: Enforcer | None = None) -> None:
        self.settings: CheckSettings = settings
        self.offload = settings
        self.enforcer = enforcer or Enforcer(
            settings.interfaces, settings.features, enforce=settings.enforce,
            registry=ctx.registry, emit=ctx.emit)

    async def run(self) -> CheckResult:
        report = await self.enforcer.reconcile("recheck")
        return judge(report, self.offload, self.enforcer.take_drift())

    async def serve(self) -> None:
        await self.enforcer.serve()

    async def close(self) -> None:
        await self.enforcer.close()


def _factory(ctx: Context) -> list[Check]:
    settings = ctx.config.offload
    if not settings.interfaces:
        return []
    return [OffloadCheck(ctx, settings)]


KINDS: dict[str, Kind] = {
    "offload.drift_corrected": Kind(
        "warning", "TX checksum offload was found on again and was turned off."),
    "offload.cannot_disable": Kind(
        "critical", "TX checksum offload is on and cannot be turned off.", problem=True),
    "offload.recovered": Kind("info", "Offload is off again (clears the problem)."),
}


def _alert(status: CheckStatus) -> tuple[str, str]:
    if status.reason == "cannot_disable":
        return "offload.cannot_disable", "offload.recovered"
    return "check.failed", "check.recovered"


def _validate(config: Config) -> None:
    """``[offload]``: interface names or globs, and kernel feature names we know."""
    import difflib  # the hook's imports stay with the hook

    from edgeheal.checks.offload.feature_table import KERNEL_FEATURES  # small, pure table
    from edgeheal.config import ConfigError

    for i, pattern in enumerate(config.offload.interfaces):
        if not pattern or "/" in pattern:
            raise ConfigError(f"offload.interfaces[{i}]", f"not an interface name: {pattern!r}")
    for i, name in enumerate(config.offload.features):
        if name not in KERNEL_FEATURES:
            near = difflib.get_close_matches(name, KERNEL_FEATURES, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            valid = ", ".join(sorted(KERNEL_FEATURES))
            raise ConfigError(f"offload.features[{i}]",
                              f"unknown feature {name!r}{hint}; valid names: {valid}")


register(Registration(NAME, _factory, names=lambda config: (NAME,), doc=__doc__ or "",
                      kinds=KINDS, alert=_alert, validate=_validate, reasons=REASONS,
                      default_enabled=True, role="offload"))
