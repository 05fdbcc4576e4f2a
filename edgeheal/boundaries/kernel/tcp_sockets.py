"""TCP sockets: the kernel's table of them (``/proc/net/tcp``, ``tcp6``) and one handshake.

Why the table: the ``control`` check's cheapest evidence is what the kernel already knows
about the K3s agent's connections to its server — their state, the bytes sent and not
yet acknowledged, and how many times in a row the oldest of them was retransmitted
without an answer — and that costs one read of two small proc files, no process, no
packet. The columns are the kernel's ``tcp4_seq_show``/``tcp6_seq_show``
(``net/ipv4/tcp_ipv4.c``, ``net/ipv6/tcp_ipv6.c``): ``tx_queue`` is ``write_seq -
snd_una`` (sent or queued, not acknowledged), ``retrnsmt`` is ``icsk_retransmits``
(consecutive retransmissions of the unacknowledged segment: 0 again at the first ACK that
moves ``snd_una``), and the column after the uid is ``icsk_probes_out`` (zero-window or
keepalive probes unanswered). Addresses are the raw network-order words printed in the
host's byte order. Why not ``sock_diag`` netlink: it gives the same fields plus
``tcp_info``, but needs pyroute2 (RSS) or a hand-written netlink parser for the few
fields the table already carries.

The table is the reader's network namespace's (``/proc/self/net``, or a process's:
``proc_net=/proc/<pid>/net``, which is how a test reads a namespace it made).

Why the handshake: "is the server reachable directly?" is answered by one TCP connect
to it (no data: about 200 bytes on the wire, a SYN retransmitted at 1 s and 3 s when
lost), made only when the cheap evidence is suspicious.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edgeheal.base import compat

STATES = {1: "established", 2: "syn_sent", 3: "syn_recv", 4: "fin_wait1", 5: "fin_wait2",
          6: "time_wait", 7: "close", 8: "close_wait", 9: "last_ack", 10: "listen",
          11: "closing", 12: "new_syn_recv"}
"""``include/net/tcp_states.h``."""


ADDRESSES_END = 100
"""A row's first characters hold its slot and both endpoints (``tcp6``: 32 hex digits an
address, about 81 characters); the fields after them (queues, timers) never hold a
colon followed by exactly four hex digits and a space."""


class TcpTableError(Exception):
    """The table could not be read (no procfs, a namespace that is gone)."""


@dataclass(frozen=True, slots=True)
class Socket:
    """One row of the table."""

    local: tuple[str, int]
    remote: tuple[str, int]
    state: str
    unacked: int
    """``tx_queue``: bytes sent (or queued) and not yet acknowledged."""
    retransmits: int
    """Consecutive retransmissions of the oldest unacknowledged segment."""
    probes: int
    """Unanswered zero-window or keepalive probes."""
    uid: int


def _address(word: str) -> str:
    raw = b"".join(int(word[i:i + 8], 16).to_bytes(4, sys.byteorder)
                   for i in range(0, len(word), 8))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


def _endpoint(field: str) -> tuple[str, int]:
    word, _, port = field.partition(":")
    return _address(word), int(port, 16)


def parse(text: str, ports: Iterable[int] | None = None) -> list[Socket]:
    """The rows of one ``/proc/net/tcp`` or ``tcp6`` text (its header line skipped);
    with ``ports``, only those with one of them at either end (a substring test per line
    first: on a node with a thousand sockets, parsing every row is most of the cost)."""
    marks = None if ports is None else tuple(f":{p:04X} " for p in ports)
    out: list[Socket] = []
    for line in text.splitlines()[1:]:
        if marks is not None and not any(m in line[:ADDRESSES_END] for m in marks):
            continue  # a prefilter: the callers match the endpoints exactly
        cols = line.split()
        if len(cols) < 10:
            continue
        try:
            out.append(Socket(
                _endpoint(cols[1]), _endpoint(cols[2]), STATES.get(int(cols[3], 16), "?"),
                int(cols[4].partition(":")[0], 16), int(cols[6], 16), int(cols[8]),
                int(cols[7])))
        except ValueError:
            continue  # a row the kernel wrote otherwise: not ours to guess at
    return out


def table(proc_net: str | Path = "/proc/self/net", ports: Iterable[int] | None = None,
          ) -> list[Socket]:
    """Every TCP socket of the namespace, IPv4 and IPv6 (IPv4-mapped shown as IPv4);
    with ``ports``, only those with one of them at either end."""
    rows: list[Socket] = []
    found = False
    for name in ("tcp", "tcp6"):
        try:
            rows += parse((Path(proc_net) / name).read_text(encoding="ascii"), ports)
            found = True
        except FileNotFoundError:
            continue  # no IPv6 on this kernel
        except OSError as err:
            raise TcpTableError(f"{proc_net}/{name}: {err.strerror or err}") from err
    if not found:
        raise TcpTableError(f"{proc_net}: no tcp table (procfs not mounted?)")
    return rows


def local_addresses(proc_net: str | Path = "/proc/self/net") -> frozenset[str]:
    """The namespace's own addresses: IPv4 from ``fib_trie``'s ``/32 host LOCAL`` leaves,
    IPv6 from ``if_inet6`` (read only when the check compares them with the Node's)."""
    found: set[str] = set()
    last = ""
    try:
        for line in (Path(proc_net) / "fib_trie").read_text(encoding="ascii").splitlines():
            stripped = line.strip()
            if stripped.startswith("|--"):
                last = stripped[3:].strip()
            elif stripped == "/32 host LOCAL" and last:
                found.add(last)
    except OSError as err:
        raise TcpTableError(f"{proc_net}/fib_trie: {err.strerror or err}") from err
    try:
        for line in (Path(proc_net) / "if_inet6").read_text(encoding="ascii").splitlines():
            word = line.split()[0] if line.split() else ""
            if len(word) == 32:
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(word))))
    except FileNotFoundError:
        pass
    except OSError as err:
        raise TcpTableError(f"{proc_net}/if_inet6: {err.strerror or err}") from err
    return frozenset(found)


def to(rows: Iterable[Socket], endpoints: Iterable[tuple[str, int]]) -> list[Socket]:
    """The rows whose remote end is one of ``endpoints``."""
    wanted = set(endpoints)
    return [r for r in rows if r.remote in wanted]


async def handshake(host: str, port: int, timeout: float) -> str:
    """One TCP connect and close: ``ok``, ``timeout``, or the errno's name."""
    try:
        async with compat.timeout(timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except compat.TimeoutErrors:
        return "timeout"
    except socket.gaierror:
        return "unresolvable"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, type(err).__name__)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return "ok"
