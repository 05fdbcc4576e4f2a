"""Runs inside the QEMU guest (tests/qemu): the ``wireguard`` check, with the shipped
settings, on kernel WireGuard devices at Flannel's keepalive (K = 25 s), one fault per
case, all cases at once so the run lasts as long as the longest (the incident, ~4 min).

Usage: ``ip netns exec EDGE python3 guest_check.py OUT CASE...``. The process's own
namespace is the edge node (the agent's namespace: the check's default netlink reader and
rtnetlink egress diagnosis, as in production); each case adds one kernel WireGuard device
``wgN`` there, with its own uplink veth to a cloud namespace ``ehcN`` that holds the peer.
OUT (a JSON file) is rewritten after every step: {case: outcome}, ``done`` at the end.

Faults (what tests/wireguard/test_send_failure.py and test_live.py do on wireguard-go):
``blackhole`` tunnel UDP dropped on arrival at both ends (nftables); ``no_address`` the
uplink's address removed (a modem dropping its data session); ``local`` the tunnel's UDP
dropped in the edge's output hook (on wireguard-go ``sendmsg`` fails with EPERM; kernel
WireGuard still counts the bytes, see docs/testbed.md); ``peer_removed`` the peer
removed, then re-added (its counters start again from 0); ``recreated`` the device deleted
and re-created as Flannel does (counters and handshake reset); ``incident`` every
handshake packet either end sends leaves with UDP checksum 0xdead (nftables payload
mangling on output, TX offload off on the veths so the checksum is computed in software
and verified by the receiving kernel, which drops it and counts ``InCsumErrors``);
``healthy`` nothing, for the whole run (across the first rekey at ~120 s).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from datetime import datetime
from typing import Any

from edgeheal.base.compat import UTC
from edgeheal.checks.wireguard import WireguardCheck
from edgeheal.core import debounce
from edgeheal.model import CheckStatus
from tests.support import context

K = 25
PORT = 51820
CASES = ("healthy", "blackhole", "no_address", "local", "peer_removed", "recreated",
         "incident")
TABLE = "edgeheal_fault"


def sh(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=stdin, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def in_csum_errors(ns: str | None) -> int:
    text = sh(*(["ip", "netns", "exec", ns] if ns else []), "cat", "/proc/net/snmp")
    head, values = [ln.split() for ln in text.splitlines() if ln.startswith("Udp:")]
    return int(values[head.index("InCsumErrors")])


class Case:
    """One edge device ``wgN`` (port 51820 + N, uplink ``uN`` 10.30.N.1) and its cloud
    peer in namespace ``ehcN`` (``dN`` 10.30.N.2, port 51820); overlay 10.31.N.1/.2."""

    def __init__(self, n: int, name: str) -> None:
        self.n, self.name, self.ns = n, name, f"ehc{n}"
        self.dev, self.up, self.port = f"wg{n}", f"u{n}", PORT + n
        self.edge_ip, self.cloud_ip = f"10.30.{n}.1", f"10.30.{n}.2"
        self.overlay = f"10.31.{n}.2"
        self.table = f"{TABLE}{n}"
        """Its own nftables table: the edge namespace is shared by all cases."""
        self.keys = {side: sh("wg", "genkey") for side in ("edge", "cloud")}
        self.pub = {side: sh("wg", "pubkey", stdin=k) for side, k in self.keys.items()}
        self.out: dict[str, Any] = {"case": self.name, "samples": []}
        self.status: CheckStatus | None = None
        self.history: tuple[Any, ...] = ()

    def cloud(self, *argv: str, check: bool = True, stdin: str | None = None) -> str:
        return sh("ip", "netns", "exec", self.ns, *argv, check=check, stdin=stdin)

    def build(self) -> None:
        sh("ip", "netns", "add", self.ns)
        self.cloud("ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", self.up, "type", "veth", "peer", "name", f"d{self.n}",
           "netns", self.ns)
        sh("ip", "addr", "add", f"{self.edge_ip}/24", "dev", self.up)
        sh("ip", "link", "set", self.up, "up")
        self.cloud("ip", "addr", "add", f"{self.cloud_ip}/24", "dev", f"d{self.n}")
        self.cloud("ip", "link", "set", f"d{self.n}", "up")
        self.cloud("ip", "link", "add", "wg0", "type", "wireguard")
        self.cloud("wg", "set", "wg0", "private-key", "/proc/self/fd/0", "listen-port", str(PORT),
                   "peer", self.pub["edge"], "allowed-ips", f"10.31.{self.n}.1/32",
                   "endpoint", f"{self.edge_ip}:{self.port}", "persistent-keepalive", str(K),
                   stdin=self.keys["cloud"])
        self.cloud("ip", "addr", "add", f"{self.overlay}/24", "dev", "wg0")
        self.cloud("ip", "link", "set", "wg0", "up")
        self.edge_device()

    def edge_device(self) -> None:
        sh("ip", "link", "add", self.dev, "type", "wireguard")
        sh("wg", "set", self.dev, "private-key", "/proc/self/fd/0", "listen-port", str(self.port),
           stdin=self.keys["edge"])
        sh("ip", "addr", "add", f"10.31.{self.n}.1/24", "dev", self.dev)
        sh("ip", "link", "set", self.dev, "up")
        self.add_peer()

    def add_peer(self) -> None:
        sh("wg", "set", self.dev, "peer", self.pub["cloud"], "allowed-ips",
           f"{self.overlay}/32", "endpoint", f"{self.cloud_ip}:{PORT}",
           "persistent-keepalive", str(K))

    def ping(self) -> bool:
        return subprocess.run(["ping", "-c", "1", "-W", "2", self.overlay],
                              capture_output=True, check=False).returncode == 0

    def nft(self, where: str | None, chains: str) -> None:
        script = f"table inet {self.table} {{\n{chains}\n}}\n"
        sh(*(["ip", "netns", "exec", where] if where else []), "nft", "-f", "-", stdin=script)

    def fault_counter(self, where: str | None) -> int:
        text = sh(*(["ip", "netns", "exec", where] if where else []), "nft", "list", "table",
                  "inet", self.table, check=False).split()
        return sum(int(b) for a, b in itertools.pairwise(text) if a == "packets")

    def close(self) -> None:
        sh("ip", "netns", "del", self.ns, check=False)
        sh("ip", "link", "del", self.dev, check=False)
        sh("ip", "link", "del", self.up, check=False)

    # --- the check, as the agent runs it (shipped settings) -------------------------------
    def make_check(self) -> WireguardCheck:
        ctx = context(f'[wireguard]\ninterfaces = ["{self.dev}"]\n').ctx
        ctx = replace(ctx, clock=time.monotonic, wall=lambda: datetime.now(UTC))
        return WireguardCheck(ctx)

    async def step(self, check: WireguardCheck) -> dict[str, Any]:
        s = check.settings
        now = time.monotonic()
        result = await check.run()
        if self.status is None:
            self.status = debounce.initial("wireguard", required=True, now=now,
                                           wall=datetime.now(UTC))
        self.status, self.history = debounce.advance(
            self.status, result, now=now, wall=datetime.now(UTC), fail_after=s.fail_after,
            recover_after=s.recover_after, history=self.history)
        peers = result.detail.get("peers", [])
        sample = {"t": round(now - T0, 2), "raw": result.reason, "effective": self.status.reason,
                  "state": self.status.state.value, "message": result.message,
                  "cause": result.detail.get("cause"), "suspect": result.detail.get("suspect"),
                  "age": peers[0]["handshake_age_seconds"] if peers else None,
                  "rx": peers[0]["rx_bytes"] if peers else None,
                  "tx": peers[0]["tx_bytes"] if peers else None}
        self.out["samples"].append(sample)
        return sample

    async def until(self, check: WireguardCheck, predicate: Any, within: float,
                    what: str) -> dict[str, Any]:
        interval = check.settings.interval or 2.0
        deadline = time.monotonic() + within
        while True:
            sample = await self.step(check)
            if predicate(sample):
                self.out[what] = sample["t"]
                return sample
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: not {what} within {within:g} s; last "
                                     f"{sample}")
            await asyncio.sleep(interval)


T0 = time.monotonic()
SLACK = 30.0
"""Seconds of slack on every wait: TCG on a loaded 2-core host runs timers late."""


async def healthy_start(case: Case, check: WireguardCheck) -> None:
    for _ in range(10):
        if await asyncio.to_thread(case.ping):
            break
    await case.until(check, lambda s: s["state"] == "ok" and s["raw"] == "ok", 20 + SLACK,
                     "ok_at")


def ok(s: dict[str, Any]) -> bool:
    return s["state"] == "ok" and s["raw"] == "ok"


async def scenario(case: Case, stop: asyncio.Event) -> None:
    check = case.make_check()
    await healthy_start(case, check)
    out = case.out
    name, n = case.name, case.n
    if name == "healthy":
        while not stop.is_set():
            await case.step(check)
            await asyncio.sleep(check.settings.interval or 2.0)
        return
    if name in ("peer_removed", "recreated"):  # counters well above a fresh handshake's
        await asyncio.to_thread(sh, "ping", "-c", "5", "-i", "0.2", "-s", "1000", case.overlay,
                                check=False)
        await case.step(check)
    # the last reading with counters (a slow guest's read_error carries none)
    out["before"] = next((s for s in reversed(out["samples"]) if s["rx"] is not None),
                         out["samples"][-1])
    out["fault_at"] = round(time.monotonic() - T0, 2)
    if name == "blackhole":
        drop = ("  chain in { type filter hook input priority 0; policy accept;\n"
                "    udp dport %d counter drop\n  }")
        case.nft(None, drop % case.port)
        case.nft(case.ns, drop % PORT)
        await case.until(check, lambda s: s["effective"] == "stalled",
                         2.5 * K + 5 + SLACK, "detected_at")
        out["fault_counter"] = case.fault_counter(None) + case.fault_counter(case.ns)
        sh("nft", "delete", "table", "inet", case.table)
        case.cloud("nft", "delete", "table", "inet", case.table)
    elif name == "no_address":
        # (the check learns the endpoint's source address when it first sees the peer,
        # and again every LEARN_RETRY s while that failed: let it, as on a node that ran)
        settle = time.monotonic() + 15
        while time.monotonic() < settle:
            await case.step(check)
            await asyncio.sleep(check.settings.interval or 2.0)
        out["fault_at"] = round(time.monotonic() - T0, 2)
        sh("ip", "addr", "del", f"{case.edge_ip}/24", "dev", case.up)
        hit = await case.until(check, lambda s: s["effective"] == "send_failing",
                               K + 5 + SLACK, "detected_at")
        out["cause"] = hit["cause"]
        sh("ip", "addr", "add", f"{case.edge_ip}/24", "dev", case.up)
    elif name == "local":
        # Kernel WireGuard counts tx bytes for packets the output hook drops (its
        # udp_tunnel_xmit_skb returns nothing), so tx does not go flat: what the check
        # makes of it is recorded and asserted by the host test.
        case.nft(None, "  chain out { type filter hook output priority 0; policy accept;\n"
                       f"    udp sport {case.port} counter drop\n  }}")
        # a slow guest can answer one read late (read_error): the first reading with an age
        first = await case.until(check, lambda s: s["age"] is not None, 3 * 2 + SLACK,
                                 "first_age_at")
        handshake_at = first["t"] - first["age"]
        hit = await case.until(check, lambda s: s["state"] == "failed",
                               180 + K + 3 * 2 + SLACK, "detected_at")
        out["failed_age"] = round(hit["t"] - handshake_at, 1)
        out["cause"] = hit["cause"]
        out["fault_counter"] = case.fault_counter(None)
        sh("nft", "delete", "table", "inet", case.table)
    elif name == "peer_removed":
        sh("wg", "set", case.dev, "peer", case.pub["cloud"], "remove")
        await case.until(check, lambda s: s["effective"] == "no_peers", 3 * 2 + SLACK,
                         "detected_at")
        case.add_peer()
    elif name == "recreated":
        sh("ip", "link", "del", case.dev)
        case.edge_device()
    elif name == "incident":
        for ns, veth, port in ((None, case.up, case.port), (case.ns, f"d{n}", PORT)):
            sh(*(["ip", "netns", "exec", ns] if ns else []), "ethtool", "-K", veth, "tx", "off")
            case.nft(ns, "  chain out { type filter hook output priority 0; policy accept;\n"
                         f"    udp sport {port} @th,64,8 {{ 1, 2 }} udp checksum set 0xdead "
                         "counter\n  }")
        out["csum_before"] = {"edge": in_csum_errors(None), "cloud": in_csum_errors(case.ns)}
        # a slow guest can answer one read late (read_error): the first reading with an age
        first = await case.until(check, lambda s: s["age"] is not None, 3 * 2 + SLACK,
                                 "first_age_at")
        handshake_at = first["t"] - first["age"]
        out["handshake_at"] = round(handshake_at, 2)
        warned = await case.until(check, lambda s: s["effective"] == "rekey_failing",
                                  180 + SLACK, "detected_at")
        out["warned_age"] = round(warned["t"] - handshake_at, 1)
        out["ping_when_warned"] = await asyncio.to_thread(case.ping)
        out["csum_when_warned"] = {"edge": in_csum_errors(None),
                                   "cloud": in_csum_errors(case.ns)}
        died = await case.until(check, lambda s: s["state"] == "failed",
                                180 + K + 3 * 2 + SLACK - (warned["t"] - handshake_at),
                                "failed_at")
        out["failed_age"] = round(died["t"] - handshake_at, 1)
        out["failed_reason"] = died["effective"]
        deadline = time.monotonic() + 2 * K + SLACK
        while time.monotonic() < deadline:  # once expired, both ends initiate (within K)
            after = {"edge": in_csum_errors(None), "cloud": in_csum_errors(case.ns)}
            if all(after[k] > out["csum_before"][k] for k in after):
                break
            await case.step(check)
            await asyncio.sleep(2.0)
        out["csum_after"] = after
        out["fault_counter"] = case.fault_counter(None) + case.fault_counter(case.ns)
        sh("nft", "delete", "table", "inet", case.table)
        case.cloud("nft", "delete", "table", "inet", case.table)
    out["lifted_at"] = round(time.monotonic() - T0, 2)
    await asyncio.to_thread(case.ping)
    await case.until(check, ok, K + 3 * 2 + SLACK, "recovered_at")


async def main(path: str, names: list[str]) -> None:
    cases = [Case(i, name) for i, name in enumerate(names, start=1)]
    results: dict[str, Any] = {c.name: c.out for c in cases}

    def write(done: bool = False) -> None:
        with open(path + ".tmp", "w") as f:
            json.dump({"done": done, "cases": results}, f)
        os.replace(path + ".tmp", path)

    stop = asyncio.Event()

    async def one(case: Case) -> None:
        try:
            await scenario(case, stop)
        except Exception:  # reported to the host test, which fails on it
            case.out["error"] = traceback.format_exc(limit=4)

    async def writer() -> None:
        while True:
            write()
            await asyncio.sleep(1.0)

    try:
        for case in cases:
            case.build()
        out = asyncio.create_task(writer())
        faulty = [asyncio.create_task(one(c)) for c in cases if c.name != "healthy"]
        steady = [asyncio.create_task(one(c)) for c in cases if c.name == "healthy"]
        await asyncio.gather(*faulty)
        stop.set()
        await asyncio.gather(*steady)
        out.cancel()
    finally:
        for case in cases:
            case.close()
        write(done=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:] or list(CASES)))
