"""The ``modemmanager-restart`` rung: restart the ModemManager unit over systemd's D-Bus API.

Why: when a modem vanishes from ModemManager and does not come back, or ModemManager marks
it ``failed`` (a firmware crash, a QMI/MBIM control path that hangs, a ModemManager bug),
ModemManager itself no longer recovers it; a restart makes it drop every port it holds and
probe every modem afresh, which is what field engineers do first (LF EVE's ``mmagent``
restarts ModemManager before it reloads drivers or reboots). It cuts nothing that works:
the verdicts it is for (``modem_absent``, ``modem_failed``) mean there is no data session
to lose.

How: exactly the ``k3s-service`` remedy's restart
(:class:`edgeheal.remedies.k3s_service.K3sServiceRemedy`: ``Subscribe``, a match on
``JobRemoved`` before the job exists, ``RestartUnit(unit, "replace")``, the job's result,
then ``ActiveState`` ``active``), for ``[remediation.uplink] modemmanager_unit``
(``ModemManager.service``; only a ``ModemManager*.service`` name is accepted) within
``modemmanager_timeout``. Whether the modem is back is the uplink check's to verify.

Privilege: systemd asks polkit for ``org.freedesktop.systemd1.manage-units`` with details
``unit`` and ``verb``; ``systemd/49-edgeheal-uplink.rules`` grants user ``edgeheal``
exactly ``restart`` of ``ModemManager.service``. polkit 0.105's ``.pkla`` cannot see the
unit, so the package's ``.pkla`` does not grant it (docs/uplink-privileges.md).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from edgeheal.remedies import UPLINK, RemedyError, RemedyRegistration, register
from edgeheal.remedies.k3s_service import NO_SUCH_UNIT, SYSTEMD, K3sServiceRemedy

if TYPE_CHECKING:
    from edgeheal.boundaries.bus import BusError
    from edgeheal.config import Config

MODE = "modemmanager-restart"
UNIT_PATTERN = re.compile(r"ModemManager[A-Za-z0-9:_.@\\-]{0,100}\.service")
"""The units this rung may restart: ModemManager's, never an arbitrary one."""
POLKIT_RULE = "/etc/polkit-1/rules.d/49-edgeheal-uplink.rules"


class ModemManagerRestart(K3sServiceRemedy):
    """Restarts ModemManager's unit (see the module docstring)."""

    mode = MODE
    WHAT = "ModemManager"

    def __init__(self, config: Config, *, bus_address: str | None = None) -> None:
        from edgeheal.config import ServiceSettings

        ladder = config.remediation.uplink
        super().__init__(ServiceSettings(unit=ladder.modemmanager_unit,
                                         timeout=ladder.modemmanager_timeout),
                         bus_address=bus_address or config.uplink.dbus_address or None)

    def _error(self, err: BusError, unit: str) -> RemedyError:
        if err.kind == "denied":
            return RemedyError(
                f"systemd refused to restart {unit} for uid {os.geteuid()} ({err.name}): "
                f"install the polkit rule {POLKIT_RULE} (shipped as "
                "systemd/49-edgeheal-uplink.rules; it allows user edgeheal exactly `restart` "
                "of ModemManager.service) or fix the bus policy", config_problem=True)
        if err.kind == "absent":
            return RemedyError(f"systemd ({SYSTEMD}) is not on the D-Bus system bus at "
                               f"{self.bus_address}: {err}")
        if err.name == NO_SUCH_UNIT:
            return RemedyError(f"systemd has no unit {unit}: {err}", config_problem=True)
        return RemedyError(f"D-Bus call for {unit} failed: {err}")


def _unavailable(config: Config) -> str:
    return "" if config.uplink.interfaces else "no [uplink] interfaces"


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError

    unit = config.remediation.uplink.modemmanager_unit
    if not UNIT_PATTERN.fullmatch(unit):
        raise ConfigError("remediation.uplink.modemmanager_unit",
                          f"expected ModemManager's unit such as \"ModemManager.service\", "
                          f"got {unit!r}")


register(RemedyRegistration(
    mode=MODE, module="modemmanager_restart", ladder=UPLINK,
    factory=lambda needs: ModemManagerRestart(needs.config),
    restart_bound=lambda config: config.remediation.uplink.modemmanager_timeout,
    unavailable=_unavailable, settings="remediation.uplink", validate=_validate,
    doc="Uplink rung for `modem_absent`/`modem_failed`: restart ModemManager's unit over "
        "systemd's D-Bus API (polkit: exactly `restart` of ModemManager.service)."))
