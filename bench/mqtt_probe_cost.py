"""CPU and wall time per probe: our asyncio-driven paho vs paho's blocking connect in a thread.

    python bench/mqtt_probe_cost.py [--probes N]

Why: the probe drives paho from the event loop (asyncio connects and handshakes, paho is fed
by loop.add_reader/add_writer) instead of running paho's blocking ``connect()`` plus
``loop()`` in an executor thread per probe. This measures both against a local Mosquitto:
sequential probes (wall and process CPU per probe) and the threads alive during them.
Results: docs/mqtt.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _paho_blocking_probe(host: str, port: int, user: str, password: str) -> float:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    done = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-thread")
    client.username_pw_set(user, password)
    client.on_connect = lambda *a: done.set()
    began = time.monotonic()
    client.connect(host, port, keepalive=60)
    while not done.is_set() and time.monotonic() - began < 5:
        client.loop(timeout=0.05)
    rtt = time.monotonic() - began
    client.disconnect()
    client.loop(timeout=0.05)
    return rtt


async def _run(probes: int) -> dict[str, Any]:
    from edgeheal.boundaries.mqtt import probe
    from edgeheal.config import MqttTarget
    from edgeheal.lab.mosquitto import Mosquitto
    from edgeheal.lab.netns import Sandbox

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Sandbox() as sb:
        broker = Mosquitto(sb, Path(tmp), users={"edge": "bench-pw"})
        broker.start()
        target = MqttTarget(name="b", host=broker.host, port=broker.port, username="edge",
                            password_file=broker.password_file_for("edge"))
        loop = asyncio.get_running_loop()
        for name in ("asyncio", "thread"):
            threads = 0
            cpu0, wall0 = time.process_time(), time.monotonic()
            for _ in range(probes):
                if name == "asyncio":
                    result = await probe(target, "bench")
                    assert result.ok, result.message
                else:
                    await loop.run_in_executor(None, _paho_blocking_probe, broker.host,
                                               broker.port, "edge", "bench-pw")
                threads = max(threads, threading.active_count())
            out[name] = {"wall_ms_per_probe": round((time.monotonic() - wall0) / probes * 1e3, 3),
                         "cpu_ms_per_probe": round((time.process_time() - cpu0) / probes * 1e3, 3),
                         "max_threads": threads}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args.probes)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
