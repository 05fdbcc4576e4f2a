"""The errors of ``edgeheal diagnose``, by what the operator must do about them.

:class:`DiagnoseError` is a bad argument or an uplink that cannot be found (the command
exits 2: fix the invocation). :class:`EnvironmentProblem` is the host lacking something
(exit 3: scapy, CAP_NET_RAW, a WireGuard device that cannot be read); a diagnosis that ran
and found a problem is not an error but a verdict.
"""

from __future__ import annotations


class DiagnoseError(Exception):
    """Diagnosis cannot run as asked; the message says what to fix."""


class EnvironmentProblem(DiagnoseError):
    """The host lacks something diagnose needs (exit 3): a privilege, a program, a daemon."""


class CaptureUnavailable(EnvironmentProblem):
    """scapy is not installed, or the process lacks CAP_NET_RAW."""


__all__ = ["CaptureUnavailable", "DiagnoseError", "EnvironmentProblem"]
