"""The MSS clamp: one nftables table edgeheal owns, written and deleted through libnftables.

Why a table of its own: nothing else on the node (kube-proxy, Flannel, firewalld) ever
touches it, and removing the clamp is deleting the table, whatever state it is in. Why
libnftables: it is the nftables project's own library (Debian's ``libnftables1``, which the
``nft`` program is built on; python3-nftables is a thin ctypes wrapper of the same calls,
not importable from the agent's virtual environment), it takes the documented JSON
schema (``libnftables-json(5)``), and it needs no subprocess. Without the library the ``nft``
program is run (``nft -j -f -``) — only when acting, never in the steady state. Both need
CAP_NET_ADMIN; the library is loaded the first time the agent acts.

The rules: the probe's own connection (its packets carry :attr:`Clamp.mark`) is marked in
conntrack and left alone; every other TCP SYN and SYN-ACK leaving through or arriving from
the interface gets its MSS option lowered to the clamp (postrouting sees the device after
kube-proxy's DNAT rerouted the packet; prerouting rewrites the peer's SYN-ACK, which caps
what this node sends). IPv4 and IPv6 each get their own MSS (the packet size minus 40 or
60 bytes).
"""

from __future__ import annotations

import ctypes
import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TABLE = "edgeheal_mss"
FAMILY = "inet"
_LIB: dict[str, Any] = {}
"""The loaded library (``lib``; False when it is not installed), once."""
NFT_CTX_OUTPUT_JSON = 1 << 4


class NftablesError(Exception):
    """nftables refused a command (privilege, a kernel without the feature, no library)."""


@dataclass(frozen=True, slots=True)
class Clamp:
    interface: str
    size: int
    """The largest IP packet size that passed; the MSS is this minus the headers."""
    mark: int

    @property
    def mss4(self) -> int:
        return self.size - 40

    @property
    def mss6(self) -> int:
        return self.size - 60


def _match(left: Any, right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _clamp_rules(device: str, dev: str, mss: int, proto: str) -> list[Any]:
    maxseg = {"tcp option": {"name": "maxseg", "field": "size"}}
    return [_match({"meta": {"key": device}}, dev),
            _match({"meta": {"key": "nfproto"}}, proto),
            _match({"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, "syn"]}, "syn"),
            _match(maxseg, mss, ">"),
            {"mangle": {"key": maxseg, "value": mss}}]


def commands(clamp: Clamp) -> dict[str, Any]:
    """The JSON batch that (re)creates the table with ``clamp``'s rules."""
    table = {"family": FAMILY, "name": TABLE}
    out: list[dict[str, Any]] = [{"add": {"table": table}}, {"delete": {"table": table}},
                                 {"add": {"table": table}}]
    chains = (("postrouting", "oifname"), ("prerouting", "iifname"))
    for chain, _device in chains:
        out.append({"add": {"chain": {"family": FAMILY, "table": TABLE, "name": chain,
                                      "type": "filter", "hook": chain, "prio": -150,
                                      "policy": "accept"}}})
    dev = _match({"meta": {"key": "oifname"}}, clamp.interface)
    ct_mark = {"ct": {"key": "mark"}}
    rules: list[tuple[str, list[Any]]] = [
        ("postrouting", [dev, _match({"meta": {"key": "mark"}}, clamp.mark),
                         {"mangle": {"key": ct_mark, "value": clamp.mark}}, {"return": None}]),
        ("postrouting", [dev, _match(ct_mark, clamp.mark), {"return": None}]),
        ("prerouting", [_match({"meta": {"key": "iifname"}}, clamp.interface),
                        _match(ct_mark, clamp.mark), {"return": None}]),
    ]
    for chain, device in chains:
        rules.append((chain, _clamp_rules(device, clamp.interface, clamp.mss4, "ipv4")))
        rules.append((chain, _clamp_rules(device, clamp.interface, clamp.mss6, "ipv6")))
    for chain, expr in rules:
        out.append({"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain,
                                     "expr": expr}}})
    return {"nftables": [{"metainfo": {"json_schema_version": 1}}, *out]}


def _library() -> Any:
    if "lib" not in _LIB:
        try:
            lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        except OSError:
            _LIB["lib"] = False
            return False
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _LIB["lib"] = lib
    return _LIB["lib"]


def run(command: dict[str, Any] | str) -> str:
    """Run one JSON batch (or a native command line) in this thread's network namespace;
    returns what nftables printed. Raises :class:`NftablesError` with nftables' words."""
    text = command if isinstance(command, str) else json.dumps(command)
    lib = _library()
    if lib:
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise NftablesError("libnftables could not make a context")
        try:
            lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON)
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            rc = lib.nft_run_cmd_from_buffer(ctx, text.encode())
            output = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
            error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        finally:
            lib.nft_ctx_free(ctx)
        if rc != 0:
            raise NftablesError(error.strip() or f"nftables failed (status {rc})")
        return output
    nft = shutil.which("nft")
    if nft is None:
        raise NftablesError("neither libnftables.so.1 nor the nft program is installed")
    proc = subprocess.run([nft, "-j", "-f", "-"], input=text, capture_output=True,
                          text=True, timeout=10, check=False)
    if proc.returncode != 0:
        raise NftablesError(proc.stderr.strip() or f"nft exited {proc.returncode}")
    return proc.stdout


def apply(clamp: Clamp) -> None:
    """Install (or replace) the clamp, in one transaction."""
    run(commands(clamp))
    log.info("MSS clamp on %s: %d bytes (MSS %d)", clamp.interface, clamp.size, clamp.mss4,
             extra={"interface": clamp.interface, "size": clamp.size})


def remove() -> bool:
    """Delete the table; True when there was one."""
    there = installed() is not None
    table = {"family": FAMILY, "name": TABLE}
    run({"nftables": [{"add": {"table": table}}, {"delete": {"table": table}}]})
    if there:
        log.info("MSS clamp removed", extra={"table": TABLE})
    return there


def installed() -> dict[str, Any] | None:
    """The table as nftables lists it (JSON), or None when there is none."""
    try:
        out = run({"nftables": [{"list": {"table": {"family": FAMILY, "name": TABLE}}}]})
    except NftablesError:
        return None
    return json.loads(out) if out.strip() else None


__all__ = ["FAMILY", "TABLE", "Clamp", "NftablesError", "apply", "commands", "installed",
           "remove", "run"]
