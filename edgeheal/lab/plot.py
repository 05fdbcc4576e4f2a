"""A timeline picture of a lab run, as a self-contained SVG (no plotting library needed).

The picture tells the story a reader looks for, in order: the **fault** the lab injected,
the agent's **verdict** (the tunnel check leaving ok, the path verdict naming the culprit),
its **action** (a Flannel restart, or none), and the **recovery** — each a labelled vertical
marker, with the legend naming every colour. One panel per edge: the watched peer's
handshake age (line) and receive rate (bars), then a band per check coloured by its state,
a `/readyz` band and the alerts the subscriber received. The time axis runs to the end of
the report, which the runner extends past the last recovery (it keeps observing a few
seconds after the scenario ends), so the recovery is visible.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any

WIDTH, MARGIN, LEFT, RIGHT = 1100, 60, 120, 50
CHART_H, BAND, LANE = 150, 14, 14
CHAR_W = 6.2
"""Approximate width of one character at font-size 11 (sans-serif), for label layout."""
STATE_COLOURS = {"ok": "#3a9d5d", "degraded": "#e0a526", "unknown": "#9a9a9a",
                 "failed": "#d64545"}
MARKERS = {  # kind -> (colour, legend name)
    "fault": ("#7b2cbf", "fault injected"),
    "fault_end": ("#b39ddb", "fault lifted"),
    "verdict": ("#d64545", "verdict"),
    "action": ("#1f77b4", "action"),
    "recovery": ("#2e7d32", "recovery"),
}
ALERT_COLOUR, ALERT_NAME = "#d62790", "alert received"
MAX_LANES = 5
LABEL_CHARS = 64


@dataclass(frozen=True)
class Marker:
    t: float
    kind: str
    label: str
    title: str


def markers(report: dict[str, Any], edge: str) -> list[Marker]:
    """The story's markers for one edge, from the report's timeline."""
    out: list[Marker] = []
    faulted = False
    bad: set[str] = set()
    for entry in report.get("timeline") or []:
        if entry.get("edge") not in ("", edge):
            continue
        t, what = float(entry["t"]), str(entry["what"])
        detail = entry.get("detail") or {}
        source = entry["source"]
        if source == "lab":
            kind = detail.get("marker") or ("fault" if what.startswith(("fault", "flap"))
                                            else "")
            if kind in MARKERS:
                faulted = faulted or kind == "fault"
                out.append(Marker(t, kind, _short(what.removeprefix("fault: ")), what))
        elif source == "api" and what.startswith("pod "):
            out.append(Marker(t, "action", _short("Flannel restart: " + what), what))
        elif source == "agent" and faulted:
            check, state = detail.get("check"), detail.get("state")
            if check == "wireguard" and state in ("failed", "degraded"):
                bad.add(check)
                out.append(Marker(t, "verdict", f"wireguard {state} ({detail.get('reason')})",
                                  what))
            elif check == "wireguard" and state == "ok" and check in bad:
                bad.discard(check)
                out.append(Marker(t, "recovery", "wireguard ok", what))
            elif detail.get("path") not in (None, "none", "unknown"):
                out.append(Marker(t, "verdict", f"path: {detail['path']}", what))
            elif detail.get("ready") is True and "_ready" in bad:
                bad.discard("_ready")
                out.append(Marker(t, "recovery", "ready", what))
            elif detail.get("ready") is False:
                bad.add("_ready")
            elif detail.get("action"):
                out.append(Marker(t, "action", _short(
                    f"{detail['action']}: {detail.get('result')}"), what))
    return out


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


def _lanes(items: list[Marker], x: Any, right: float) -> list[tuple[Marker, int, bool]]:
    """Place labels in lanes so none overlaps: (marker, lane, anchored at its end)."""
    ends: list[float] = []
    placed = []
    for m in sorted(items, key=lambda m: m.t):
        width = len(m.label) * CHAR_W + 8
        left = x(m.t)
        flip = left + width > right
        start, end = (left - width, left) if flip else (left, left + width)
        lane = next((i for i, e in enumerate(ends) if e < start), len(ends))
        if lane >= MAX_LANES:
            lane = min(range(len(ends)), key=lambda i: ends[i])
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = max(ends[lane], end)
        placed.append((m, lane, flip))
    return placed


def timeline_svg(report: dict[str, Any]) -> str:
    samples: dict[str, list[dict[str, Any]]] = report.get("samples") or {}
    timeline: list[dict[str, Any]] = report.get("timeline") or []
    end = max([float(e["t"]) for e in timeline]
              + [float(s["t"]) for rows in samples.values() for s in rows] + [1.0])
    edges = sorted(samples) or ["edge-0"]
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + plot_w * t / end

    panels: list[tuple[str, list[tuple[Marker, int, bool]], list[str]]] = []
    for edge in edges:
        placed = _lanes(markers(report, edge), x, LEFT + plot_w)
        checks = sorted({c for s in samples.get(edge, []) for c in (s.get("checks") or {})})
        panels.append((edge, placed, checks))
    heights = [24 + (1 + max([lane for _, lane, _ in p] + [-1])) * LANE + CHART_H + 8
               + (len(c) + 2) * BAND + 16 for _, p, c in panels]
    height = MARGIN + sum(heights) + 70
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="22" font-size="15" font-weight="bold">edgeheal lab: '
           f'{escape(str(report.get("scenario")))}'
           f'{" (--field)" if report.get("field") else ""} — '
           f'{"passed" if report.get("passed") else "FAILED"}</text>',
           f'<text x="{MARGIN}" y="40" fill="#555">{escape(str(report.get("summary", "")))}'
           f' (WireGuard keepalive {report.get("keepalive", 5)} s)</text>']
    top = MARGIN
    for (edge, placed, checks), panel_h in zip(panels, heights, strict=True):
        out += _panel(edge, placed, checks, rows=samples.get(edge, []), timeline=timeline,
                      top=top, x=x, end=end, plot_w=plot_w)
        top += panel_h
    axis_y = top + 4
    step = next((st for st in (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600) if end / st <= 12),
                1200)
    for i in range(int(end // step) + 1):
        t = i * step
        out.append(f'<text x="{x(t):.1f}" y="{axis_y}" text-anchor="middle">{t:.0f}s</text>')
    out += _legend(axis_y + 22)
    out.append("</svg>")
    return "\n".join(out)


def _panel(edge: str, placed: list[tuple[Marker, int, bool]], checks: list[str], *,
           rows: list[dict[str, Any]], timeline: list[dict[str, Any]], top: float, x: Any,
           end: float, plot_w: float) -> list[str]:
    out = [f'<text x="{MARGIN}" y="{top + 8}" font-weight="bold">{escape(edge)}</text>']
    lanes = 1 + max([lane for _, lane, _ in placed] + [-1])
    chart_top = top + 24 + lanes * LANE
    chart_h = CHART_H
    ages = [(s["t"], _watched(s, "handshake_age_seconds")) for s in rows]
    max_age = max([a for _, a in ages if a is not None] + [200.0])
    out.append(f'<rect x="{LEFT}" y="{chart_top}" width="{plot_w}" height="{chart_h}" '
               'fill="none" stroke="#ccc"/>')
    for mark in (120, 180):  # REKEY_AFTER_TIME, REJECT_AFTER_TIME
        y = chart_top + chart_h * (1 - mark / max_age)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#bbb" stroke-dasharray="4 3"/><text x="{LEFT + plot_w + 3}" '
                   f'y="{y + 4:.1f}" fill="#888">{mark}s</text>')
    rates = []
    prev: tuple[float, float] | None = None
    for t, value in ((s["t"], _watched(s, "rx_bytes")) for s in rows):
        if value is not None and prev is not None and t > prev[0]:
            rates.append((t, max(0.0, (value - prev[1]) / (t - prev[0]))))
        prev = (t, value) if value is not None else prev
    top_rate = max([r for _, r in rates] + [1.0])
    for t, rate in rates:
        h = (chart_h / 3) * rate / top_rate
        out.append(f'<rect x="{x(t) - 1:.1f}" y="{chart_top + chart_h - h:.1f}" width="2" '
                   f'height="{h:.1f}" fill="#9ecae1"/>')
    points = " ".join(f"{x(t):.1f},{chart_top + chart_h * (1 - a / max_age):.1f}"
                      for t, a in ages if a is not None)
    if points:
        out.append(f'<polyline points="{points}" fill="none" stroke="#222" '
                   'stroke-width="1.5"/>')
    out.append(f'<text x="{LEFT + 4}" y="{chart_top + 12}" fill="#222">— watched peer\'s '
               f'handshake age (0 to {max_age:.0f} s)</text><text x="{LEFT + 4}" '
               f'y="{chart_top + 24}" fill="#3182bd">▮ bytes received per second</text>')
    # the bands: one per check, /readyz, then the alerts received
    band_top = chart_top + chart_h + 8
    bands: list[tuple[str, Callable[[dict[str, Any]], str | None]]] = [
        (c, functools.partial(_check_state, c)) for c in checks]
    bands.append(("/readyz", _ready_state))
    for i, (name, state_of) in enumerate(bands):
        y = band_top + i * BAND
        out.append(f'<text x="{LEFT - 4}" y="{y + 9}" text-anchor="end">{escape(name)}</text>')
        for a, b in itertools.pairwise([*rows, {"t": end}]):
            state = state_of(a)
            if state:
                out.append(f'<rect x="{x(a["t"]):.1f}" y="{y}" '
                           f'width="{max(0.5, x(b["t"]) - x(a["t"])):.1f}" height="10" '
                           f'fill="{STATE_COLOURS.get(state, "#eee")}"/>')
    alerts_y = band_top + len(bands) * BAND
    out.append(f'<text x="{LEFT - 4}" y="{alerts_y + 9}" text-anchor="end">alerts</text>')
    for entry in timeline:
        if entry["source"] == "alert" and entry.get("edge") in ("", edge):
            xx = x(float(entry["t"]))
            out.append(f'<path d="M{xx:.1f},{alerts_y} l4,10 l-8,0 z" fill="{ALERT_COLOUR}">'
                       f'<title>{escape(str(entry["t"]))}s alert: {escape(entry["what"])}'
                       '</title></path>')
    # the story's markers: a line through chart and bands, a label above the chart
    bottom = alerts_y + 10
    for m, lane, flip in placed:
        colour = MARKERS[m.kind][0]
        xx = x(m.t)
        ly = top + 24 + lane * LANE
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{ly - 10}" y2="{bottom}" '
                   f'stroke="{colour}" stroke-width="1.5" stroke-opacity="0.8">'
                   f'<title>{m.t:.1f}s {escape(m.title)}</title></line>')
        anchor, dx = ("end", -3) if flip else ("start", 3)
        out.append(f'<text x="{xx + dx:.1f}" y="{ly}" text-anchor="{anchor}" '
                   f'fill="{colour}">{escape(m.label)}</text>')
    return out


def _legend(y: float) -> list[str]:
    out = []
    xx = float(MARGIN)
    items = [(c, n, "line") for c, n in MARKERS.values()]
    items.append((ALERT_COLOUR, ALERT_NAME, "tri"))
    items += [(c, f"{s}", "box") for s, c in STATE_COLOURS.items()]
    out.append(f'<text x="{xx}" y="{y}" fill="#555">markers:</text>')
    xx += 62
    for i, (colour, name, shape) in enumerate(items):
        if i == len(MARKERS) + 1:
            out.append(f'<text x="{xx}" y="{y}" fill="#555">check states:</text>')
            xx += 90
        if shape == "line":
            out.append(f'<line x1="{xx}" x2="{xx}" y1="{y - 10}" y2="{y + 2}" '
                       f'stroke="{colour}" stroke-width="2"/>')
        elif shape == "tri":
            out.append(f'<path d="M{xx},{y - 9} l4,10 l-8,0 z" fill="{colour}"/>')
        else:
            out.append(f'<rect x="{xx - 4}" y="{y - 9}" width="10" height="10" '
                       f'fill="{colour}"/>')
        out.append(f'<text x="{xx + 8}" y="{y}">{escape(name)}</text>')
        xx += 8 + len(name) * CHAR_W + 14
    return out


def _check_state(check: str, sample: dict[str, Any]) -> str | None:
    state = (sample.get("checks") or {}).get(check)
    return None if state is None else str(state)


def _ready_state(sample: dict[str, Any]) -> str | None:
    if "ready" not in sample:
        return None
    return "ok" if sample["ready"] else "failed"


def _watched(sample: dict[str, Any], key: str) -> float | None:
    for peer in sample.get("peers") or []:
        if peer.get("watched") and peer.get(key) is not None:
            return float(peer[key])
    return None
