"""WireGuard readers: per-peer state of a device, from whichever API the host offers.

Two implementations produce the same :class:`~edgeheal.boundaries.wg.readings.DeviceStats`:

* :mod:`edgeheal.boundaries.wg.uapi` talks to the cross-platform userspace API socket
  ``/var/run/wireguard/<ifname>.sock`` that wireguard-go and boringtun serve;
* :mod:`edgeheal.boundaries.wg.netlink` asks the kernel's ``wireguard`` generic netlink family
  through pyroute2 (imported only when used).

:func:`read_device` picks one per call: if the interface's UAPI socket exists, the
device is a userspace one and the socket is authoritative; otherwise the kernel is
asked. Neither runs ``wg``: the agent starts no subprocess in its steady state. Private
and preshared keys are dropped while parsing and never reach a ``DeviceStats``.

One write, for the ``rebind`` remedy: :func:`set_listen_port` moves a device to another
UDP port, through the same two APIs (UAPI ``set``, ``WG_CMD_SET_DEVICE``).
"""

from __future__ import annotations

from pathlib import Path

from edgeheal.boundaries.wg.readings import (
    DeviceStats,
    NoSuchDevice,
    PeerStats,
    PermissionDenied,
    ProtocolError,
    WireGuardError,
)

UAPI_DIR = Path("/var/run/wireguard")
"""Where wireguard-go and boringtun put their sockets (one per interface)."""

__all__ = [
    "UAPI_DIR",
    "DeviceStats",
    "NoSuchDevice",
    "PeerStats",
    "PermissionDenied",
    "ProtocolError",
    "WireGuardError",
    "read_device",
    "reader_kind",
    "set_listen_port",
]


def reader_kind(ifname: str, *, uapi_dir: Path = UAPI_DIR) -> str:
    """``"uapi"`` when the interface's userspace socket exists, else ``"netlink"``."""
    return "uapi" if (uapi_dir / f"{ifname}.sock").exists() else "netlink"


async def read_device(ifname: str, *, uapi_dir: Path = UAPI_DIR,
                      answer_within: float = 2.0) -> DeviceStats:
    """Read one device with the reader the host offers; raise a :class:`WireGuardError`."""
    if reader_kind(ifname, uapi_dir=uapi_dir) == "uapi":
        from edgeheal.boundaries.wg import uapi  # keep the package import light

        return await uapi.read(ifname, uapi_dir=uapi_dir, answer_within=answer_within)
    from edgeheal.boundaries.wg import netlink  # pyroute2 only when the kernel is asked

    return await netlink.read(ifname, answer_within=answer_within)


async def set_listen_port(ifname: str, port: int, *, uapi_dir: Path = UAPI_DIR,
                          answer_within: float = 2.0) -> None:
    """Move ``ifname`` to UDP ``port`` with the API the host offers; raise a
    :class:`WireGuardError` (the port in use is a :class:`ProtocolError`)."""
    if reader_kind(ifname, uapi_dir=uapi_dir) == "uapi":
        from edgeheal.boundaries.wg import uapi

        await uapi.set_listen_port(ifname, port, uapi_dir=uapi_dir,
                                   answer_within=answer_within)
        return
    from edgeheal.boundaries.wg import netlink

    await netlink.set_listen_port(ifname, port, answer_within=answer_within)
