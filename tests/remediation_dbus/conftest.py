"""Fixtures: a private system-like dbus-daemon per test (Debian package ``dbus``; its
absence is an error, not a skip: CI must run these against a real bus)."""

from __future__ import annotations

import pytest

from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import SystemBus, start_system_bus


@pytest.fixture
def system_bus(sandbox: Sandbox) -> SystemBus:
    """A bus whose policy lets anyone call systemd (polkit would decide, as on a host)."""
    return start_system_bus(sandbox)


@pytest.fixture
def denying_bus(sandbox: Sandbox) -> SystemBus:
    """A bus whose own policy refuses Manager.RestartUnit (dbus-daemon's AccessDenied)."""
    return start_system_bus(sandbox, deny_restart=True)
