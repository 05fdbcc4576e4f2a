"""The lab's picture tells the story: labelled markers, a legend of names, the whole run."""

from __future__ import annotations

import re
from typing import Any
from xml.etree import ElementTree

from edgeheal.lab.plot import MARKERS, markers, timeline_svg


def _report() -> dict[str, Any]:
    def sample(t: float, wg: str, ready: bool) -> dict[str, Any]:
        return {"t": t, "wireguard": wg, "ready": ready, "checks": {"wireguard": wg},
                "peers": [{"watched": True, "handshake_age_seconds": t, "rx_bytes": t * 10}]}

    def agent(t: float, state: str, reason: str) -> dict[str, Any]:
        return {"t": t, "source": "agent", "edge": "edge-0", "what": f"wireguard: {state}",
                "detail": {"check": "wireguard", "state": state, "reason": reason}}

    timeline = [
        agent(2.0, "ok", "ok"),
        {"t": 10.0, "source": "lab", "edge": "edge-0", "what": "fault: the peer is gone"},
        agent(12.0, "failed", "stalled"),
        {"t": 14.0, "source": "api", "edge": "", "what": "pod kube-flannel/f-1 deleted"},
        {"t": 15.0, "source": "alert", "edge": "edge-0", "what": "warning x"},
        agent(20.0, "ok", "ok"),
    ]
    samples = [sample(t, "failed" if 12 <= t < 20 else "ok", not 12 <= t < 20)
               for t in range(31)]
    return {"scenario": "stuck-flannel", "summary": "s", "passed": True, "keepalive": 5,
            "timeline": timeline, "samples": {"edge-0": samples}}


def test_fault_verdict_action_and_recovery_are_labelled_markers() -> None:
    got = [(m.kind, m.label) for m in markers(_report(), "edge-0")]
    assert got == [("fault", "the peer is gone"), ("verdict", "wireguard failed (stalled)"),
                   ("action", "Flannel restart: pod kube-flannel/f-1 deleted"),
                   ("recovery", "wireguard ok")]
    svg = timeline_svg(_report())
    for label in ("the peer is gone", "wireguard failed (stalled)", "wireguard ok"):
        assert label in svg


def test_the_legend_names_every_colour_and_prints_no_colour_code() -> None:
    svg = timeline_svg(_report())
    texts = [t.text or "" for t in ElementTree.fromstring(svg).iter(  # noqa: S314 - ours
        "{http://www.w3.org/2000/svg}text")]
    for _, name in MARKERS.values():
        assert name in texts
    assert not [t for t in texts if re.search(r"#[0-9a-fA-F]{6}", t)]


def test_the_picture_runs_to_the_last_sample_and_draws_the_end_state() -> None:
    svg = timeline_svg(_report())
    assert ">30s<" in svg  # the axis reaches the last sample (t = 30), past the recovery
    ok = svg.count('fill="#3a9d5d"')
    assert ok >= 20  # the wireguard band is green again after the recovery, to the end
