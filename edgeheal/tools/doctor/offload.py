"""Offload: the configured TX checksum features are off on every matching uplink, by the
enforcer's own reading (:func:`edgeheal.checks.offload.enforcer.apply` with ``act=False``: the
ethtool ioctls that read, never the ones that change)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeheal.tools.doctor.finding import Finding, fail, ok, skip, warn

if TYPE_CHECKING:
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import System


def features(config: Config, system: System) -> Finding:
    from edgeheal.boundaries.kernel.ethtool import EthtoolError
    from edgeheal.checks.offload.enforcer import Outcome, apply

    name = "offload"
    settings = config.offload
    if not settings.enabled or not settings.interfaces:
        return skip(name, "no [offload] interfaces configured (the enforcer does nothing)")
    source = system.features()
    try:
        report = apply(source, settings.interfaces, settings.features, act=False)
    except EthtoolError as err:
        return fail(name, f"cannot read features: {err}", "run edgeheal doctor as root")
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    if not report.interfaces:
        text = f"no interface matches {', '.join(settings.interfaces)}"
        if settings.require_interface:
            return fail(name, text, "check [offload] interfaces against `ip link` (the "
                        "modem's interface name)", unmatched=list(report.unmatched))
        return warn(name, text + " (the agent fixes an interface when it appears)",
                    "check [offload] interfaces against `ip link` if the uplink is already "
                    "up", unmatched=list(report.unmatched))
    on = report.outcomes(Outcome.ON, Outcome.FIXED_ON, Outcome.REFUSED)
    errors = [i for i in report.interfaces if i.error]
    names = [i.interface for i in report.interfaces]
    if errors:
        return fail(name, "; ".join(i.message for i in errors), "run edgeheal doctor as root")
    if on:
        listed = ", ".join(f"{i} {r.feature} ({r.outcome.value})" for i, r in on)
        fixed = any(r.outcome is Outcome.FIXED_ON for _, r in on)
        fix = ("the driver cannot turn it off: use another NIC or driver" if fixed else
               "run `edgeheal offload apply` now and check that edgeheal-offload.service is "
               "enabled (it turns them off at boot) and the agent runs (it keeps them off)")
        return fail(name, f"still on: {listed}", fix, on=[f"{i}:{r.feature}" for i, r in on])
    return ok(name, f"{', '.join(settings.features)} off on {', '.join(names)}",
              interfaces=names)
