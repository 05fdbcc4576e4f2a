"""What one ``pmtu`` probe costs on the wire, and so its bytes a day at the shipped interval.

Builds the tests' three namespaces (edge, carrier, cloud; the edge's device at 1420 bytes,
a TCP listener in the cloud), runs the check once healthy and once against a carrier that
drops packets over 1300 bytes, and counts the bytes on the edge's device (both
directions, from its kernel counters). Through WireGuard every packet carries 60 bytes
more (outer IPv4 20 + UDP 8 + WireGuard 32): the packet count gives that too.

    sudo /opt/edgeheal/bin/python bench/pmtu_cost.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeheal.lab.netns import Sandbox, run
from tests.pmtu.test_netns import fault, in_ns, make_check, world

WG_OVERHEAD = 60
DAY = 86400


def counters(ns: str, dev: str) -> tuple[int, int]:
    stats = json.loads(run(["ip", "-s", "-j", "link", "show", dev], ns=ns).stdout)[0]
    s = stats["stats64"]
    return (s["rx"]["bytes"] + s["tx"]["bytes"], s["rx"]["packets"] + s["tx"]["packets"])


def main() -> None:
    with Sandbox() as sandbox:
        gen = world.__wrapped__(sandbox)  # type: ignore[attr-defined]
        w = next(gen)
        check = make_check(w["tun"], clamp=False)
        out = {}
        for label, broken in (("healthy", False), ("black_hole", True)):
            if broken:
                fault(sandbox, w["carrier"], True)
            before = counters(w["edge"], w["tun"])
            result = in_ns(w["edge"], check.run)
            after = counters(w["edge"], w["tun"])
            inner, packets = after[0] - before[0], after[1] - before[1]
            out[label] = {"reason": result.reason, "probes": len(result.detail["probes"]),
                          "inner_bytes": inner, "packets": packets,
                          "tunnel_bytes": inner + WG_OVERHEAD * packets}
        healthy = out["healthy"]["tunnel_bytes"]
        out["per_day_at_1h"] = healthy * DAY // 3600
        print(json.dumps(out, indent=2))
        gen.close()


if __name__ == "__main__":
    main()
