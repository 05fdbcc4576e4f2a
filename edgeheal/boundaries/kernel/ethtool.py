"""The ethtool boundary: read and switch off netdev features, through the kernel's ioctl.

Why a boundary of our own: the checksum-offload enforcer needs exactly three things from
the kernel -- which interfaces exist, which features an interface has (on/off, fixed or
changeable), and "switch these off" -- and the logic above it
(:mod:`edgeheal.checks.offload.enforcer`) must be testable with recorded feature sets of real
drivers. So this module is the only place that talks to the kernel about features, behind the small
:class:`FeatureSource`
protocol, and it turns every kernel failure into one of our own exceptions:

- :class:`NoSuchInterface` (ENODEV): the interface vanished (a modem re-enumerating);
- :class:`NotPermitted` (EPERM/EACCES): changing features needs CAP_NET_ADMIN;
- :class:`Unsupported` (EOPNOTSUPP): the driver does not answer the request.

It uses pyroute2's ``IoctlEthtool`` (``SIOCETHTOOL`` with ``ETHTOOL_GFEATURES`` /
``ETHTOOL_SFEATURES``, the same calls ``ethtool -k/-K`` make), never the ``ethtool``
program: the agent runs no subprocesses in its steady state. pyroute2 is imported only
when an :class:`Ethtool` is opened, so a node without ``[offload] interfaces`` never
loads it.

"Fixed" follows ``ethtool -k``: a feature is fixed when the driver does not offer it in
``hw_features`` (not *available*) or the kernel marks it as never changeable. Reading
features needs no privilege; changing them needs CAP_NET_ADMIN in the interface's network
namespace. The socket lives in the network namespace of the thread that makes the first
call (tests exploit that to run the enforcer inside a namespace they made).
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

log = logging.getLogger("edgeheal.ethtool")  # the name operators grep for


class EthtoolError(Exception):
    """A feature request failed; the message names the interface and the request."""

    def __init__(self, message: str, *, interface: str = "") -> None:
        super().__init__(message)
        self.interface = interface


class NoSuchInterface(EthtoolError):
    """The interface does not exist (any more) in this network namespace."""


class NotPermitted(EthtoolError):
    """Changing features needs CAP_NET_ADMIN (run as root, or grant the capability)."""


class Unsupported(EthtoolError):
    """The driver does not support this ethtool request (EOPNOTSUPP)."""


@dataclass(frozen=True, slots=True)
class Feature:
    """One netdev feature of one interface, as ``ethtool -k`` shows it."""

    name: str
    on: bool
    fixed: bool

    def render(self) -> str:
        return ("on" if self.on else "off") + (" [fixed]" if self.fixed else "")


class FeatureSource(Protocol):
    """What the enforcer needs from the kernel; :class:`Ethtool` is the real one,
    tests use recorded feature sets."""

    def interfaces(self) -> list[str]:
        """Names of the interfaces present now."""
        ...

    def features(self, ifname: str) -> Mapping[str, Feature]:
        """Every feature the kernel reports for ``ifname`` (by kernel feature name)."""
        ...

    def disable(self, ifname: str, names: Iterable[str]) -> None:
        """Request ``names`` off on ``ifname``. The caller reads back the result."""
        ...


def _translate(err: BaseException, ifname: str, what: str) -> EthtoolError:
    """Map an ioctl failure (OSError or pyroute2's own types) to our exceptions."""
    _pyroute2.light()
    from pyroute2.ethtool.ioctl import NoSuchDevice, NotSupportedError

    if isinstance(err, NoSuchDevice):
        return NoSuchInterface(f"{ifname}: no such interface", interface=ifname)
    if isinstance(err, NotSupportedError):
        return Unsupported(f"{ifname}: {what} is not supported by its driver",
                           interface=ifname)
    code = getattr(err, "errno", None)
    if code in (errno.ENODEV, errno.ENXIO):
        return NoSuchInterface(f"{ifname}: no such interface", interface=ifname)
    if code in (errno.EPERM, errno.EACCES):
        return NotPermitted(
            f"{ifname}: {what} needs CAP_NET_ADMIN (permission denied)", interface=ifname)
    if code in (errno.EOPNOTSUPP, errno.ENOTSUP):
        return Unsupported(f"{ifname}: {what} is not supported by its driver",
                           interface=ifname)
    detail = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return EthtoolError(f"{ifname}: {what} failed: {detail}", interface=ifname)


class Ethtool:
    """The real :class:`FeatureSource`: pyroute2's ethtool ioctls on one AF_INET socket.

    Not thread-safe; the enforcer uses it from one worker thread. ``close()`` it.
    """

    def __init__(self) -> None:
        self._ioctl: Any = None

    def _handle(self, ifname: str) -> Any:
        if self._ioctl is None:
            _pyroute2.light()
            from pyroute2.ethtool.ioctl import IoctlEthtool  # heavy, lazy

            self._ioctl = IoctlEthtool()
        if not ifname or len(ifname.encode()) >= 16 or "/" in ifname:
            raise NoSuchInterface(f"{ifname!r}: not a valid interface name", interface=ifname)
        self._ioctl.change_ifname(ifname)
        return self._ioctl

    def interfaces(self) -> list[str]:
        try:
            return [name for _, name in socket.if_nameindex()]
        except OSError as err:
            raise EthtoolError(f"cannot list interfaces: {err.strerror}") from err

    def features(self, ifname: str) -> dict[str, Feature]:
        handle = self._handle(ifname)
        try:
            flist = handle.get_features()
        except Exception as err:
            raise _translate(err, ifname, "reading features") from err
        return {name: Feature(name, bool(flist.is_active(name)),
                              not flist.is_available(name) or bool(
                                  flist.is_never_changed(name)))
                for name in flist.keys() if name}  # noqa: SIM118 - iter() yields tuples

    def disable(self, ifname: str, names: Iterable[str]) -> None:
        wanted = list(names)
        if not wanted:
            return
        handle = self._handle(ifname)
        try:
            flist = handle.get_features()
            for name in wanted:
                flist[name] = False
            handle.set_features(flist)
        except KeyError as err:
            raise Unsupported(f"{ifname}: the kernel reports no feature {err.args[0]!r}",
                              interface=ifname) from err
        except Exception as err:
            translated = _translate(err, ifname, "turning off " + ", ".join(wanted))
            if isinstance(translated, Unsupported):
                # SFEATURES answers a positive ETHTOOL_F_* (some bit was not changeable
                # or not honoured); pyroute2 reports that as "not supported". The caller
                # reads the features back and classifies what actually happened.
                log.debug("%s", translated, extra={"interface": ifname})
                return
            raise translated from err

    def close(self) -> None:
        if self._ioctl is not None:
            self._ioctl.close()
            self._ioctl = None

    def __enter__(self) -> Ethtool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
