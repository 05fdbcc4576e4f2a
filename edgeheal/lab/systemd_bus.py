"""A private, system-like D-Bus with a stand-in systemd, for testing the k3s-service remedy.

Why: the ``k3s-service`` remedy talks to systemd over D-Bus, and the parts that go wrong in
the field are the bus's, not ours to fake — authentication, the bus policy (an
``AccessDenied`` comes from dbus-daemon itself), match rules, signal routing, a bus that
is not there. So the tests run a real ``dbus-daemon`` with its own generated config on a
unix socket in a temporary directory, and put a stand-in ``org.freedesktop.systemd1`` on
it, written with dbus-fast, that speaks the subset of systemd's API the remedy uses, with
systemd's names, object paths, signatures and error names:

- ``Manager.GetUnit(s) -> o`` (``org.freedesktop.systemd1.NoSuchUnit`` when not loaded),
  ``Manager.LoadUnit(s) -> o`` (an unknown unit loads with ``LoadState`` ``not-found``),
  ``Manager.RestartUnit(ss) -> o`` (a job path), ``Manager.Subscribe()``/``Unsubscribe()``;
- the ``JobRemoved(u id, o job, s unit, s result)`` signal, and ``PropertiesChanged`` of a
  unit's ``ActiveState`` — both sent only while a client is subscribed, as systemd does;
- ``org.freedesktop.systemd1.Unit`` objects (``/org/freedesktop/systemd1/unit/<escaped>``)
  with ``Id``, ``LoadState``, ``ActiveState`` and ``SubState`` (``Properties.Get/GetAll``).

:class:`Behaviour` chooses how a restart goes: success, a job that fails, a unit that does
not come back, or polkit saying no (``InteractiveAuthorizationRequired``, what systemd
answers a non-root caller that no polkit rule allows). ``start_system_bus(...,
deny_restart=True)`` instead makes dbus-daemon's own policy refuse ``RestartUnit``
(``AccessDenied``). ``on_restart`` is called while the unit is ``activating`` — the lab's
stand-in k3s-agent re-creates the edge's tunnel device there, as K3s's Flannel would.

Lab code: it imports dbus-fast at the top and runs a process; the agent never imports it.
Everything is torn down: the daemon and its files belong to a :class:`Sandbox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from xml.sax.saxutils import quoteattr

from dbus_fast import DBusError, ErrorType, PropertyAccess
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusObjectPath, DBusSignature, DBusStr
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property, dbus_signal

from edgeheal.lab.netns import LabError, Sandbox, require_programs
from edgeheal.lab.standin import BusStandIn

log = logging.getLogger(__name__)

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


class Behaviour(enum.Enum):
    """How the stand-in carries out ``RestartUnit``."""

    SUCCESS = "success"
    """deactivating -> activating (``on_restart``) -> active; job ``done``."""
    JOB_FAILS = "job-fails"
    """activating -> failed; job ``failed`` (the unit's start failed)."""
    NEVER_ACTIVE = "never-active"
    """Job ``done``, then the unit sits in activating/auto-restart and never comes back."""
    POLKIT_DENIED = "polkit-denied"
    """``RestartUnit`` answers ``InteractiveAuthorizationRequired``; nothing happens."""


# --- the bus ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SystemBus:
    """A running private dbus-daemon. Its process and files belong to the sandbox."""

    address: str
    socket_path: Path
    config_path: Path


def bus_config(socket_path: Path, *, deny_restart: bool = False, policy: str = "") -> str:
    """A dbus-daemon config shaped like the system bus's: method calls are denied unless a
    rule lets them through, signals and replies flow, only systemd's name may be owned
    (``policy``: more rules, e.g. the stand-in ModemManager's, edgeheal.lab.modemmanager)."""
    deny = ('    <deny send_destination="org.freedesktop.systemd1"\n'
            '          send_interface="org.freedesktop.systemd1.Manager"\n'
            '          send_member="RestartUnit"/>\n') if deny_restart else ""
    return f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={quoteattr(str(socket_path))[1:-1]}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow own="org.freedesktop.systemd1"/>
    <allow send_destination="org.freedesktop.systemd1"/>
{deny}{policy}  </policy>
</busconfig>
"""


def start_system_bus(sandbox: Sandbox, directory: Path | None = None, *,
                     deny_restart: bool = False, policy: str = "",
                     timeout: float = 10.0) -> SystemBus:
    """Start ``dbus-daemon`` on ``<directory>/system_bus_socket``; return once it accepts.

    ``directory`` defaults to a fresh short temporary directory (a unix socket path must
    fit in 108 bytes, which pytest's ``tmp_path`` of a long test name may not)."""
    require_programs("dbus-daemon")
    if directory is None:
        directory = sandbox.track(Path(tempfile.mkdtemp(prefix="ehbus-")))
    directory.mkdir(parents=True, exist_ok=True)
    if len(str(directory / "system_bus_socket")) > 100:
        raise LabError(f"{directory} is too long a path for a unix socket; pass a shorter one")
    socket_path = sandbox.track(directory / "system_bus_socket")
    config_path = sandbox.track(directory / "system-bus.conf")
    config_path.write_text(bus_config(socket_path, deny_restart=deny_restart, policy=policy),
                           encoding="utf-8")
    daemon = shutil.which("dbus-daemon")
    assert daemon is not None  # noqa: S101 - require_programs checked it
    proc = sandbox.spawn([daemon, f"--config-file={config_path}", "--nofork", "--nopidfile",
                          "--nosyslog"], log_path=sandbox.track(directory / "dbus-daemon.log"))
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            log_text = (directory / "dbus-daemon.log").read_text(errors="replace")
            raise LabError(f"dbus-daemon exited with {proc.returncode}: {log_text.strip()}")
        if socket_path.exists() and _accepts(socket_path):
            break
        if time.monotonic() > deadline:
            raise LabError(f"dbus-daemon did not listen on {socket_path} within {timeout:g}s")
        time.sleep(0.02)
    return SystemBus(f"unix:path={socket_path}", socket_path, config_path)


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


# --- the stand-in systemd ---------------------------------------------------------------

def unit_path(name: str) -> str:
    """systemd's object path for a unit: ``k3s-agent.service`` ->
    ``/org/freedesktop/systemd1/unit/k3s_2dagent_2eservice`` (sd_bus_path_encode)."""
    out = "".join(c if c.isalnum() and c.isascii() else f"_{ord(c):02x}" for c in name)
    if out[:1].isdigit():
        out = f"_{ord(out[0]):02x}{out[1:]}"
    return f"{MANAGER_PATH}/unit/{out}"


RestartHook = Callable[[str], Awaitable[None] | None]


@dataclass
class FakeUnit:
    name: str
    load_state: str = "loaded"
    active_state: str = "active"
    sub_state: str = "running"


class _UnitObject(ServiceInterface):
    def __init__(self, unit: FakeUnit) -> None:
        super().__init__(UNIT_IFACE)
        self.unit = unit

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> DBusStr:
        return self.unit.name

    @dbus_property(access=PropertyAccess.READ)
    def LoadState(self) -> DBusStr:
        return self.unit.load_state

    @dbus_property(access=PropertyAccess.READ)
    def ActiveState(self) -> DBusStr:
        return self.unit.active_state

    @dbus_property(access=PropertyAccess.READ)
    def SubState(self) -> DBusStr:
        return self.unit.sub_state


class _Manager(ServiceInterface):
    # Method, property and signal names are systemd's (CamelCase on the bus).

    def __init__(self, fake: FakeSystemd) -> None:
        super().__init__(MANAGER_IFACE)
        self.fake = fake

    @dbus_method()
    def GetUnit(self, name: DBusStr) -> DBusObjectPath:
        self.fake.calls.append(("GetUnit", name))
        unit = self.fake.units.get(name)
        if unit is None or unit.load_state == "not-found":
            raise DBusError(NO_SUCH_UNIT, f"Unit {name} not loaded.")
        return unit_path(name)

    @dbus_method()
    def LoadUnit(self, name: DBusStr) -> DBusObjectPath:
        self.fake.calls.append(("LoadUnit", name))
        if name not in self.fake.units:
            self.fake.add_unit(FakeUnit(name, "not-found", "inactive", "dead"))
        return unit_path(name)

    @dbus_method()
    def RestartUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        self.fake.calls.append(("RestartUnit", name))
        return self.fake.restart(name, mode)

    @dbus_method()
    def Subscribe(self):  # type: ignore[no-untyped-def]
        self.fake.calls.append(("Subscribe", ""))
        self.fake.subscribers += 1

    @dbus_method()
    def Unsubscribe(self):  # type: ignore[no-untyped-def]
        self.fake.calls.append(("Unsubscribe", ""))
        if self.fake.subscribers == 0:
            raise DBusError("org.freedesktop.systemd1.NotSubscribed",
                            "Client is not subscribed.")
        self.fake.subscribers -= 1

    @dbus_signal()
    def JobRemoved(self, job_id: int, job: str, unit: str,
                   result: str) -> Annotated[tuple[int, str, str, str], DBusSignature("uoss")]:
        return job_id, job, unit, result


@dataclass
class FakeSystemd(BusStandIn):
    """The stand-in ``org.freedesktop.systemd1``. Use ``async with`` (or start/close)."""

    SERVICE = SYSTEMD
    address: str
    units: dict[str, FakeUnit] = field(default_factory=dict)
    behaviour: Behaviour = Behaviour.SUCCESS
    restart_delay: float = 0.2
    """Simulated time the unit spends stopping + starting."""
    on_restart: RestartHook | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Every Manager call received, in order: (method, unit or "")."""
    restarts: list[str] = field(default_factory=list)
    """Units whose restart job was accepted."""
    subscribers: int = 0
    _manager: _Manager | None = None
    _objects: dict[str, _UnitObject] = field(default_factory=dict)
    _jobs: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def with_units(cls, address: str, states: Mapping[str, str], **kw: Any) -> FakeSystemd:
        """``states`` maps unit name -> ActiveState (every unit given is loaded)."""
        fake = cls(address, **kw)
        for name, state in states.items():
            fake.units[name] = FakeUnit(name, "loaded", state,
                                        "running" if state == "active" else "dead")
        return fake

    def _serve(self, bus: MessageBus) -> None:
        """Export the Manager and the units (then the base owns ``org.freedesktop.systemd1``)."""
        self._manager = _Manager(self)
        bus.export(MANAGER_PATH, self._manager)
        for unit in list(self.units.values()):
            self._export(unit)

    async def _stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def add_unit(self, unit: FakeUnit) -> None:
        self.units[unit.name] = unit
        if self._bus is not None:
            self._export(unit)

    def _export(self, unit: FakeUnit) -> None:
        assert self._bus is not None  # noqa: S101 - internal invariant
        obj = _UnitObject(unit)
        self._objects[unit.name] = obj
        self._bus.export(unit_path(unit.name), obj)

    def set_state(self, name: str, active: str, sub: str) -> None:
        """Change a unit's ActiveState/SubState and tell subscribers, like systemd."""
        unit = self.units[name]
        unit.active_state, unit.sub_state = active, sub
        if self.subscribers and self._connected:
            self._objects[name].emit_properties_changed(
                {"ActiveState": active, "SubState": sub})

    def restart(self, name: str, mode: str) -> str:
        if self.behaviour is Behaviour.POLKIT_DENIED:
            raise DBusError(ErrorType.INTERACTIVE_AUTHORIZATION_REQUIRED,
                            "Interactive authentication required.")
        if mode not in ("replace", "fail", "isolate", "ignore-dependencies",
                        "ignore-requirements"):
            raise DBusError(ErrorType.INVALID_ARGS, f"Job mode {mode} invalid.")
        unit = self.units.get(name)
        if unit is None or unit.load_state != "loaded":
            raise DBusError(NO_SUCH_UNIT, f"Unit {name} not found.")
        self._jobs += 1
        job_id, job = self._jobs, f"{MANAGER_PATH}/job/{self._jobs}"
        self.restarts.append(name)
        task = asyncio.get_running_loop().create_task(self._run_job(job_id, job, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run_job(self, job_id: int, job: str, name: str) -> None:
        await asyncio.sleep(0)  # the method reply goes out first, as in systemd
        self.set_state(name, "deactivating", "stop-sigterm")
        self.set_state(name, "inactive", "dead")
        self.set_state(name, "activating", "start")
        result = "done"
        try:
            if self.on_restart is not None:
                maybe = self.on_restart(name)
                if inspect.isawaitable(maybe):
                    await maybe
        except Exception:
            log.exception("on_restart hook for %s failed", name)
            result = "failed"
        await asyncio.sleep(self.restart_delay)
        if result == "failed" or self.behaviour is Behaviour.JOB_FAILS:
            self.set_state(name, "failed", "failed")
            result = "failed"
        elif self.behaviour is Behaviour.NEVER_ACTIVE:
            self.set_state(name, "activating", "auto-restart")
        else:
            self.set_state(name, "active", "running")
        if self.subscribers and self._manager is not None and self._connected:
            self._manager.JobRemoved(job_id, job, name, result)
