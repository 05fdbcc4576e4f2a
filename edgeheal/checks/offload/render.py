"""The results of a pass, put into words: the problem a warning names, the /status view.

Why apart: the enforcer's warnings, the oneshot CLI's output and the check's detail must say
the same thing about the same result; each reads it from here, and none needs the enforcer.
"""

from __future__ import annotations

from typing import Any

from edgeheal.checks.offload.plan import InterfaceReport, Report


def problem_text(iface: InterfaceReport, feature: str, problem: str) -> str:
    if problem == "fixed-on":
        return (f"{iface.interface}: {feature} is on and fixed: this NIC's driver does not "
                "allow turning TX checksum offload off, so it cannot be switched to "
                "software checksums (use another NIC or driver for the tunnel's uplink)")
    if problem == "refused":
        return (f"{iface.interface}: asked the driver to turn {feature} off, but it still "
                "reads back on")
    return iface.message or f"{iface.interface}: {problem}"


def report_detail(report: Report) -> dict[str, Any]:
    """JSON-ready view of a pass for /status: {interface: {feature: outcome}}."""
    out: dict[str, Any] = {
        "interfaces": {i.interface: ({r.feature: r.outcome.value for r in i.results}
                                     | ({"error": i.message} if i.error else {}))
                       for i in report.interfaces}}
    if report.unmatched:
        out["unmatched"] = list(report.unmatched)
    return out
