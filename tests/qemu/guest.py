"""The test bed's command agent, PID 1's last step inside the QEMU guest (see bed.py).

Reads JSON lines from the virtio-serial port ``edgeheal.cmd`` -- {"id", "argv", "timeout",
"stdin"} -- runs each command and answers {"id", "rc", "out", "err"} (output base64).
One command at a time; a command that outlives its timeout is killed (rc -9)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path


def port() -> Path:
    for _ in range(300):
        for entry in Path("/sys/class/virtio-ports").glob("*"):
            if (entry / "name").read_text().strip() == "edgeheal.cmd":
                return Path("/dev") / entry.name
        time.sleep(0.1)
    raise SystemExit("guest agent: no virtio-serial port edgeheal.cmd")


def send(fd: int, data: bytes) -> None:
    """All of ``data``: a write to a virtio-serial port may take only part of it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve() -> None:
    fd = os.open(port(), os.O_RDWR)
    reader = os.fdopen(os.dup(fd), "rb", buffering=0)
    send(fd, b'{"ready": true}\n')
    buf = b""
    while True:
        chunk = reader.read(65536)
        if not chunk:
            time.sleep(0.05)  # host not connected yet
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            try:
                proc = subprocess.run(req["argv"], input=req.get("stdin", "").encode(),
                                      capture_output=True, timeout=req.get("timeout", 60),
                                      check=False)
                rc, so, se = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as err:
                rc, so, se = -9, err.stdout or b"", (err.stderr or b"") + b"\n(timeout)"
            except OSError as err:
                rc, so, se = 127, b"", str(err).encode()
            ans = {"id": req["id"], "rc": rc, "out": base64.b64encode(so).decode(),
                   "err": base64.b64encode(se).decode()}
            send(fd, json.dumps(ans).encode() + b"\n")


if __name__ == "__main__":
    serve()
