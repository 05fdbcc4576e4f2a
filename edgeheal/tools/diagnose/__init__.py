"""``edgeheal diagnose``: the incident engineers' tcpdump + ``wg show`` + ``ethtool -k`` in one.

In the field incident it took tcpdump on both ends, ``wg show``, ``ethtool -k`` and hours to
see that rekey packets left the edge with bad checksums and were dropped at the cloud. This
package collects that evidence on the edge node in one pass and names the likely cause. One
module per job, so each can be tested on its own:

* :mod:`~edgeheal.tools.diagnose.wire`: each captured datagram -> a WireGuard message type and a
  direction, counted per peer endpoint (pure);
* :mod:`~edgeheal.tools.diagnose.capture`: N seconds of the tunnel's UDP on the uplink (scapy,
  imported only there, and a BPF filter built here);
* :mod:`~edgeheal.tools.diagnose.evidence`: the devices, the uplink, its offload, the kernel's UDP
  counters around the capture, joined into one frozen :class:`CaptureEvidence`;
* :mod:`~edgeheal.tools.diagnose.report`: the verdict, a pure function of the evidence, and its
  text and JSON forms.

:func:`diagnose` runs them in that order. Errors: :class:`DiagnoseError` for what the
operator must fix (exit 2), :class:`EnvironmentProblem` / :class:`CaptureUnavailable` for
what the host lacks (exit 3); see :mod:`~edgeheal.tools.diagnose.errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeheal.tools.diagnose.capture import (
    attach_filter,
    bpf_program,
    has_cap_net_raw,
    require_capture,
)
from edgeheal.tools.diagnose.errors import CaptureUnavailable, DiagnoseError, EnvironmentProblem
from edgeheal.tools.diagnose.evidence import (
    MAX_SECONDS,
    CaptureEvidence,
    PeerEvidence,
    UdpCounters,
    build_evidence,
    choose_uplink,
    default_seconds,
    gather,
    link_down,
    parse_snmp,
    read_udp_counters,
)
from edgeheal.tools.diagnose.report import (
    Code,
    PeerFinding,
    Verdict,
    judge,
    judge_peer,
    render,
    to_json,
)
from edgeheal.tools.diagnose.wire import Direction, MessageType, Tally, classify, direction


async def diagnose(config: Any, *, interface: str | None = None,
                   seconds: float | None = None,
                   capture_fn: Callable[..., Tally] | None = None,
                   ) -> tuple[CaptureEvidence, Verdict]:
    """Gather the evidence (blocking capture in a worker thread) and judge it."""
    evidence = await gather(config, interface=interface, seconds=seconds,
                            capture_fn=capture_fn)
    return evidence, judge(evidence)


__all__ = [
    "MAX_SECONDS",
    "CaptureEvidence",
    "CaptureUnavailable",
    "Code",
    "DiagnoseError",
    "Direction",
    "EnvironmentProblem",
    "MessageType",
    "PeerEvidence",
    "PeerFinding",
    "Tally",
    "UdpCounters",
    "Verdict",
    "attach_filter",
    "bpf_program",
    "build_evidence",
    "choose_uplink",
    "classify",
    "default_seconds",
    "diagnose",
    "direction",
    "gather",
    "has_cap_net_raw",
    "judge",
    "judge_peer",
    "link_down",
    "parse_snmp",
    "read_udp_counters",
    "render",
    "require_capture",
    "to_json",
]
