"""The uplink check's verdict (pure): one run's :class:`Evidence` -> a :class:`CheckResult`.

No I/O and no clock: the check (:mod:`edgeheal.checks.uplink`) gathers the evidence — the
interfaces, the second probe, the modem, how long nothing has passed — and this module
judges it by the reasons table of the check's docstring, first match wins (the modem's own
failures before the link's: the docstring says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal.model import CheckResult, State

if TYPE_CHECKING:
    from edgeheal.boundaries.kernel.interfaces import Interface
    from edgeheal.boundaries.modemmanager.readings import Modem

REASONS = ("ok", "stuck", "no_coverage", "no_address", "no_route", "link_down", "silent",
           "modem_not_ready", "modem_absent", "modem_failed", "registration_denied")
"""Every reason the verdict gives (``edgeheal_check_reason``'s closed table)."""
REGISTERED = frozenset({"home", "roaming"})
"""3GPP registration states with service."""
NOT_READY = frozenset({"failed", "unknown", "initializing", "locked", "disabled",
                       "disabling", "enabling"})
"""MMModemState names of a modem that is not (yet) usable: not coverage, not stuck."""
NO_SERVICE = frozenset({"enabled", "searching"})
"""MMModemState names of a modem that is enabled but has no network."""
NOT_SILENCE = frozenset({"no_coverage", "link_down", "no_address", "no_route",
                         "modem_not_ready", "modem_absent", "modem_failed",
                         "registration_denied"})
"""Verdicts that explain the silence: it counts towards ``stuck`` only from the end of
the last of them, so the first run after coverage returns (the modem registered again,
the first packet not yet in) is not ``stuck`` for the whole outage."""
SIM_FIXES = {
    "sim-missing": ("sim_missing", "no SIM: insert one (or select a slot that holds one)"),
    "sim-error": ("sim_error", "the SIM is unusable (permanently locked or faulty): replace "
                  "it or unlock it with its PUK"),
    "esim-without-profiles": ("esim_without_profiles",
                              "the eSIM has no profile: provision one"),
}
"""``StateFailedReason`` names that a person must fix at the SIM: (detail, the fix)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One run's observations (pure input of :func:`judge`)."""

    interfaces: tuple[Interface, ...]
    modem: Modem | None
    """The uplink's modem (None: not asked, no ModemManager, or no modem)."""
    modem_note: str
    """Why there is no modem ("ModemManager not running: ..."), or ""."""
    silent_for: float
    """Seconds nothing has passed (0: traffic now)."""
    probe: str
    """The second probe's last answer (``ok``, ``timeout``, an errno name) or "" (none)."""
    absent_for: float = 0.0
    """Seconds the modem seen on the uplink has been missing (0: not missing)."""
    absent_after: float = math.inf
    """``[uplink] modem_absent_after``."""


def judge(ev: Evidence, window: float) -> CheckResult:
    """The verdict (pure; the table in :mod:`edgeheal.checks.uplink`'s docstring)."""
    detail: dict[str, Any] = {
        "interfaces": {i.name: {"oper": i.oper.lower(), "carrier": i.carrier,
                                "addresses": len(i.addresses),
                                "default_route": i.default_route} for i in ev.interfaces},
        "silent_seconds": round(ev.silent_for, 1)}
    if ev.probe:
        detail["probe"] = ev.probe
    m = ev.modem
    if m is not None:
        bearer = next((b for b in m.bearers if b.connected), None)
        detail["modem"] = {"state": m.state, "registration": m.registration,
                           "signal_quality": m.signal_quality,
                           "bearer_connected": bearer is not None,
                           "bearer_interface": bearer.interface if bearer else ""}
        if m.state == "failed":
            detail["modem"]["failed_reason"] = m.failed_reason
        if m.unlock_required not in ("none", "unknown"):
            detail["modem"]["unlock_required"] = m.unlock_required
        if m.reject_cause:
            detail["modem"]["reject_cause"] = m.reject_cause
    elif ev.modem_note:
        detail["modem"] = {"note": ev.modem_note}
    if m is None and ev.absent_for and ev.absent_for >= ev.absent_after:
        why = ev.modem_note or "no modem"
        return CheckResult(State.FAILED, "modem_absent", (
            f"the uplink's modem is gone for {ev.absent_for:.0f}s ({why}): longer than a "
            "re-enumeration takes"), detail)
    if m is not None:
        early = _modem_verdict(m, detail)
        if early is not None:
            return early
    if not ev.interfaces:
        return CheckResult(State.FAILED, "link_down", "no uplink interface exists", detail)
    up = [i for i in ev.interfaces if i.carries]
    if not up:
        states = ", ".join(f"{i.name} {i.oper.lower()}"
                           + ("" if i.carrier else " no carrier") for i in ev.interfaces)
        return CheckResult(State.FAILED, "link_down", f"uplink down ({states})", detail)
    if m is not None:
        if m.state in NOT_READY:
            return CheckResult(State.UNKNOWN, "modem_not_ready",
                               f"the modem is {m.state}", detail)
        no_reg = bool(m.registration) and m.registration not in REGISTERED
        if no_reg or m.state in NO_SERVICE or (m.signal_recent and m.signal_quality == 0):
            why = (f"registration {m.registration}" if no_reg
                   else f"modem {m.state}" if m.state in NO_SERVICE else "no signal")
            return CheckResult(State.FAILED, "no_coverage",
                               f"no coverage ({why}, signal {m.signal_quality}%)", detail)
    addressed = [i for i in up if i.addresses]
    if not addressed:
        return CheckResult(State.FAILED, "no_address",
                           f"{', '.join(i.name for i in up)}: no address", detail)
    if not any(i.default_route for i in addressed):
        return CheckResult(State.FAILED, "no_route",
                           f"no default route through {', '.join(i.name for i in addressed)}",
                           detail)
    if ev.silent_for < window:
        return CheckResult(State.OK, "ok", "the uplink carries traffic" if not ev.silent_for
                           else f"silent for {ev.silent_for:.0f}s (stuck after "
                           f"{window:g}s)", detail)
    what = "the probe fails" if ev.probe else "rx flat"
    if m is None:
        return CheckResult(State.UNKNOWN, "silent", (
            f"nothing passes for {ev.silent_for:.0f}s ({what}), and without the modem's "
            f"state the agent cannot tell no coverage from a stuck modem"), detail)
    if not any(b.connected for b in m.bearers):
        return CheckResult(State.UNKNOWN, "silent", (
            f"nothing passes for {ev.silent_for:.0f}s ({what}); the modem has no connected "
            "bearer (its manager is reconnecting?)"), detail)
    return CheckResult(State.FAILED, "stuck", (
        f"stuck: nothing passes for {ev.silent_for:.0f}s ({what}) although the modem is "
        f"{m.registration or m.state} with signal {m.signal_quality}% and a connected "
        "bearer"), detail)


def _modem_verdict(m: Modem, detail: dict[str, Any]) -> CheckResult | None:
    """The verdicts the modem's own report decides before the link's (module docstring)."""
    if m.state == "failed":
        sim = SIM_FIXES.get(m.failed_reason)
        if sim is not None:
            detail["modem"]["not_ready"] = sim[0]
            return CheckResult(State.UNKNOWN, "modem_not_ready",
                               f"the modem failed: {sim[1]}", detail)
        return CheckResult(State.FAILED, "modem_failed", (
            f"ModemManager marks the modem failed (reason {m.failed_reason}): a firmware or "
            "driver fault ModemManager does not recover from by itself"), detail)
    if m.state == "locked":
        lock = m.unlock_required if m.unlock_required not in ("none", "unknown") else "a PIN"
        detail["modem"]["not_ready"] = "sim_locked"
        return CheckResult(State.UNKNOWN, "modem_not_ready", (
            f"the SIM is locked ({lock}): unlock it (`mmcli -i SIM --pin=...`, or the PIN in "
            "the connection's settings); no rung can"), detail)
    if m.registration == "denied":
        cause = f", reject cause {m.reject_cause} {m.reject_name}" if m.reject_cause else ""
        return CheckResult(State.FAILED, "registration_denied", (
            f"the network denies registration{cause}: a SIM, subscription or plan the "
            "operator refuses (out of credit, barred, not provisioned)"), detail)
    return None

