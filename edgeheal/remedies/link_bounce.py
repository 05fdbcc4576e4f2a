"""The ``link-bounce`` rung: set the uplink interface down and up again over rtnetlink.

Why second: when a new data session did not help (or ModemManager is not there), taking
the link down and up makes the modem's driver (qmi_wwan, cdc_mbim, cdc_ether) and the
kernel drop and rebuild the interface's state — queues, neighbour entries, the routes the
manager re-adds — without touching USB. It is ``ip link set dev wwan0 down; sleep 2;
ip link set dev wwan0 up`` done over rtnetlink
(:func:`edgeheal.boundaries.kernel.interfaces.bounce`, the light pyroute2 socket), no subprocess;
the link is set up again even if the agent is stopped mid-bounce. Only the interfaces matching
``[uplink] interfaces`` that exist now are bounced. Privilege: ``CAP_NET_ADMIN`` (the unit already
grants it to the offload enforcer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

MODE = "link-bounce"
DOWN_FOR = 2.0
"""Seconds the link stays down (a modem driver needs a moment to notice)."""


class LinkBounce:
    mode = MODE

    def __init__(self, config: Config, *, netns: str | None = None,
                 down_for: float = DOWN_FOR) -> None:
        self.patterns = config.uplink.interfaces
        self.netns, self.down_for = netns, down_for

    async def _names(self) -> list[str]:
        from edgeheal.boundaries.kernel import interfaces as ifstate  # pyroute2, lazily

        try:
            found = await ifstate.read(self.patterns, netns=self.netns)
        except ifstate.IfStateError as err:
            raise RemedyError(str(err)) from err
        if not found:
            raise RemedyError(f"no interface matches {', '.join(self.patterns)}")
        return [i.name for i in found]

    async def probe(self) -> Availability:
        try:
            names = await self._names()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"bounces {', '.join(names)} over rtnetlink")

    async def restart(self) -> RemedyOutcome:
        from edgeheal.boundaries.kernel import interfaces as ifstate

        names = await self._names()
        for name in names:
            try:
                await ifstate.bounce(name, down_for=self.down_for, netns=self.netns)
            except ifstate.IfStateError as err:
                raise RemedyError(str(err), config_problem="ermission" in str(err)) \
                    from err
        return RemedyOutcome(target=", ".join(names))


register(RemedyRegistration(
    mode=MODE, module="link_bounce", ladder=UPLINK,
    factory=lambda needs: LinkBounce(needs.config), restart_bound=lambda config: 30.0,
    unavailable=lambda config: "" if config.uplink.interfaces else "no [uplink] interfaces",
    settings="remediation.uplink",
    doc="Uplink rung 2: the uplink interface down and up again over rtnetlink."))
