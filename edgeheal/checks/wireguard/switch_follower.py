"""The tunnel check's side of an uplink switch: re-learn the sources, re-set the endpoints.

A change of the ``uplink`` check's active interface (its ``detail.active`` in the
snapshot: interface and switch count; docs/failover.md) makes the memo of learned source
addresses stale (:class:`edgeheal.checks.wireguard.egress_memo.EgressMemo`): it is
forgotten, so the next route lookups learn the new uplink's and a later send failure is
diagnosed against the address really in use. And a userspace WireGuard device
(wireguard-go, boringtun: ``reader == "uapi"``) keeps sending from the address it last used
("sticky sockets"): with ``[wireguard] forget_source`` the next run sets each watched
peer's endpoint again, to the value it has (:mod:`edgeheal.boundaries.wg.sticky`). A kernel
device drops a stale source by itself and is never written to. The uplink check asks for
the tunnel check's run at once after a switch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.boundaries.wg.readings import DeviceStats, WireGuardError
from edgeheal.checks.wireguard.egress_memo import EgressMemo

if TYPE_CHECKING:
    from edgeheal.config import WireguardSettings
    from edgeheal.model import Context

log = logging.getLogger("edgeheal.checks.wireguard")  # the parent's name: operators grep it

Forget = Callable[[str, str, str], Awaitable[None]]
"""``async (ifname, public_key, endpoint)``: make a userspace device forget the peer's
sticky source (:mod:`edgeheal.boundaries.wg.sticky`)."""


async def _forget_source(ifname: str, public_key: str, endpoint: str) -> None:
    from edgeheal.boundaries.wg import UAPI_DIR
    from edgeheal.boundaries.wg.sticky import forget_source

    await forget_source(ifname, public_key, endpoint, uapi_dir=UAPI_DIR)


class SwitchFollower:
    """Watches the uplink checks' ``detail.active``; see the module docstring."""

    def __init__(self, ctx: Context, settings: WireguardSettings,
                 forget: Forget | None = None) -> None:
        self.ctx = ctx
        self._settings = settings
        self._forget = forget or _forget_source
        self._forget_due = False
        """The active uplink switched: re-set the watched peers' endpoints (userspace)."""
        self._uplinks = checks.role("uplink").names(ctx.config)
        self._active: Any = None
        """The uplink check's last ``detail.active`` (interface, switches) seen."""

    def follow(self, memo: EgressMemo) -> None:
        """Forget every learned source address when the active uplink switched (the
        uplink check's ``detail.active`` in the snapshot): the next lookups learn the new
        uplink's. The uplink check asks for this run at once after a switch."""
        snap = self.ctx.snapshot()
        for name in self._uplinks:
            status = snap.checks.get(name)
            active = status.detail.get("active") if status is not None else None
            if not isinstance(active, Mapping):
                continue
            seen = (active.get("interface"), active.get("switches"))
            if seen != self._active:
                if self._active is not None and memo.learned:
                    log.info("active uplink now %s: re-learning the source addresses",
                             seen[0], extra={"check": "wireguard"})
                    memo.clear()
                if self._active is not None and seen[0] is not None:
                    self._forget_due = self._settings.forget_source
                self._active = seen

    async def forget_sources(self, devices: list[DeviceStats],
                             chosen: dict[str, set[str]]) -> None:
        """After a switch: re-set each watched peer's endpoint on a userspace device, so
        it stops sending from the old uplink's address (a kernel device needs nothing)."""
        if not self._forget_due:
            return
        self._forget_due = False
        for device in devices:
            if device.reader != "uapi":
                continue
            peers = [p for p in device.peers
                     if p.public_key in chosen.get(device.interface, set()) and p.endpoint]
            done = 0
            for p in peers:
                try:
                    await self._forget(device.interface, p.public_key, str(p.endpoint))
                    done += 1
                except WireGuardError as err:
                    log.warning("cannot re-set peer %s's endpoint: %s", p.fingerprint, err,
                                extra={"check": "wireguard", "interface": device.interface})
            if done:
                log.info("uplink failover: %d peer(s) on %s re-set to their endpoint, so "
                         "the device sends from the new uplink's address", done,
                         device.interface, extra={"check": "wireguard",
                                                  "interface": device.interface})


__all__ = ["Forget", "SwitchFollower"]
