"""Record one real UDP payload of each WireGuard message type from a wireguard-go tunnel.

Run once, as root, to (re)make ``fixtures/wireguard_messages.json``::

    python -m tests.diagnose.record_fixtures

How: a two-node :class:`~edgeheal.lab.wireguard.WgMesh` (wireguard-go in two namespaces
joined by a veth) with persistent keepalive 1 s; scapy listens on node 0's veth. Node 0's
peer entry for node 1 is removed and re-added (so no session exists); then a ping from
node 0 to node 1's overlay address makes a handshake (initiation out, response in) and
transport data, and the idle tunnel sends keepalives. For a cookie reply, node 1 must
be "under load" (wireguard-go: at least 128 handshake messages queued), so node 0 replays
its captured initiation a few thousand times from a plain UDP socket as fast as it can;
node 1 then answers with cookie replies to that socket. Only public packets are stored:
the payloads are encrypted or authenticated with keys that existed only during the
recording and were never written anywhere.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from scapy.arch.linux import L2ListenSocket
from scapy.layers.inet import IP, UDP

from edgeheal.lab.nsutil import inside
from edgeheal.lab.wireguard import PORT, WgMesh
from edgeheal.tools.diagnose import MessageType, classify

OUT = Path(__file__).parent / "fixtures" / "wireguard_messages.json"
FLOOD = 20000


def main() -> None:
    found: dict[str, dict[str, Any]] = {}
    with WgMesh(nodes=2, keepalive=1) as mesh:
        a, b = mesh.nodes
        uplink = a.uplinks[1]
        with inside(a.ns):
            sock = L2ListenSocket(iface=uplink, promisc=False)
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                try:
                    pkt = sock.recv()
                except OSError:  # ENETDOWN once while the veth settles
                    continue
                if pkt is None or not pkt.haslayer(UDP):
                    continue
                udp = pkt[UDP]
                payload = bytes(udp.payload)
                kind = classify(payload)
                if kind is MessageType.OTHER or kind.value in found:
                    continue
                found[kind.value] = {
                    "hex": payload.hex(), "length": len(payload),
                    "src": f"{pkt[IP].src}:{udp.sport}", "dst": f"{pkt[IP].dst}:{udp.dport}",
                    "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        mesh.remove_peer(a, b)  # a fresh peer: the next packet starts a new handshake
        mesh.add_peer(a, b)
        mesh.wait_handshake(a, b)
        deadline = time.monotonic() + 10
        wanted = {"initiation", "response", "transport", "keepalive"}
        while not wanted <= set(found) and time.monotonic() < deadline:
            time.sleep(0.2)
        initiation = bytes.fromhex(found["initiation"]["hex"])
        with inside(a.ns):
            flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        target = (mesh.endpoint(a, b).rsplit(":", 1)[0], PORT)
        deadline = time.monotonic() + 20
        while "cookie_reply" not in found and time.monotonic() < deadline:
            for _ in range(FLOOD):
                try:
                    flood.sendto(initiation, target)
                except OSError:
                    break
            time.sleep(0.2)
        flood.close()
        stop.set()
        sock.close()
    doc = {"how": __doc__, "messages": found}
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {OUT}: {sorted(found)}")


if __name__ == "__main__":
    main()
