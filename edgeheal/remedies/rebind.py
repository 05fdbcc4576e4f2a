"""The ``rebind`` rung: move the WireGuard device to a fresh random UDP port, once, before
a Flannel restart.

Why: a carrier NAT keeps the mapping of a long-lived UDP flow as long as packets refresh it,
and WireGuard's persistent keepalive refreshes it forever. When the carrier moves the
node's public address, the flow of port 51820 keeps its old mapping: the cloud's answers go
to an address that is no longer the node's, and the tunnel is silently dead (issue 30:
opnsense/core#9066, ThisSeanZhang/landscape#214).
A Flannel restart does not help: Flannel re-creates ``flannel-wg`` on its
configured port (flannel-io/flannel ``pkg/backend/wireguard/device.go``: ``newWGDevice``
sets ``ListenPort`` to 51820), so the packets are the same flow and find the same stale
mapping. A new source port is a new flow and gets a fresh mapping; the cloud learns the new
endpoint from the next authenticated packet (WireGuard's roaming), with no configuration
on the cloud. This is what Tailscale does when it rebinds.

What it does not cure: flannel-io/flannel#1770's port drift, where the node's *endpoint*
for its peer is stale (a NAT's random port that no longer forwards). A new source port
still sends there; only the configured endpoint, which a Flannel restart sets again, cures
that (the lab's ``port-drift`` scenario, docs/remediation.md).

How: for each configured ``[wireguard] interfaces`` device that exists, read its port and
set a random one from the dynamic range (:data:`PORTS`), never 51820/51821 (Flannel's) nor
the current one, through :func:`edgeheal.boundaries.wg.set_listen_port` (UAPI or
netlink; no subprocess). A port in use is retried with another one (at most
:data:`ATTEMPTS`); if none binds, the old port is put back (wireguard-go closes its old
socket before binding the new one, so a failed set leaves it on no port at all) and the
rung fails. Recovery is verified by the actor like a restart's, within
``[remediation.rebind] verify_timeout``.

What it leaves: the device stays on the new port until Flannel applies its configured port
again — on every restart of Flannel (the k3s/k3s-agent unit with embedded Flannel, or the
Flannel pod) and whenever Flannel handles a lease event (``addPeer`` passes ``ListenPort``
with every peer it adds or changes: a node joining, a node's public IP changing). By then
the stale mapping of 51820 has usually expired (no packet has refreshed it since the
rebind); docs/wireguard.md says what the operator sees.

Privilege: the UAPI socket (root) or CAP_NET_ADMIN for netlink, as for reading.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from edgeheal.remedies import (
    PRE_RESTART,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from edgeheal.config import Config

log = logging.getLogger("edgeheal.remediation.rebind")

MODE = "rebind"
PORTS = (49152, 65535)
"""The IANA dynamic port range (RFC 6335), inclusive: no service listens there by
convention, and a carrier NAT maps any source port alike."""
FLANNEL_PORTS = frozenset({51820, 51821})
ATTEMPTS = 3
"""Ports tried when the chosen one is in use."""


class Rebind:
    mode = MODE

    def __init__(self, config: Config, *, uapi_dir: Path | None = None,
                 choose: Callable[[], int] | None = None) -> None:
        from edgeheal.boundaries import wg

        self.interfaces = config.wireguard.interfaces
        self.uapi_dir = wg.UAPI_DIR if uapi_dir is None else uapi_dir
        self.choose = choose or _random_port

    async def _devices(self) -> dict[str, int]:
        """Configured interfaces that exist now -> their listen port."""
        from edgeheal.boundaries import wg

        found: dict[str, int] = {}
        for name in self.interfaces:
            try:
                dev = await wg.read_device(name, uapi_dir=self.uapi_dir)
            except wg.NoSuchDevice:
                continue
            except wg.WireGuardError as err:
                raise RemedyError(str(err),
                                  config_problem=isinstance(err, wg.PermissionDenied)) from err
            found[name] = dev.listen_port
        return found

    async def probe(self) -> Availability:
        try:
            devices = await self._devices()
        except RemedyError as err:
            return Availability(False, str(err))
        if not devices:
            return Availability(False, "no WireGuard interface of "
                                f"{', '.join(self.interfaces) or '[wireguard] interfaces'}")
        return Availability(True, "moves " + ", ".join(
            f"{n} (port {p})" for n, p in devices.items()) + " to a random port")

    async def restart(self) -> RemedyOutcome:
        devices = await self._devices()
        if not devices:
            raise RemedyError("no WireGuard interface to rebind")
        moved = [await self._move(name, old) for name, old in devices.items()]
        return RemedyOutcome(target=", ".join(moved))

    async def _move(self, name: str, old: int) -> str:
        from edgeheal.boundaries import wg

        last: wg.WireGuardError | None = None
        for _ in range(ATTEMPTS):
            port = self.choose()
            if port == old or port in FLANNEL_PORTS:
                continue
            try:
                await wg.set_listen_port(name, port, uapi_dir=self.uapi_dir)
            except wg.ProtocolError as err:  # the port is taken: another one
                last = err
                continue
            except wg.WireGuardError as err:
                raise RemedyError(str(err),
                                  config_problem=isinstance(err, wg.PermissionDenied)) from err
            log.warning("rebind: %s moved from port %d to %d", name, old, port)
            return f"{name} port {old}->{port}"
        if old:
            try:  # a failed set may leave the device on no port: put the old one back
                await wg.set_listen_port(name, old, uapi_dir=self.uapi_dir)
            except wg.WireGuardError as err:
                log.error("rebind: could not put %s back on port %d: %s", name, old, err)
        raise RemedyError(f"{name}: no new port could be bound in {ATTEMPTS} attempts"
                          + (f" ({last.problem})" if last is not None else ""))


def _random_port() -> int:
    low, high = PORTS
    return low + secrets.randbelow(high - low + 1)


def _unavailable(config: Config) -> str:
    if not config.remediation.rebind.enabled:
        return "off ([remediation.rebind] enabled = false)"
    return "" if config.wireguard.interfaces else "no [wireguard] interfaces"


register(RemedyRegistration(
    mode=MODE, module="rebind", ladder=PRE_RESTART,
    factory=lambda needs: Rebind(needs.config), restart_bound=lambda config: 10.0,
    unavailable=_unavailable, settings="remediation.rebind",
    verify_bound=lambda config: config.remediation.rebind.verify_timeout,
    doc="Before a restart, once per failure: the WireGuard device to a fresh random UDP "
        "port, out of a carrier NAT's stale mapping (opt-in, `[remediation.rebind]`)."))
