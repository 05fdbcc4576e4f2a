"""The service: ``edgeheal.service`` is installed, enabled and running, and its hardening
is what the shipped unit sets (a drop-in can weaken it; they are named).

Asked over D-Bus (systemd's ``Unit`` and ``Service`` properties, read only); skipped with
the reason where there is no system bus (a container, a test machine without systemd).
``User=root`` is the one documented override (a userspace WireGuard's socket is
root-only) and is reported, not faulted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeheal.tools.doctor.finding import Finding, fail, ok, skip, warn
from edgeheal.tools.doctor.system import NoBus

if TYPE_CHECKING:
    from edgeheal.tools.doctor.system import System

UNIT = "edgeheal.service"
CAP_NET_ADMIN = 1 << 12
HARDENING: dict[str, Any] = {
    "NoNewPrivileges": True, "ProtectSystem": "strict", "ProtectHome": "yes",
    "PrivateTmp": True, "PrivateDevices": True, "ProtectKernelModules": True,
    "ProtectKernelTunables": True, "ProtectClock": True, "MemoryDenyWriteExecute": True,
    "RestrictSUIDSGID": True, "CapabilityBoundingSet": CAP_NET_ADMIN,
}
"""Properties as ``systemd/edgeheal.service`` sets them (systemd's D-Bus names)."""


async def read(system: System) -> dict[str, Any] | str:
    """The unit's properties, or why they cannot be read (a skip)."""
    try:
        return await system.unit(system.bus_address, UNIT)
    except NoBus as err:
        return str(err)


def running(props: dict[str, Any] | str) -> Finding:
    name = "service"
    if isinstance(props, str):
        return skip(name, f"{props}: cannot ask systemd")
    if not props:
        return fail(name, f"{UNIT} is not installed", "run ./install.sh")
    enabled = props.get("UnitFileState", "?")
    active, sub = props.get("ActiveState", "?"), props.get("SubState", "?")
    detail = {"unit_file_state": enabled, "active_state": active, "sub_state": sub,
              "user": props.get("User", "")}
    problems = []
    if enabled != "enabled":
        problems.append(f"not enabled ({enabled}): it will not start at boot")
    if active != "active":
        problems.append(f"not running ({active}/{sub})")
    if problems:
        return fail(name, f"{UNIT}: " + "; ".join(problems),
                    "`systemctl enable --now edgeheal`; if it stops again, "
                    "`journalctl -u edgeheal -b`", **detail)
    return ok(name, f"{UNIT} enabled and running ({sub})", **detail)


def hardening(props: dict[str, Any] | str) -> Finding:
    name = "service.hardening"
    if isinstance(props, str) or not props:
        return skip(name, "the unit cannot be read")
    weak = []
    for key, want in HARDENING.items():
        have = props.get(key)
        if have is not None and have != want:
            weak.append(f"{key}={_show(have)} (shipped {_show(want)})")
    dropins = [str(p) for p in props.get("DropInPaths", ()) or ()]
    user = props.get("User", "") or "root"
    detail = {"weakened": weak, "drop_ins": dropins, "user": user}
    where = f" (drop-ins: {', '.join(dropins)})" if dropins else ""
    if weak:
        return warn(name, "weakened: " + ", ".join(weak) + where,
                    "remove the drop-in lines that weaken it (`systemctl edit edgeheal`); "
                    "only User=root is a documented override (userspace WireGuard)",
                    **detail)
    return ok(name, f"as shipped (user {user}){where}", **detail)


def _show(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value == CAP_NET_ADMIN:
        return "CAP_NET_ADMIN"
    return str(value)
