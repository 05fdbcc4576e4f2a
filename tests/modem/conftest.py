"""Fixtures: a private system-like dbus-daemon per test whose policy lets ModemManager's
name be owned (Debian package ``dbus``; its absence is an error, not a skip)."""

from __future__ import annotations

import pytest

from edgeheal.lab.modemmanager import BUS_POLICY
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import SystemBus, start_system_bus


@pytest.fixture
def modem_bus(sandbox: Sandbox) -> SystemBus:
    return start_system_bus(sandbox, policy=BUS_POLICY)
