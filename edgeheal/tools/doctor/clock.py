"""Time: is the system clock synchronized? TLS to the broker and the Kubernetes API check
certificate validity against it, and an edge box without a battery-backed clock boots with
whatever time it saved last.

The kernel's own NTP status, read with ``adjtimex(2)`` (``modes = 0``, never a change):
an NTP client (systemd-timesyncd, chrony, ntpd) clears ``STA_UNSYNC`` once it has
synchronized the clock; ``TIME_ERROR`` means the same from the state machine's side.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from edgeheal.base.compat import UTC
from edgeheal.tools.doctor.finding import Finding, fail, ok, warn

if TYPE_CHECKING:
    from edgeheal.tools.doctor.system import System

PLAUSIBLE_AFTER = datetime(2025, 1, 1, tzinfo=UTC)
"""A wall clock before this is wrong for certain (older than this software)."""
FIX = ("enable an NTP client (`timedatectl set-ntp true` for systemd-timesyncd, or chrony) "
       "and let it reach its servers (UDP 123) over the uplink")


def synchronized(system: System) -> Finding:
    name = "time"
    now = datetime.fromtimestamp(system.wall(), UTC)
    shown = now.strftime("%Y-%m-%d %H:%M:%SZ")
    if now < PLAUSIBLE_AFTER:
        return fail(name, f"the clock says {shown}, before this software existed: TLS "
                    "certificates will look not yet valid", FIX, wall=shown)
    try:
        state = system.clock()
    except OSError as err:
        return warn(name, f"cannot read the kernel's clock state: {err}", FIX, wall=shown)
    detail = {"wall": shown, "state": state.state, "status": state.status,
              "maxerror_us": state.maxerror_us, "synchronized": state.synchronized}
    if not state.synchronized:
        return warn(name, f"the kernel marks the clock unsynchronized (clock {shown}): "
                    "nothing has set it from NTP since boot, so TLS to the broker and the "
                    "Kubernetes API fails if it is off", FIX, **detail)
    return ok(name, f"synchronized (clock {shown}, max error "
              f"{state.maxerror_us / 1000:.0f} ms)", **detail)
