"""The guest side of test_power_cut.py: run inside the QEMU guest by the guest's Python.

``boot CYCLE``: after a power cut, before anything else: mount the state disk (ext4 on the
second virtio disk, label ``ehpower``; the kernel replays its journal), read what survived
(the remediation history's pause, the canary written unsynced just before the cut, the
state directory's names), then start a Mosquitto on loopback, a subscriber that appends
every alert it receives to ``/run/ehp/received`` (one JSON line each), and the agent
(``edgeheal run``, its state on the disk); wait for ``/readyz`` 200 and print one JSON
object: what survived, how long the agent took to be ready, the state directory's names then.

``load CYCLE``: the writes the cut interrupts, over the agent's control socket, with the
broker stopped (so every alert stays in the outbox): ``alert.test`` (2 alerts a call) and
``remediation.pause`` for N hours (N = 1, 2, ...: each a history save) in turn, then up to
0.5 s of quiet (a cut there finds a save with no later fsync to carry it), until killed.
Each answer, once the agent gave it, is written as a line to ``/dev/ttyS0``
(``EHP q CYCLE ID`` for an alert the agent reported stored, ``EHP p CYCLE N`` for a pause
it reported persisted): QEMU copies the serial port to a host file as the guest writes it,
so what the host finds there after the cut was reported before it.

``subscribe``: the subscriber (paho, QoS 1, clean session).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DISK = "/var/lib/edgeheal-power"
STATE = f"{DISK}/state"
RUN = Path("/run/ehp")
PORT = 9917
NODE = "power-guest"
TOPIC = f"edgeheal/{NODE}/alerts"
HISTORY = Path(STATE) / "remediation-history.json"

CONFIG = f"""[agent]
state_dir = "{STATE}"
node_name = "{NODE}"
[http]
listen = ["127.0.0.1:{PORT}"]
[offload]
enabled = false
[wireguard]
enabled = false
[[mqtt.targets]]
name = "local"
host = "127.0.0.1"
path = "direct"
[alerts]
target = "local"
"""
MOSQUITTO = "listener 1883 127.0.0.1\nallow_anonymous true\npersistence false\n"


def sh(cmd: str) -> None:
    subprocess.run(["sh", "-c", cmd], check=True)


def survived(cycle: int) -> dict[str, object]:
    """What the disk holds after the cut, read before the agent touches it."""
    out: dict[str, object] = {"names": sorted(os.listdir(STATE)) if os.path.isdir(STATE)
                              else []}
    try:
        doc = json.loads(HISTORY.read_text())
        paused = doc.get("paused_until_boottime")
        out["paused_hours"] = int(paused // 3600) if isinstance(paused, (int, float)) else None
    except FileNotFoundError:
        out["paused_hours"] = None
    except ValueError as err:
        out["history_error"] = str(err)
    canary = Path(DISK) / f"canary-{cycle - 1}"
    out["canary"] = canary.read_text() if canary.exists() else None
    return out


def boot(cycle: int) -> None:
    began = time.monotonic()
    RUN.mkdir(parents=True, exist_ok=True)
    os.makedirs(DISK, exist_ok=True)
    sh(f"mount -L ehpower {DISK}")
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    found = survived(cycle)
    (RUN / "agent.toml").write_text(CONFIG)
    (RUN / "mq.conf").write_text(MOSQUITTO)
    sh(f"setsid mosquitto -c {RUN}/mq.conf >{RUN}/mq.log 2>&1 </dev/null & "
       f"echo $! >{RUN}/mq.pid")
    sh(f"setsid python3 {__file__} subscribe >{RUN}/sub.log 2>&1 </dev/null &")
    for _ in range(600):
        if (RUN / "subscribed").exists():
            break
        time.sleep(0.1)
    else:
        raise SystemExit(f"the subscriber did not subscribe: {(RUN / 'sub.log').read_text()}")
    started = time.monotonic()
    sh(f"cd /tmp && setsid python3 -m edgeheal --config {RUN}/agent.toml run "
       f">{RUN}/agent.log 2>&1 </dev/null & echo $! >{RUN}/agent.pid")
    ready = None
    while time.monotonic() - started < 120:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=2) as r:
                if r.status == 200:
                    ready = time.monotonic() - started
                    break
        except OSError:
            pass
        time.sleep(0.1)
    print(json.dumps({"survived": found, "ready_seconds": ready,
                      "setup_seconds": started - began,
                      "names_when_ready": sorted(os.listdir(STATE))}))


def subscribe() -> None:
    import paho.mqtt.client as mqtt

    out = (RUN / "received").open("a", encoding="utf-8")

    def on_connect(client: mqtt.Client, *_: object) -> None:
        client.subscribe(TOPIC, qos=1)

    def on_subscribe(*_: object) -> None:
        (RUN / "subscribed").touch()

    def on_message(_c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        doc = json.loads(msg.payload)
        out.write(json.dumps({"id": doc.get("id"), "kind": doc.get("kind"),
                              "detail": doc.get("detail")}) + "\n")
        out.flush()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ehp-sub")
    client.on_connect, client.on_subscribe, client.on_message = (on_connect, on_subscribe,
                                                                 on_message)
    client.connect("127.0.0.1", 1883)
    client.loop_forever(retry_first_connection=True)


def load(cycle: int) -> None:
    from edgeheal.boundaries import control_socket as control

    tty = os.open("/dev/ttyS0", os.O_WRONLY | os.O_NOCTTY)
    rng = random.Random(cycle)  # noqa: S311 (timing, not secrets)
    began = time.monotonic()
    hours = 0
    while time.monotonic() - began < 600:  # bounded; the host cuts it long before
        for alert_id in control.call(STATE, "alert.test", {"count": 2, "wait": 0})["ids"]:
            os.write(tty, f"EHP q {cycle} {alert_id}\n".encode())
        hours += 1
        control.call(STATE, "remediation.pause", {"for": f"{hours}h"})
        os.write(tty, f"EHP p {cycle} {hours}\n".encode())
        # a quiet moment: a cut here finds the pause's rename with no later fsync to carry it
        time.sleep(rng.uniform(0.0, 0.5))


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "boot":
        boot(int(sys.argv[2]))
    elif what == "load":
        load(int(sys.argv[2]))
    elif what == "subscribe":
        subscribe()
    else:
        raise SystemExit(f"unknown command {what!r}")
