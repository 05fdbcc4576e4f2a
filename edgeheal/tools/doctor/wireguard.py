"""WireGuard: is a WireGuard implementation there, do the configured tunnel devices exist,
does every watched peer keep the session alive, and do the tunnel-path brokers really
route through the tunnel?

The devices are read once (:func:`observe`, the same readers the agent uses: the UAPI
socket or generic netlink, never ``wg``) and shared with the MTU checks. The watched peers
are chosen exactly as the ``wireguard`` check chooses them (``watch_peers``; ``auto``:
cryptokey routing of the tunnel-path MQTT targets, a Service ClusterIP followed through
kube-proxy's DNAT in conntrack: :class:`edgeheal.checks.wireguard.Targets`), and the route
check follows the same translation: a ClusterIP passes when the pod address kube-proxy
sends it to leaves through a tunnel device.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.wg.readings import WireGuardError, fingerprint
from edgeheal.checks.wireguard import Targets, listed_peers, route_peers
from edgeheal.tools.doctor.finding import Finding, fail, ok, skip, warn

if TYPE_CHECKING:
    from edgeheal.boundaries.wg.readings import DeviceStats, PeerStats
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import NodeLink, System

K3S_KEEPALIVE = 25
"""Seconds: what K3s's ``wireguard-native`` backend sets (PersistentKeepaliveInterval)."""
USERSPACE = ("wireguard-go", "boringtun-cli", "boringtun")
MODULE_FILES = ("wireguard.ko", "wireguard.ko.xz", "wireguard.ko.zst", "wireguard.ko.gz")


@dataclass
class Tunnel:
    """The configured tunnel devices as found now."""

    links: dict[str, NodeLink] = field(default_factory=dict)
    """Every link of this network namespace (for MTUs and uplinks)."""
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    devices: dict[str, DeviceStats] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Interface -> why it could not be read."""
    targets: dict[str, list[str]] = field(default_factory=dict)
    """Tunnel-path MQTT target name -> its addresses (resolved once)."""
    unresolved: dict[str, str] = field(default_factory=dict)
    watched: dict[str, set[str]] = field(default_factory=dict)
    """Interface -> public keys of its watched peers."""
    translated: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tunnel target host -> how the check places it (``detail.targets`` of the check)."""

    def watched_peers(self) -> list[tuple[str, PeerStats]]:
        return [(name, p) for name, dev in self.devices.items() for p in dev.peers
                if p.public_key in self.watched.get(name, set())]


async def observe(config: Config, system: System) -> Tunnel:
    tunnel = Tunnel()
    tunnel.links = await system.links()
    settings = config.wireguard
    for target in config.mqtt.targets:
        if target.path == "tunnel":
            try:
                tunnel.targets[target.name] = await system.resolve(target.host)
            except OSError as err:
                tunnel.unresolved[target.name] = f"{target.host} does not resolve: {err}"
    if not settings.enabled:
        return tunnel
    targets = Targets(config, time.monotonic, resolve=system.resolve,
                      conntrack=system.conntrack)
    for name in settings.interfaces:
        if name not in tunnel.links:
            tunnel.missing.append(name)
            continue
        tunnel.present.append(name)
        try:
            device = await system.device(name)
        except WireGuardError as err:
            tunnel.errors[name] = str(err)
            continue
        tunnel.devices[name] = device
        spec = settings.watch_peers
        if isinstance(spec, tuple):
            tunnel.watched[name] = listed_peers(device, spec)
        else:
            addrs = [ipaddress.ip_address(a.split("%")[0])
                     for found in tunnel.targets.values() for a in found]
            tunnel.watched[name] = (route_peers(device, addrs) if addrs
                                    else {p.public_key for p in device.peers})
    if tunnel.devices and any(t.path == "tunnel" for t in config.mqtt.targets):
        choice = await targets.choose(list(tunnel.devices.values()))
        if choice is not None:
            tunnel.translated = choice.targets
            if not isinstance(settings.watch_peers, tuple):
                for name, keys in choice.watched.items():
                    tunnel.watched[name] = keys or (
                        {p.public_key for p in tunnel.devices[name].peers}
                        if choice.unresolved else set())
    return tunnel


def available(system: System) -> Finding:
    """The kernel module (loaded, built in, or installed for this kernel) or a userspace
    implementation on PATH."""
    name = "wireguard.available"
    if (system.sys_root / "module" / "wireguard").is_dir():
        return ok(name, "the kernel's wireguard module is loaded", kind="kernel")
    kernel_dir = system.modules_root / system.release
    builtin = kernel_dir / "modules.builtin"
    try:
        if "wireguard.ko" in builtin.read_text(errors="replace"):
            return ok(name, f"wireguard is built into kernel {system.release}", kind="kernel")
    except OSError:
        pass
    wg_dir = kernel_dir / "kernel" / "drivers" / "net" / "wireguard"
    if any((wg_dir / f).is_file() for f in MODULE_FILES):
        return ok(name, f"the wireguard module is installed for kernel {system.release} "
                  "(loaded on first use)", kind="kernel")
    try:
        dep = (kernel_dir / "modules.dep").read_text(errors="replace")
    except OSError:
        dep = ""
    if any(line.split(":", 1)[0].rsplit("/", 1)[-1] in MODULE_FILES
           for line in dep.splitlines()):
        return ok(name, f"a wireguard module is installed for kernel {system.release}",
                  kind="kernel")
    for program in USERSPACE:
        path = system.which(program)
        if path:
            return ok(name, f"no kernel module, userspace {program} at {path} (the "
                      "agent then needs User=root to read its socket: docs/operations.md)",
                      kind="userspace", program=path)
    return fail(name, f"no wireguard kernel module for kernel {system.release} and no "
                "wireguard-go on PATH: Flannel's wireguard-native backend cannot create "
                "its tunnel",
                "install the kernel's modules (Linux >= 5.6 has WireGuard; on Debian the "
                "linux-image package, on minimal images the extra-modules package) and "
                "`modprobe wireguard`, or install wireguard-go", kind="none")


def interfaces(config: Config, tunnel: Tunnel) -> Finding:
    name = "wireguard.interfaces"
    settings = config.wireguard
    if not settings.enabled or not settings.interfaces:
        return skip(name, "the wireguard check is disabled")
    absent = (f"; absent (skipped, as the agent does): {', '.join(tunnel.missing)}"
              if tunnel.missing else "")
    if not tunnel.present:
        return fail(name, f"none of the configured interfaces exists "
                    f"({', '.join(settings.interfaces)})",
                    "start K3s with the WireGuard backend (--flannel-backend=wireguard-native) "
                    "and check `journalctl -u k3s-agent` for Flannel's errors, or set "
                    "[wireguard] interfaces to the tunnel devices this node has",
                    present=[], missing=tunnel.missing)
    if tunnel.errors:
        problems = "; ".join(f"{k}: {v}" for k, v in tunnel.errors.items())
        return fail(name, f"cannot read {problems}",
                    "run edgeheal doctor as root (reading WireGuard needs CAP_NET_ADMIN; a "
                    "userspace implementation's socket is root-only)",
                    present=tunnel.present, missing=tunnel.missing)
    peers = sum(len(d.peers) for d in tunnel.devices.values())
    return ok(name, f"{', '.join(tunnel.present)} present with {peers} peer(s){absent}",
              present=tunnel.present, missing=tunnel.missing)


def keepalive(config: Config, tunnel: Tunnel) -> Finding:
    """Every watched peer has persistent keepalive: without it an idle tunnel's NAT
    mapping on the carrier expires and only the cloud's next packet finds out."""
    name = "wireguard.keepalive"
    if not tunnel.devices:
        return skip(name, "no tunnel device could be read")
    watched = tunnel.watched_peers()
    if not watched:
        return warn(name, "no watched peer on " + ", ".join(tunnel.devices),
                    "check [wireguard] watch_peers and the tunnel-path MQTT targets: the "
                    "peers that route them are the ones watched")
    off = [(i, p) for i, p in watched if p.persistent_keepalive <= 0]
    rows = [{"interface": i, "peer": fingerprint(p.public_key),
             "persistent_keepalive": p.persistent_keepalive} for i, p in watched]
    if off:
        names = ", ".join(f"{fingerprint(p.public_key)} on {i}" for i, p in off)
        return warn(name, f"persistent keepalive is off for watched peer(s) {names}",
                    f"set the keepalive: K3s's wireguard-native backend sets "
                    f"{K3S_KEEPALIVE} s; with --flannel-conf set Backend "
                    f"PersistentKeepaliveInterval to {K3S_KEEPALIVE} (the incident's fix "
                    "used 20 s); by hand: `wg set <if> peer <key> persistent-keepalive 25`",
                    peers=rows)
    values = sorted({p.persistent_keepalive for _, p in watched})
    return ok(name, f"{len(watched)} watched peer(s), persistent keepalive "
              f"{'/'.join(map(str, values))} s", peers=rows)


async def routes(config: Config, tunnel: Tunnel, system: System) -> list[Finding]:
    """Each tunnel-path MQTT target's addresses leave through a tunnel interface, by the
    kernel's own route lookup."""
    name = "wireguard.route"
    targets = [t for t in config.mqtt.targets if t.path == "tunnel"]
    if not targets:
        return [skip(name, "no tunnel-path MQTT target configured")]
    tunnels = set(config.wireguard.interfaces)
    found: list[Finding] = []
    for target in targets:
        if target.name in tunnel.unresolved:
            found.append(fail(name, f"{target.name}: {tunnel.unresolved[target.name]}",
                              "fix the name or give the broker's cluster address",
                              target=target.name))
            continue
        bad: list[str] = []
        good: list[str] = []
        unknown: list[str] = []
        placed = tunnel.translated.get(target.host, {})
        via = [str(v) for v in placed.get("via", [])]
        for address in tunnel.targets.get(target.name, []):
            where = await system.route(address)
            if where.ifname in tunnels:
                good.append(f"{address} via {where.ifname}")
                continue
            if via:  # a ClusterIP: where kube-proxy's DNAT sends it decides
                for pod in via:
                    hop = await system.route(pod)
                    (good if hop.ifname in tunnels else bad).append(
                        f"{address} -> {pod} (kube-proxy's DNAT, conntrack) via "
                        f"{hop.ifname or 'no route'}")
                continue
            if "unresolved" in placed.get("how", []):
                unknown.append(f"{address} via {where.ifname or 'no route'}")
            else:
                bad.append(f"{address} via {where.ifname}" if where.ifname
                           else f"{address}: no route ({where.error})")
        if unknown and not bad:
            found.append(warn(
                name, f"{target.name}: {'; '.join(unknown)}: no peer's allowed IPs hold it "
                "and conntrack shows no translation yet (a Service ClusterIP is translated "
                "only once something connects to it)",
                "run `edgeheal doctor` again once the agent's probe or a collector has "
                "connected (the agent follows the translation by itself), or check that "
                "kube-proxy serves this ClusterIP: `kubectl get endpointslices -A`",
                target=target.name, routes=unknown + good))
        elif bad:
            found.append(fail(
                name, f"{target.name}: {'; '.join(bad)}, not through "
                f"{'/'.join(config.wireguard.interfaces)}: its probe tests the direct path",
                "give the broker's Service ClusterIP (followed through kube-proxy's DNAT), "
                "its cluster DNS name if this node resolves it, a pod address, or an "
                "address a peer's allowed IPs hold; or set path = \"direct\" for this "
                "target", target=target.name, routes=bad + good))
        else:
            found.append(ok(name, f"{target.name}: {'; '.join(good)}", target=target.name))
    return found
