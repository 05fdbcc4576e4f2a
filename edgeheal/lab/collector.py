"""The stand-in data collector: publishes one reading a second through the tunnel.

Like the field's collector pods, it publishes sensor readings (QoS 1) to the cloud broker's
cluster address, which only the Flannel tunnel routes, with a small buffer (paho queues up
to 30 readings while it reconnects, as a real collector would). A reading counts as
*delivered* when the broker acknowledged it (PUBACK) within ``--deadline`` seconds, and as
*lost* otherwise (the buffer was full, or the tunnel stayed down past the deadline). The counters go
to a JSON file every second for the lab's timeline and summary.

    python -m edgeheal.lab.collector --host IP --port 1883 --client-id ID --stats FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915 - one linear script
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--stats", required=True)
    parser.add_argument("--deadline", type=float, default=30.0)
    parser.add_argument("--payload", type=int, default=0,
                        help="pad each reading to this many bytes (a large publish fills "
                        "whole TCP segments: the pmtu-blackhole scenario)")
    args = parser.parse_args(argv)

    lock = threading.Lock()
    pending: dict[int, float] = {}
    counts = {"sent": 0, "delivered": 0, "lost": 0, "connected": False, "connects": 0}
    lost_at: list[float] = []

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=args.client_id,
                         clean_session=True)
    client.max_queued_messages_set(30)

    def on_connect(*a: Any) -> None:
        with lock:
            counts["connected"] = True
            counts["connects"] = int(counts["connects"]) + 1

    def on_disconnect(*a: Any) -> None:
        with lock:
            counts["connected"] = False

    def on_publish(_c: Any, _u: Any, mid: int, *_: Any) -> None:
        with lock:
            if pending.pop(mid, None) is not None:
                counts["delivered"] = int(counts["delivered"]) + 1

    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    client.on_publish = on_publish
    client.reconnect_delay_set(1, 2)
    client.connect_async(args.host, args.port, keepalive=10)
    client.loop_start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stats = Path(args.stats)
    seq = 0
    while not stop.wait(1.0):
        now = time.time()
        seq += 1
        with lock:
            counts["sent"] = int(counts["sent"]) + 1
        reading: dict[str, Any] = {"seq": seq, "t": now}
        if args.payload:
            reading["pad"] = "x" * max(0, args.payload - 40)
        info = client.publish(f"collector/{args.client_id}", json.dumps(reading), qos=1)
        with lock:
            if info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):  # sent or queued
                pending[info.mid] = now
            else:  # the buffer is full: this reading is lost
                counts["lost"] = int(counts["lost"]) + 1
                lost_at.append(now)
        with lock:
            for mid, sent in list(pending.items()):
                if now - sent > args.deadline:
                    del pending[mid]
                    counts["lost"] = int(counts["lost"]) + 1
                    lost_at.append(sent)
            doc = {**counts, "pending": len(pending), "lost_at": lost_at[-500:], "t": now}
        tmp = stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, stats)
    client.loop_stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
