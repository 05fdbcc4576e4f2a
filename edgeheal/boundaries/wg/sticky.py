"""Make a userspace WireGuard device forget a peer's sticky source address.

Why: WireGuard remembers, per peer, the local address (and interface) it last sent from
and keeps sending from it ("sticky sockets"). After an uplink failover that address belongs
to the old uplink (or to nothing): the replies to it are routed to the dead link. The
kernel module notices by itself on the next send (``drivers/net/wireguard/socket.c``,
``send4``/``send6``: a source that ``inet_confirm_addr`` no longer finds local, or a route
leaving through another interface than the remembered one, is zeroed and chosen afresh),
so on a kernel device nothing needs doing. wireguard-go (and boringtun) clear it only
when a handshake retransmission times out (wireguard-go ``device/timers.go``,
``expiredRetransmitHandshake`` -> ``markEndpointSrcForClearing``): in the lab 10-15 s of
a dead tunnel and a false ``send_failing``. Setting the peer's endpoint again through the
UAPI (``set=1``, ``public_key=``, ``update_only=true``, ``endpoint=`` the endpoint it
already has; https://www.wireguard.com/xplatform/) replaces the endpoint object, source
included (wireguard-go ``device/uapi.go``: ``peer.endpoint.val = endpoint``), so the next
packet leaves from the new uplink's address. Nothing else of the peer changes; the
endpoint is the one just read, so roaming is not undone.

Errors: :class:`~edgeheal.boundaries.wg.readings.WireGuardError` subclasses, as the
reader's: the message names the interface, never a key.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

from edgeheal.base import compat
from edgeheal.boundaries.wg.readings import NoSuchDevice, PermissionDenied, ProtocolError

log = logging.getLogger(__name__)


def request(public_key: str, endpoint: str) -> bytes:
    """The UAPI ``set`` request that re-sets ``endpoint`` on an existing peer only."""
    raw = base64.b64decode(public_key, validate=True)
    if len(raw) != 32 or not endpoint or "\n" in endpoint:
        raise ValueError("expected a 32-byte key and an endpoint")
    return (f"set=1\npublic_key={raw.hex()}\nupdate_only=true\nendpoint={endpoint}\n\n"
            .encode())


async def forget_source(ifname: str, public_key: str, endpoint: str, *, uapi_dir: Path,
                        answer_within: float = 2.0) -> None:
    """Re-set ``endpoint`` on peer ``public_key`` of userspace device ``ifname``."""
    path = uapi_dir / f"{ifname}.sock"
    try:
        body = request(public_key, endpoint)
    except ValueError as err:
        raise ProtocolError(ifname, f"cannot re-set a peer's endpoint: {err}") from None
    writer = None
    try:
        async with compat.timeout(answer_within):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(body)
            await writer.drain()
            answer = (await reader.readuntil(b"\n\n")).decode("utf-8", "replace")
    except FileNotFoundError:
        raise NoSuchDevice(ifname, f"no userspace API socket at {path}") from None
    except ConnectionRefusedError:
        raise NoSuchDevice(ifname, f"nothing listens on {path} (daemon gone)") from None
    except PermissionError as err:
        raise PermissionDenied(ifname, f"cannot open {path}: {err.strerror}") from err
    except compat.TimeoutErrors:
        raise ProtocolError(ifname, f"no answer on {path} within {answer_within:g}s") \
            from None
    except (OSError, asyncio.IncompleteReadError) as err:
        raise ProtocolError(ifname, f"{path}: {err}") from err
    finally:
        if writer is not None:
            writer.close()
    if answer.strip() != "errno=0":
        raise ProtocolError(ifname, f"setting a peer's endpoint answered "
                            f"{answer.strip()[:40]!r}")
