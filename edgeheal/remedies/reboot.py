"""The ``reboot`` rung: reboot the node through logind — the last resort, off by default.

Why a reboot at all: a modem that does not come back from a re-authorized USB device (or
whose USB controller hangs) is what field engineers drive out to power-cycle. Why so
guarded: a reboot takes every workload down. So: off unless ``[remediation.uplink] reboot
= true``; at most once a day and never within ``startup_grace`` of boot (the ladder's pure
decision, :mod:`edgeheal.core.uplink_ladder`); and the alert saying so is committed to the durable
outbox *before* the call (the actor's ``before`` hook refuses the reboot when the outbox
cannot take it), so the cloud learns why the node went away once it is back.

The call: ``org.freedesktop.login1.Manager.Reboot(b interactive)`` with ``interactive =
false`` on the system bus (systemd-logind; ``systemctl reboot`` asks the same). logind asks
polkit for ``org.freedesktop.login1.reboot``, which ``49-edgeheal-reboot.rules`` grants
(installed only with ``install.sh --allow-reboot``); ``-multiple-sessions`` (someone is
logged in) and ``-ignore-inhibit`` (a block inhibitor such as a package upgrade) are
deliberately not granted, so logind refuses then (docs/uplink-privileges.md). A denial is
a configuration problem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeheal.boundaries.bus import BusError, connect, system_address
from edgeheal.remedies import (
    UPLINK,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from edgeheal.config import Config

MODE = "reboot"
LOGIND = "org.freedesktop.login1"
LOGIND_PATH = "/org/freedesktop/login1"
LOGIND_MANAGER = "org.freedesktop.login1.Manager"


class Reboot:
    mode = MODE

    def __init__(self, *, bus_address: str = "") -> None:
        self.address = system_address(bus_address)

    async def probe(self) -> Availability:
        try:
            async with connect(self.address) as bus:
                if not await bus.has_owner(LOGIND):
                    return Availability(False, "systemd-logind is not on the system bus")
                (answer,) = await bus.call(LOGIND, LOGIND_PATH, LOGIND_MANAGER, "CanReboot")
        except BusError as err:
            return Availability(False, str(err))
        if answer not in ("yes", "challenge"):
            return Availability(False, f"logind CanReboot says {answer}")
        return Availability(True, f"logind Reboot (CanReboot: {answer})")

    async def restart(self) -> RemedyOutcome:
        try:
            async with connect(self.address) as bus:
                await bus.call(LOGIND, LOGIND_PATH, LOGIND_MANAGER, "Reboot", "b", [False])
        except BusError as err:
            raise RemedyError(f"logind refused the reboot: {err}",
                              config_problem=err.kind in ("denied", "absent")) \
                from err
        return RemedyOutcome(target="node")


def _unavailable(config: Config) -> str:
    return "" if config.remediation.uplink.reboot else "remediation.uplink.reboot is false"


register(RemedyRegistration(
    mode=MODE, module="reboot", ladder=UPLINK,
    factory=lambda needs: Reboot(), restart_bound=lambda config: 30.0,
    unavailable=_unavailable, settings="remediation.uplink",
    doc="Uplink rung 4: reboot through logind; off by default, at most once a day, never "
        "within `startup_grace` of boot, its alert durable first."))
