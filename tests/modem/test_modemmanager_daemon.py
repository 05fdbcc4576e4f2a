"""The real ModemManager daemon (Debian package ``modemmanager``) on a private test bus:
discovery copes with "ModemManager runs, no modem" and returns () cleanly.

It runs with ``--test-session`` (it owns its name on the "session" bus, which is our private
dbus-daemon), ``--test-no-udev`` and ``--no-auto-scan`` (it probes no device), inside a
network namespace of its own (no kernel device events from the host reach it there), and
with both bus variables pointing at the private bus, so it never talks to the host's."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest
from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus

from edgeheal.boundaries.modemmanager.client import ModemManager
from edgeheal.boundaries.modemmanager.readings import SERVICE, ModemError
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import SystemBus

ARGS = ("--test-session", "--test-no-udev", "--no-auto-scan", "--test-no-qrtr",
        "--test-no-suspend-resume", "--log-level=INFO")


async def owner_pid(bus: SystemBus) -> int:
    conn = await MessageBus(bus_address=bus.address, bus_type=BusType.SYSTEM).connect()
    try:
        reply = await conn.call(Message(
            destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member="GetConnectionUnixProcessID",
            signature="s", body=[SERVICE]))
        assert reply is not None
        assert reply.error_name is None, reply.body
        return int(reply.body[0])
    finally:
        conn.disconnect()
        await conn.wait_for_disconnect()


async def test_the_real_modemmanager_with_no_modem_reads_as_no_modems(
        sandbox: Sandbox, modem_bus: SystemBus, tmp_path: os.PathLike[str]) -> None:
    daemon = shutil.which("ModemManager") or "/usr/sbin/ModemManager"
    assert os.access(daemon, os.X_OK), "ModemManager is missing: install.sh --dev installs it"
    mm = ModemManager(modem_bus.address, timeout=2.0)
    try:
        with pytest.raises(ModemError) as before:
            await mm.modems()
        assert before.value.reason == "absent"
        ns = sandbox.netns("mm")
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"),
               "DBUS_SESSION_BUS_ADDRESS": modem_bus.address,
               "DBUS_SYSTEM_BUS_ADDRESS": modem_bus.address}
        log = sandbox.track(modem_bus.socket_path.parent / "ModemManager.log")
        proc = sandbox.spawn([daemon, *ARGS], ns=ns, log_path=log, env=env)
        deadline = time.monotonic() + 30
        seen: tuple[object, ...] | None = None
        reasons: set[str] = set()
        while seen is None:
            assert proc.poll() is None, f"ModemManager exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no answer: {log.read_text()[-2000:]}"
            try:
                seen = await mm.modems()
            except ModemError as err:
                reasons.add(err.reason)
                await asyncio.sleep(0.2)
        assert seen == ()
        assert reasons <= {"absent"}, "only 'not there yet' before it answered"
        # the answer came from the daemon we started (ip netns exec execs it: same pid)
        assert await owner_pid(modem_bus) == proc.pid
        assert "starting in session bus" in log.read_text()
    finally:
        await mm.close()
