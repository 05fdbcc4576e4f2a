"""Runs inside the QEMU guest (tests/qemu): kernel WireGuard read by edgeheal's generic
netlink reader, compared with ``wg show DEV dump``. Prints one JSON object; the host test
asserts on it. Usage: ``python3 guest_wg.py setup|compare NS DEV|errors NS``."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import subprocess
import sys
from typing import Any

from edgeheal.boundaries import wg
from edgeheal.boundaries.wg import netlink
from edgeheal.boundaries.wg.readings import format_endpoint, key_from_hex  # noqa: F401 - used in compare

MANY = 3001
"""Allowed IPs of one peer: the kernel splits such a dump over several netlink messages."""


def sh(*argv: str, stdin: str | None = None) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          input=stdin).stdout.strip()


def setup() -> dict[str, Any]:
    """Namespaces a and b joined by a veth (IPv4 + IPv6), wga <-> wgb over IPv6, plus a
    never-handshaked peer with MANY allowed IPs on wga."""
    for ns in ("a", "b"):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "va", "netns", "a", "type", "veth", "peer", "name", "vb",
       "netns", "b")
    keys = {n: sh("wg", "genkey") for n in ("a", "b", "c")}
    pub = {n: sh("wg", "pubkey", stdin=k) for n, k in keys.items()}
    for ns, me, other, port in (("a", "1", "2", 51820), ("b", "2", "1", 51821)):
        dev = f"wg{ns}"
        sh("ip", "-n", ns, "addr", "add", f"fd00::{me}/64", "dev", f"v{ns}", "nodad")
        sh("ip", "-n", ns, "link", "set", f"v{ns}", "up")
        sh("ip", "-n", ns, "link", "add", dev, "type", "wireguard")
        with open(f"/tmp/key-{ns}", "w") as f:
            f.write(keys[ns])
        peer = "b" if ns == "a" else "a"
        sh("ip", "netns", "exec", ns, "wg", "set", dev, "private-key", f"/tmp/key-{ns}",
           "listen-port", str(port), "peer", pub[peer], "allowed-ips", f"10.9.0.{other}/32",
           "endpoint", f"[fd00::{other}]:{51821 if ns == 'a' else 51820}")
        sh("ip", "-n", ns, "addr", "add", f"10.9.0.{me}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    net = ipaddress.ip_network("10.128.0.0/12")
    many = ",".join(f"{a}/32" for _, a in zip(range(MANY), net.hosts(), strict=False))
    sh("ip", "netns", "exec", "a", "wg", "set", "wga", "peer", pub["c"], "allowed-ips", many,
       "endpoint", "192.0.2.9:51820")
    sh("ip", "netns", "exec", "a", "ping", "-c", "1", "-W", "5", "10.9.0.2")
    return {"pub": pub}


def dump(dev: str) -> dict[str, Any]:
    lines = sh("wg", "show", dev, "dump").splitlines()
    head = lines[0].split("\t")
    peers = {}
    for line in lines[1:]:
        key, _psk, endpoint, allowed, hs, rx, tx, ka = line.split("\t")
        peers[key] = {"endpoint": None if endpoint == "(none)" else endpoint,
                      "allowed_ips": sorted(allowed.split(",")) if allowed != "(none)" else [],
                      "last_handshake": None if hs == "0" else int(hs),
                      "rx_bytes": int(rx), "tx_bytes": int(tx),
                      "persistent_keepalive": 0 if ka == "off" else int(ka)}
    return {"listen_port": int(head[2]), "peers": peers}


async def ours(dev: str) -> tuple[dict[str, Any], int, str]:
    stats = await wg.read_device(dev)
    from pyroute2.netlink.generic.wireguard import AsyncWireGuard

    sock = AsyncWireGuard()
    try:
        await sock.setup_endpoint()
        parts = len([m async for m in await sock.info(dev)])
    finally:
        sock.close()
    peers = {p.public_key: {"endpoint": p.endpoint, "allowed_ips": sorted(p.allowed_ips),
                            "last_handshake": (None if p.last_handshake is None
                                               else int(p.last_handshake)),
                            "rx_bytes": p.rx_bytes, "tx_bytes": p.tx_bytes,
                            "persistent_keepalive": p.persistent_keepalive}
             for p in stats.peers}
    return {"listen_port": stats.listen_port, "peers": peers}, parts, stats.reader


def compare(dev: str) -> dict[str, Any]:
    for _ in range(3):  # counters may move between the reads: retry until a quiet moment
        before = dump(dev)
        mine, parts, reader = asyncio.run(ours(dev))
        after = dump(dev)
        if before == after:
            break
    return {"dump": before, "ours": mine, "parts": parts, "reader": reader}


def errors() -> dict[str, str]:
    out = {}
    for case, dev in (("absent", "nope0"), ("not_wireguard", "va")):
        try:
            asyncio.run(netlink.read(dev))
            out[case] = "no error"
        except wg.WireGuardError as err:
            out[case] = f"{type(err).__name__}: {err}"
    pid = os.fork()
    if pid == 0:  # without CAP_NET_ADMIN: an unprivileged user
        os.setgid(65534)
        os.setuid(65534)
        try:
            asyncio.run(netlink.read("wga"))
            msg = "no error"
        except wg.WireGuardError as err:
            msg = f"{type(err).__name__}: {err}"
        with open("/tmp/noperm", "w") as f:
            f.write(msg)
        os._exit(0)
    os.waitpid(pid, 0)
    with open("/tmp/noperm") as f:
        out["no_cap_net_admin"] = f.read()
    return out


if __name__ == "__main__":
    what = sys.argv[1]
    result = (setup() if what == "setup" else compare(sys.argv[2]) if what == "compare"
              else errors())
    print(json.dumps(result))
