"""k3s-service mode: the K3s unit the remedy would restart exists, and the polkit rule that
lets the agent's user restart it is installed and grants exactly that.

The unit is looked up over D-Bus as the remedy resolves it (``unit = "auto"``:
``k3s-agent.service``, else ``k3s.service``). The rule is JavaScript that polkitd runs; the
doctor does not run it but reads it: it must exist, belong to root and be writable by no
one else (anyone who can edit it can restart anything), allow action
``org.freedesktop.systemd1.manage-units`` only for verb ``restart``, list the unit, name the
agent's user, and end that user's requests with ``polkit.Result.NO`` (the shipped
``systemd/50-edgeheal-k3s-restart.rules`` does all of this).
"""

from __future__ import annotations

import re
import stat
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat
from edgeheal.tools.doctor.finding import Finding, fail, ok, skip
from edgeheal.tools.doctor.system import NoBus

if TYPE_CHECKING:
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import System

AGENT_UNIT = "edgeheal.service"
DEFAULT_USER = "edgeheal"


def applies(config: Config) -> bool:
    return config.remediation.mode in ("k3s-service", "auto")


async def unit(config: Config, system: System) -> tuple[Finding, str | None]:
    """(the finding, the unit the remedy would restart or None)."""
    from edgeheal.remedies.k3s_service import AUTO_UNITS

    name = "k3s-service.unit"
    mode = config.remediation.mode
    if not applies(config):
        return skip(name, f"remediation mode {mode}: no unit is restarted"), None
    configured = config.remediation.service.unit
    names = AUTO_UNITS if configured == "auto" else (configured,)
    try:
        states = {n: await system.unit(system.bus_address, n) for n in names}
    except NoBus as err:
        return skip(name, f"{err}: cannot look the unit up"), None
    except (OSError, RuntimeError, *compat.TimeoutErrors) as err:
        return fail(name, f"systemd did not answer: {err}", "check `systemctl status`"), None
    loaded = [n for n, p in states.items() if p.get("LoadState") == "loaded"]
    if not loaded:
        text = f"no {' or '.join(names)} on this node"
        if mode == "auto":
            return skip(name, text + " (mode auto: k3s-service is not picked)"), None
        return fail(name, text, "install K3s, or set [remediation.service] unit to its "
                    "unit (`systemctl list-units 'k3s*'`)", units=list(names)), None
    active = [n for n in loaded if states[n].get("ActiveState") == "active"]
    chosen = active[0] if len(active) == 1 else loaded[0]
    if len(loaded) > 1 and len(active) != 1:
        return fail(name, f"both {' and '.join(loaded)} are loaded and "
                    f"{'both' if active else 'neither'} active: unit auto is ambiguous",
                    "set [remediation.service] unit"), None
    state = states[chosen].get("ActiveState", "?")
    return ok(name, f"{chosen} is loaded ({state})", unit=chosen, active_state=state), chosen


async def agent_user(system: System) -> str:
    """The user edgeheal.service runs as (the shipped unit's when systemd cannot tell)."""
    try:
        props = await system.unit(system.bus_address, AGENT_UNIT)
    except (NoBus, OSError, RuntimeError, *compat.TimeoutErrors):
        return DEFAULT_USER
    if not props:
        return DEFAULT_USER
    return str(props.get("User", "") or "root")


_STRING = r"""["']([^"']*)["']"""


def rule_problems(text: str, unit: str, user: str) -> list[str]:
    """What keeps the rule text from granting ``user`` exactly ``restart`` of ``unit``."""
    problems = []
    if "org.freedesktop.systemd1.manage-units" not in text:
        problems.append("it does not handle org.freedesktop.systemd1.manage-units")
    verbs = set(re.findall(r"lookup\(\s*[\"']verb[\"']\s*\)\s*===?\s*" + _STRING, text))
    if verbs != {"restart"}:
        problems.append(f"it allows the verbs {sorted(verbs) or 'none'}, not exactly restart")
    units = re.search(r"UNITS\s*=\s*\[([^\]]*)\]", text)
    listed = re.findall(_STRING, units.group(1)) if units else []
    if unit not in listed:
        problems.append(f"its UNITS do not list {unit} ({', '.join(listed) or 'none'})")
    users = re.findall(r"USER\s*=\s*" + _STRING, text)
    if user not in users:
        problems.append(f"its USER is {users[0] if users else 'not set'}, not {user}")
    if text.count("polkit.Result.YES") != 1 or "return polkit.Result.NO" not in text:
        problems.append("it does not answer NO to everything else the user asks")
    return problems


async def polkit(config: Config, system: System, unit: str | None) -> Finding:
    name = "k3s-service.polkit"
    if not applies(config) or unit is None:
        return skip(name, "no K3s unit to restart")
    user = await agent_user(system)
    if user == "root":
        return ok(name, "the agent runs as root: systemd does not ask polkit")
    path = system.polkit_rule
    fix = (f"install the shipped rule: `install -m 0644 -o root -g root "
           f"systemd/50-edgeheal-k3s-restart.rules {path}` (./install.sh does), adding "
           f"{unit} to UNITS if it is not a standard K3s unit")
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return fail(name, f"{path} is not installed: systemd will refuse the restart "
                    "(InteractiveAuthorizationRequired)", fix)
    except OSError as err:
        return fail(name, f"{path}: {err.strerror}", fix)
    if not stat.S_ISREG(info.st_mode):
        return fail(name, f"{path} is not a regular file", fix)
    problems = rule_problems(text, unit, user)
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.insert(0, f"it is writable by others than root (owner uid {info.st_uid}, "
                        f"mode {stat.S_IMODE(info.st_mode):04o})")
    detail: dict[str, Any] = {"path": str(path), "user": user, "unit": unit}
    if problems:
        return fail(name, f"{path}: " + "; ".join(problems), fix, **detail)
    return ok(name, f"{path} lets {user} restart exactly {unit}", **detail)
