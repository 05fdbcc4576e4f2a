"""Reach into a network namespace from the lab's own process, without a subprocess.

``setns(2)`` switches only the calling thread's network namespace, and a socket stays in the
namespace it was created in. So the lab opens a socket "in" a namespace by switching the
thread there, creating the socket, and switching back at once (:func:`inside`). That is how
the lab reads an agent's ``/status`` inside an edge namespace, and how the faulty-NIC
emulator reads the edge uplink's offload state from the gateway namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """Run the body with this thread in network namespace ``ns`` (``ip netns`` name)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def http_get(ns: str, host: str, port: int, path: str, timeout: float = 3.0,
             ) -> tuple[int, bytes]:
    """A minimal HTTP/1.0 GET from inside ``ns``; returns (status, body)."""
    with inside(ns):
        sock = socket.create_connection((host, port), timeout=timeout)
    with sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body


def get_json(ns: str, host: str, port: int, path: str, timeout: float = 3.0,
             ) -> tuple[int, Any]:
    status, body = http_get(ns, host, port, path, timeout)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")
