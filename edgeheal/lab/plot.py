"""A timeline picture of a lab run, as a self-contained SVG (no plotting library needed).

One panel per edge: the watched peer's handshake age (line) and receive rate (bars) over
time, a band per check coloured by its state, and vertical markers for the lab's faults,
the agent's actions and the alerts the subscriber received.
"""

from __future__ import annotations

import itertools
from html import escape
from typing import Any

WIDTH, PANEL, MARGIN, LEFT = 1000, 260, 60, 110
COLOURS = {"ok": "#3a9d5d", "degraded": "#e0a526", "unknown": "#9a9a9a", "failed": "#d64545"}
SOURCES = {"lab": "#5b3fd1", "api": "#1f77b4", "alert": "#d62790"}


def timeline_svg(report: dict[str, Any]) -> str:
    samples: dict[str, list[dict[str, Any]]] = report.get("samples") or {}
    timeline: list[dict[str, Any]] = report.get("timeline") or []
    end = max([float(e["t"]) for e in timeline] + [1.0])
    edges = sorted(samples) or ["edge-0"]
    height = MARGIN + len(edges) * (PANEL + 30) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="22" font-size="15" font-weight="bold">edgeheal lab: '
           f'{escape(str(report.get("scenario")))} — '
           f'{"passed" if report.get("passed") else "FAILED"}</text>',
           f'<text x="{MARGIN}" y="40" fill="#555">{escape(str(report.get("summary", "")))}'
           '</text>']
    plot_w = WIDTH - LEFT - MARGIN

    def x(t: float) -> float:
        return LEFT + plot_w * t / end

    for row, edge in enumerate(edges):
        top = MARGIN + row * (PANEL + 30)
        out.append(f'<text x="{MARGIN}" y="{top + 8}" font-weight="bold">'
                   f'{escape(edge)}</text>')
        rows = samples.get(edge, [])
        ages = [(s["t"], _watched(s, "handshake_age_seconds")) for s in rows]
        max_age = max([a for _, a in ages if a is not None] + [200.0])
        chart_top, chart_h = top + 18, PANEL - 90
        out.append(f'<rect x="{LEFT}" y="{chart_top}" width="{plot_w}" height="{chart_h}" '
                   'fill="none" stroke="#ccc"/>')
        for mark in (120, 180):  # REKEY_AFTER_TIME, REJECT_AFTER_TIME
            if mark <= max_age:
                y = chart_top + chart_h * (1 - mark / max_age)
                out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" '
                           f'y2="{y:.1f}" stroke="#bbb" stroke-dasharray="4 3"/>'
                           f'<text x="{LEFT + plot_w + 3}" y="{y + 4:.1f}" fill="#888">'
                           f'{mark}s</text>')
        rx = [(s["t"], _watched(s, "rx_bytes")) for s in rows]
        prev: tuple[float, float] | None = None
        rates = []
        for t, value in rx:
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
        out.append(f'<text x="{LEFT + 4}" y="{chart_top + 12}" fill="#222">handshake age '
                   f'(max {max_age:.0f}s)</text><text x="{LEFT + 4}" '
                   f'y="{chart_top + 24}" fill="#3182bd">rx bytes/s (bars)</text>')
        checks = sorted({c for s in rows for c in (s.get("checks") or {})})
        for i, check in enumerate(checks):
            y = chart_top + chart_h + 8 + i * 14
            out.append(f'<text x="{LEFT - 4}" y="{y + 9}" text-anchor="end">'
                       f'{escape(check)}</text>')
            for a, b in itertools.pairwise(rows):
                state = (a.get("checks") or {}).get(check)
                if state:
                    out.append(f'<rect x="{x(a["t"]):.1f}" y="{y}" '
                               f'width="{max(0.5, x(b["t"]) - x(a["t"])):.1f}" height="10" '
                               f'fill="{COLOURS.get(state, "#eee")}"/>')
        for entry in timeline:
            if entry["source"] not in SOURCES or entry.get("edge") not in ("", edge):
                continue
            xx = x(float(entry["t"]))
            colour = SOURCES[entry["source"]]
            out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{chart_top}" '
                       f'y2="{chart_top + chart_h}" stroke="{colour}" stroke-opacity="0.6">'
                       f'<title>{escape(str(entry["t"]))}s {escape(entry["source"])}: '
                       f'{escape(entry["what"])}</title></line>')
    axis_y = height - 30
    for i in range(11):
        t = end * i / 10
        out.append(f'<text x="{x(t):.1f}" y="{axis_y}" text-anchor="middle">{t:.0f}s</text>')
    legend = "  ".join(f"{k}: {v}" for k, v in SOURCES.items())
    out.append(f'<text x="{MARGIN}" y="{height - 10}" fill="#555">markers — {legend}; '
               'state bands: green ok, amber degraded, grey unknown, red failed</text>')
    out.append("</svg>")
    return "\n".join(out)


def _watched(sample: dict[str, Any], key: str) -> float | None:
    for peer in sample.get("peers") or []:
        if peer.get("watched") and peer.get(key) is not None:
            return float(peer[key])
    return None
