"""The capture: N seconds of the tunnel's UDP on the uplink, counted (scapy, CAP_NET_RAW).

scapy is imported inside :func:`capture` and :func:`require_capture` only, so neither the
agent nor any other command pays for it.

The capture socket gets a classic BPF program (:func:`bpf_program`) that passes only UDP on
the listen ports, built here rather than by libpcap (which scapy needs for filter strings
and edge nodes rarely have). It addresses the IP header with the kernel's ``SKF_NET_OFF``,
so it works on Ethernet and on raw-IP 4G interfaces (wwan) alike. Every packet is checked
again in Python, so the filter only saves work, never decides.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import select
import socket
import struct
import time
from collections.abc import Sequence

from edgeheal.tools.diagnose.errors import CaptureUnavailable, DiagnoseError
from edgeheal.tools.diagnose.wire import Tally

log = logging.getLogger("edgeheal.diagnose.capture")  # the name operators grep for

CAP_NET_RAW = 13
SNAPLEN = 262144

SKF_AD_OFF = -0x1000
SKF_AD_PROTOCOL = 0
SKF_NET_OFF = -0x100000
_LD, _LDX, _ALU, _JMP, _RET, _MISC = 0x00, 0x01, 0x04, 0x05, 0x06, 0x07
_W, _H, _B = 0x00, 0x08, 0x10
_ABS, _IND = 0x20, 0x40
_JEQ, _JSET, _AND, _LSH, _K, _TAX = 0x10, 0x40, 0x50, 0x60, 0x00, 0x00


def bpf_program(ports: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Classic BPF: accept IPv4/IPv6 UDP with source or destination port in ``ports``.

    Offsets are relative to the network header (``SKF_NET_OFF``), and the family comes from
    ``skb->protocol`` (``SKF_AD_PROTOCOL``), so the link layer does not matter. IPv4
    fragments after the first are dropped (no UDP header); IPv6 extension headers are not
    followed (WireGuard sends none).
    """
    if not ports or len(ports) > 32:
        raise ValueError("between 1 and 32 ports")
    code: list[tuple[int, int | str, int | str, int] | str] = []
    """Instructions, and label strings marking the index of the next instruction."""

    def op(c: int, k: int = 0, jt: int | str = 0, jf: int | str = 0) -> None:
        code.append((c, jt, jf, k & 0xFFFFFFFF))

    def port_tests(final: bool) -> None:
        for i, port in enumerate(ports):
            last = i == len(ports) - 1
            op(_JMP | _JEQ | _K, port, "accept", "drop" if final and last else 0)

    op(_LD | _W | _ABS, SKF_AD_OFF + SKF_AD_PROTOCOL)
    op(_JMP | _JEQ | _K, 0x0800, "v4", 0)
    op(_JMP | _JEQ | _K, 0x86DD, "v6", "drop")
    code.append("v4")
    op(_LD | _B | _ABS, SKF_NET_OFF + 9)
    op(_JMP | _JEQ | _K, 17, 0, "drop")
    op(_LD | _H | _ABS, SKF_NET_OFF + 6)
    op(_JMP | _JSET | _K, 0x1FFF, "drop", 0)
    op(_LD | _B | _ABS, SKF_NET_OFF)
    op(_ALU | _AND | _K, 0x0F)
    op(_ALU | _LSH | _K, 2)
    op(_MISC | _TAX)
    op(_LD | _H | _IND, SKF_NET_OFF)
    port_tests(final=False)
    op(_LD | _H | _IND, SKF_NET_OFF + 2)
    port_tests(final=True)
    code.append("v6")
    op(_LD | _B | _ABS, SKF_NET_OFF + 6)
    op(_JMP | _JEQ | _K, 17, 0, "drop")
    op(_LD | _H | _ABS, SKF_NET_OFF + 40)
    port_tests(final=False)
    op(_LD | _H | _ABS, SKF_NET_OFF + 42)
    port_tests(final=True)
    code.append("accept")
    op(_RET | _K, SNAPLEN)
    code.append("drop")
    op(_RET | _K, 0)
    labels: dict[str, int] = {}
    real: list[tuple[int, int | str, int | str, int]] = []
    for row in code:
        if isinstance(row, str):
            labels[row] = len(real)
        else:
            real.append(row)

    def target(j: int | str, index: int) -> int:
        offset = labels[j] - index - 1 if isinstance(j, str) else j
        if not 0 <= offset <= 255:
            raise ValueError("BPF jump out of range")
        return offset

    return [(c, target(jt, i), target(jf, i), k) for i, (c, jt, jf, k) in enumerate(real)]


def attach_filter(sock: socket.socket, ports: Sequence[int]) -> None:
    """Attach :func:`bpf_program` to a packet socket (``SO_ATTACH_FILTER``)."""
    import ctypes

    program = bpf_program(ports)
    insns = b"".join(struct.pack("HBBI", c, jt, jf, k) for c, jt, jf, k in program)
    buf = ctypes.create_string_buffer(insns)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    so_attach_filter = 26
    sock.setsockopt(socket.SOL_SOCKET, so_attach_filter, fprog)


def has_cap_net_raw(status_path: str = "/proc/self/status") -> bool | None:
    """CAP_NET_RAW in the effective set (None: cannot tell)."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_RAW & 1)
    except (OSError, ValueError):
        return None
    return None


def require_capture() -> None:
    """Raise :class:`CaptureUnavailable` unless scapy imports and a packet socket opens."""
    try:
        import scapy  # noqa: F401
    except ImportError as err:
        raise CaptureUnavailable(
            "scapy is not installed; diagnose captures with it (install the Python package "
            "'scapy' into edgeheal's environment)") from err
    if has_cap_net_raw() is False:
        raise CaptureUnavailable(
            "capturing packets needs CAP_NET_RAW (run as root, e.g. with sudo)")
    try:
        probe = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except PermissionError as err:
        raise CaptureUnavailable(
            "capturing packets needs CAP_NET_RAW (run as root, e.g. with sudo)") from err
    probe.close()


def capture(uplink: str, ports: Sequence[int], seconds: float) -> Tally:
    """Count the WireGuard messages on ``uplink`` for ``seconds`` (scapy, CAP_NET_RAW).

    Our own receive loop rather than scapy's ``sniff``: ``sniff`` drops a socket that
    reports an error and ends early, and a packet socket reports ENETDOWN once when its
    link flaps, which is exactly when a diagnosis must keep listening.
    """
    try:
        from scapy.arch.linux import L2ListenSocket  # heavy, only here
        from scapy.config import conf
        from scapy.layers.inet import IP, UDP
        from scapy.layers.inet6 import IPv6
    except ImportError as err:
        raise CaptureUnavailable(f"scapy is not installed or incomplete: {err}") from err
    try:
        iface = conf.ifaces.dev_from_name(uplink)
        local = frozenset(str(ipaddress.ip_address(a.split("%")[0]))
                          for family in (4, 6) for a in iface.ips.get(family, ()))
    except (ValueError, KeyError) as err:
        raise DiagnoseError(f"{uplink}: no such interface") from err
    wanted = frozenset(ports)
    tally = Tally()
    try:
        sock = L2ListenSocket(iface=uplink, promisc=False, nofilter=1)
    except PermissionError as err:
        raise CaptureUnavailable("capturing packets needs CAP_NET_RAW") from err
    except OSError as err:
        raise DiagnoseError(f"{uplink}: cannot capture: {err.strerror or err}") from err
    try:
        try:
            attach_filter(sock.ins, ports)
        except OSError as err:  # the Python check below still filters
            log.debug("BPF filter not attached: %s", err)
        deadline = time.monotonic() + seconds
        while (remain := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([sock.ins], [], [], remain)
            if not ready:
                continue
            try:
                pkt = sock.recv()
            except OSError as err:
                if err.errno not in (errno.ENETDOWN, errno.ENODEV, errno.ENXIO):
                    raise DiagnoseError(f"{uplink}: capture failed: {err}") from err
                tally.link_down += 1
                continue
            if pkt is None:
                continue
            ip = pkt.getlayer(IP) or pkt.getlayer(IPv6)
            udp = pkt.getlayer(UDP)
            if ip is None or udp is None or (
                    udp.sport not in wanted and udp.dport not in wanted):
                continue
            tally.add(str(ip.src), int(udp.sport), str(ip.dst), int(udp.dport),
                      bytes(udp.payload), local=local, ports=wanted)
    finally:
        sock.close()
    return tally


__all__ = ["attach_filter", "bpf_program", "capture", "has_cap_net_raw", "require_capture"]
