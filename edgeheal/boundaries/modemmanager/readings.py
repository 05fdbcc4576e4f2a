"""What edgeheal reads of ModemManager, and how a reply is checked before it is believed.

What is read (one ``ObjectManager.GetManagedObjects`` on ``/org/freedesktop/ModemManager1``,
then ``Properties.GetAll`` of each bearer, which ModemManager exports outside the object
manager):

- ``org.freedesktop.ModemManager1.Modem``: ``State`` (``i``, MMModemState), ``SignalQuality``
  (``(ub)``: percent, recent), ``Device`` (``s``: the physical device's sysfs path),
  ``Ports`` (``a(su)``), ``Bearers`` (``ao``); ``StateFailedReason`` (``u``,
  MMModemStateFailedReason) and ``UnlockRequired`` (``u``, MMModemLock), read when present
  (every ModemManager since 1.0 has them; a reply without them reads "none");
- ``org.freedesktop.ModemManager1.Modem.Modem3gpp``: ``RegistrationState`` (``u``,
  MMModem3gppRegistrationState), absent on a modem without 3GPP; ``NetworkRejection``
  (``a{sv}``, its ``error`` ``u``: MMNetworkError, the 3GPP reject cause of TS 24.008
  10.5.3.6 / TS 24.301 9.9.3.9), new in ModemManager 1.24 and read when present;
- ``org.freedesktop.ModemManager1.Bearer``: ``Connected`` (``b``), ``Interface`` (``s``),
  ``Properties`` (``a{sv}``).

Everything read is bounded (counts, string lengths, D-Bus types): a reply that does not fit
is a :class:`ModemError` naming the field, never a crash or an unbounded allocation. The
bearer's ``Properties`` carry the APN's user and password: they are kept only to reconnect
with, hidden from ``repr`` and never put in a message.

Nothing here does I/O: :mod:`edgeheal.boundaries.modemmanager.client` makes the calls and
hands each reply to :func:`managed_modems`, :func:`read_modem` and :func:`read_bearer`.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

SERVICE = "org.freedesktop.ModemManager1"
ROOT_PATH = "/org/freedesktop/ModemManager1"
MODEM_PREFIX = ROOT_PATH + "/Modem/"
BEARER_PREFIX = ROOT_PATH + "/Bearer/"
MODEM_IFACE = "org.freedesktop.ModemManager1.Modem"
MODEM_3GPP_IFACE = "org.freedesktop.ModemManager1.Modem.Modem3gpp"
BEARER_IFACE = "org.freedesktop.ModemManager1.Bearer"
OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"

MAX_MODEMS = 8
MAX_BEARERS = 8
"""Per modem. ModemManager keeps a handful at most (one per connected context)."""
MAX_PORTS = 32
MAX_BEARER_PROPERTIES = 64
MAX_NAME = 255
"""Object paths, port and interface names, property keys."""
MAX_DEVICE = 1024
"""A sysfs device path."""

MODEM_STATES = {
    -1: "failed", 0: "unknown", 1: "initializing", 2: "locked", 3: "disabled",
    4: "disabling", 5: "enabling", 6: "enabled", 7: "searching", 8: "registered",
    9: "disconnecting", 10: "connecting", 11: "connected",
}
"""MMModemState -> lower-case name; a value ModemManager may add later reads "unknown"."""
FAILED_REASONS = {0: "none", 1: "unknown", 2: "sim-missing", 3: "sim-error",
                  4: "unknown-capabilities", 5: "esim-without-profiles"}
"""MMModemStateFailedReason -> the name mmcli prints (ModemManager-enums.h)."""
LOCKS = {0: "unknown", 1: "none", 2: "sim-pin", 3: "sim-pin2", 4: "sim-puk", 5: "sim-puk2",
         6: "ph-sp-pin", 7: "ph-sp-puk", 8: "ph-net-pin", 9: "ph-net-puk", 10: "ph-sim-pin",
         11: "ph-corp-pin", 12: "ph-corp-puk", 13: "ph-fsim-pin", 14: "ph-fsim-puk",
         15: "ph-netsub-pin", 16: "ph-netsub-puk"}
"""MMModemLock -> the name mmcli prints (ModemManager-enums.h)."""
NETWORK_ERRORS = {
    2: "imsi-unknown-in-hlr", 3: "illegal-ms", 4: "imsi-unknown-in-vlr",
    5: "imei-not-accepted", 6: "illegal-me", 7: "gprs-not-allowed",
    8: "gprs-and-non-gprs-not-allowed", 11: "plmn-not-allowed",
    12: "location-area-not-allowed", 13: "roaming-not-allowed-in-location-area",
    14: "gprs-not-allowed-in-plmn", 15: "no-cells-in-location-area",
    17: "network-failure", 22: "congestion", 33: "requested-service-option-not-subscribed"}
"""The commonest MMNetworkError values (3GPP reject causes) -> mmcli's names; another
value reads ``cause N``."""
REGISTRATION_STATES = {
    0: "idle", 1: "home", 2: "searching", 3: "denied", 4: "unknown", 5: "roaming",
    6: "home-sms-only", 7: "roaming-sms-only", 8: "emergency-only",
    9: "home-csfb-not-preferred", 10: "roaming-csfb-not-preferred", 11: "attached-rlos",
}
"""MMModem3gppRegistrationState -> the name mmcli prints; a later value reads "unknown"."""

_PATH = re.compile(r"/[A-Za-z0-9_/]*")


class ModemError(Exception):
    """Talking to ModemManager failed. The message names what (service absent, access
    denied, a malformed reply naming the field, a timeout) and never a secret.

    ``reason`` is one of ``absent`` (no bus, or no ModemManager on it), ``denied`` (the bus
    policy or polkit refused), ``malformed`` (a reply outside the API or our bounds),
    ``timeout``, ``gone`` (the object went away: a modem or bearer removed meanwhile),
    ``failed`` (ModemManager answered with another error)."""

    def __init__(self, message: str, *, reason: str = "failed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Bearer:
    path: str
    connected: bool
    interface: str
    """``Bearer.Interface``: the network interface of the data session ("" if none)."""
    properties: Mapping[str, Any] = field(repr=False, compare=False)
    """``Bearer.Properties`` (apn, ip-type, user, password, ...) as dbus-fast Variants, kept
    only to reconnect with; never in logs, /status or errors (hence ``repr=False``)."""


@dataclass(frozen=True, slots=True)
class Modem:
    path: str
    """``/org/freedesktop/ModemManager1/Modem/N``."""
    state: str
    """MMModemState's lower-case name (:data:`MODEM_STATES`)."""
    registration: str
    """MMModem3gppRegistrationState's name (:data:`REGISTRATION_STATES`); "" without 3GPP."""
    signal_quality: int
    """0..100 (``Modem.SignalQuality``)."""
    signal_recent: bool
    device: str
    """``Modem.Device``: the sysfs path of the physical device (the USB rung's target)."""
    ports: tuple[tuple[str, int], ...]
    """(name, MMModemPortType) pairs."""
    bearers: tuple[Bearer, ...]
    failed_reason: str = "none"
    """``Modem.StateFailedReason``'s name (:data:`FAILED_REASONS`), meaningful when
    ``state`` is ``failed``."""
    unlock_required: str = "none"
    """``Modem.UnlockRequired``'s name (:data:`LOCKS`): what a ``locked`` modem waits for."""
    reject_cause: int = 0
    """``Modem3gpp.NetworkRejection["error"]`` (MMNetworkError; 0: none or not reported)."""

    @property
    def reject_name(self) -> str:
        """The reject cause as mmcli names it ("" when none was reported)."""
        if not self.reject_cause:
            return ""
        return NETWORK_ERRORS.get(self.reject_cause, f"cause {self.reject_cause}")



def managed_modems(objects: dict[str, dict[str, dict[str, Any]]],
                   ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """``GetManagedObjects``' modems in path order: (path, ``Modem`` properties,
    ``Modem3gpp`` properties or None), each path checked as it is reached."""
    if len(objects) > MAX_MODEMS:
        raise ModemError(f"GetManagedObjects: {len(objects)} objects, more than "
                         f"{MAX_MODEMS} modems", reason="malformed")
    for path in sorted(objects):
        interfaces = objects[path]
        modem = interfaces.get(MODEM_IFACE)
        if modem is None:  # not (yet) a modem: ModemManager exports nothing else here
            continue
        check_path(path, MODEM_PREFIX, "modem path")
        yield path, modem, interfaces.get(MODEM_3GPP_IFACE)


def read_modem(path: str, props: dict[str, Any],
               gpp: dict[str, Any] | None) -> tuple[Modem, tuple[str, ...]]:
    """The modem its properties describe, without its bearers (``bearers`` is empty), and
    the paths of those bearers (not yet checked: the reader checks each path as it asks
    for that bearer, one call each)."""
    state = _get(props, "State", "i", path)
    quality, recent = _get(props, "SignalQuality", "(ub)", path)
    if not 0 <= quality <= 100:
        raise ModemError(f"{path}: SignalQuality {quality} is not 0..100",
                         reason="malformed")
    device = _string(_get(props, "Device", "s", path), MAX_DEVICE, f"{path}: Device")
    raw_ports = _get(props, "Ports", "a(su)", path)
    if len(raw_ports) > MAX_PORTS:
        raise ModemError(f"{path}: Ports has {len(raw_ports)} entries, more than "
                         f"{MAX_PORTS}", reason="malformed")
    ports = tuple((_string(name, MAX_NAME, f"{path}: Ports"), int(kind))
                  for name, kind in raw_ports)
    bearer_paths = _get(props, "Bearers", "ao", path)
    if len(bearer_paths) > MAX_BEARERS:
        raise ModemError(f"{path}: Bearers has {len(bearer_paths)} entries, more than "
                         f"{MAX_BEARERS}", reason="malformed")
    registration, reject = "", 0
    if gpp is not None:
        value = _get(gpp, "RegistrationState", "u", path)
        registration = REGISTRATION_STATES.get(value, "unknown")
        rejection = _optional(gpp, "NetworkRejection", "a{sv}", path)
        if rejection is not None:
            error = rejection.get("error")
            if error is not None and getattr(error, "signature", None) == "u":
                reject = int(error.value)
    failed = _optional(props, "StateFailedReason", "u", path)
    lock = _optional(props, "UnlockRequired", "u", path)
    modem = Modem(path=path, state=MODEM_STATES.get(state, "unknown"),
                  registration=registration, signal_quality=int(quality),
                  signal_recent=bool(recent), device=device, ports=ports, bearers=(),
                  failed_reason=FAILED_REASONS.get(failed, "unknown") if failed is not None
                  else "none",
                  unlock_required=LOCKS.get(lock, "unknown") if lock is not None
                  else "none",
                  reject_cause=reject)
    return modem, tuple(bearer_paths)


def read_bearer(path: str, props: dict[str, Any]) -> Bearer:
    """The bearer its ``Properties.GetAll`` reply describes."""
    settings = _get(props, "Properties", "a{sv}", path)
    if len(settings) > MAX_BEARER_PROPERTIES or not all(
            isinstance(key, str) and len(key) <= MAX_NAME for key in settings):
        raise ModemError(f"{path}: Properties has more than {MAX_BEARER_PROPERTIES} "
                         "entries or a malformed key", reason="malformed")
    return Bearer(path=path, connected=bool(_get(props, "Connected", "b", path)),
                  interface=_string(_get(props, "Interface", "s", path), MAX_NAME,
                                    f"{path}: Interface"),
                  properties=types.MappingProxyType(dict(settings)))


def _get(props: dict[str, Any], name: str, signature: str, where: str) -> Any:
    """The value of property ``name``, which must be a Variant of ``signature``."""
    variant = props.get(name)
    if variant is None:
        raise ModemError(f"{where}: property {name} is missing", reason="malformed")
    if getattr(variant, "signature", None) != signature:
        raise ModemError(f"{where}: property {name} has type "
                         f"{getattr(variant, 'signature', '?')!r}, expected {signature!r}",
                         reason="malformed")
    return variant.value


def _optional(props: dict[str, Any], name: str, signature: str, where: str) -> Any:
    """Like :func:`_get`, for a property an older ModemManager may lack: None if absent."""
    return _get(props, name, signature, where) if name in props else None


def _string(value: str, limit: int, what: str) -> str:
    if len(value) > limit or "\x00" in value:
        raise ModemError(f"{what}: a string of {len(value)} characters (at most {limit})",
                         reason="malformed")
    return value


def check_path(path: str, prefix: str, what: str) -> None:
    """``path`` is an object path under ``prefix`` within :data:`MAX_NAME`, or a
    :class:`ModemError` naming ``what``."""
    if (not isinstance(path, str) or not path.startswith(prefix) or len(path) > MAX_NAME
            or not _PATH.fullmatch(path)):
        raise ModemError(f"{what} {str(path)[:80]!r} is not under {prefix}",
                         reason="malformed")


__all__ = ["BEARER_IFACE", "BEARER_PREFIX", "FAILED_REASONS", "LOCKS", "MAX_MODEMS",
           "MODEM_3GPP_IFACE", "MODEM_IFACE", "MODEM_PREFIX", "MODEM_STATES",
           "NETWORK_ERRORS", "OBJECT_MANAGER_IFACE", "PROPERTIES_IFACE",
           "REGISTRATION_STATES", "ROOT_PATH", "SERVICE", "Bearer", "Modem", "ModemError",
           "check_path", "managed_modems", "read_bearer", "read_modem"]
