"""Charts the console draws as inline SVG on the server: stacked bars per day, a curve, a link graph.

No script and no library: the pages stay static, fast and within the console's strict
Content-Security-Policy.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Sequence

from bot.web.html import h

PALETTE = ("#3a5bd9", "#2e9e6a", "#d98e04", "#b42318", "#7a5af8", "#667085")


def _day_label(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, timezone.utc).strftime("%b %d")


def stacked_bars(series: dict[str, list[int]], first_day: int, *, title: str, width: int = 1000,
                 height: int = 220) -> str:
    """Counts per day, one colour per series, stacked; a legend and a few day labels."""
    days = max((len(v) for v in series.values()), default=0)
    if days == 0 or not any(any(v) for v in series.values()):
        return f'<p class="muted">{h(title)}: nothing in this period.</p>'
    totals = [sum(v[i] for v in series.values()) for i in range(days)]
    top = max(totals) or 1
    left, plot_h = 40, height - 44
    bar_w = (width - left - 10) / days
    parts = [f'<svg role="img" aria-label="{h(title)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    for fraction in (0, 0.5, 1):
        y = 10 + plot_h * (1 - fraction)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eef1f6"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#667085">'
                     f'{round(top * fraction)}</text>')
    for i in range(days):
        y = 10 + plot_h
        for colour, (name, values) in zip(PALETTE, series.items(), strict=False):
            if values[i]:
                bar = plot_h * values[i] / top
                y -= bar
                parts.append(f'<rect x="{left + i * bar_w + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                             f'height="{bar:.1f}" fill="{colour}"><title>{h(_day_label(first_day + i))}: '
                             f'{values[i]} {h(name)}</title></rect>')
    for i in range(0, days, max(1, days // 6)):
        parts.append(f'<text x="{left + i * bar_w:.1f}" y="{height - 6}" font-size="11" fill="#667085">'
                     f'{h(_day_label(first_day + i))}</text>')
    x = left
    for colour, name in zip(PALETTE, series, strict=False):
        parts.append(f'<rect x="{x}" y="0" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="9" font-size="11">{h(name)}</text>')
        x += 24 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def curve(points: Sequence[tuple[float, float]], *, title: str, x_label: str, width: int = 480, height: int = 180,
          mark: float | None = None) -> str:
    """y in [0, 1] over x (days): the retention curve; `mark` draws a vertical line (today)."""
    if not points:
        return ""
    left, plot_w, plot_h = 36, width - 46, height - 36
    x_max = max(x for x, _ in points) or 1

    def at(x: float, y: float) -> str:
        return f"{left + plot_w * x / x_max:.1f},{10 + plot_h * (1 - max(0.0, min(1.0, y))):.1f}"
    path = " ".join(at(x, y) for x, y in points)
    parts = [f'<svg role="img" aria-label="{h(title)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<polyline fill="none" stroke="#3a5bd9" stroke-width="2" points="{path}"/>']
    for y in (0, 0.5, 1):
        parts.append(f'<text x="{left - 6}" y="{10 + plot_h * (1 - y) + 4:.1f}" font-size="11" text-anchor="end" '
                     f'fill="#667085">{y:g}</text>')
    if mark is not None and 0 <= mark <= x_max:
        x = left + plot_w * mark / x_max
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="10" y2="{10 + plot_h}" stroke="#d98e04" stroke-dasharray="4 3"/>'
                     f'<text x="{x + 4:.1f}" y="20" font-size="11" fill="#d98e04">now</text>')
    parts.append(f'<text x="{left}" y="{height - 4}" font-size="11" fill="#667085">{h(x_label)}</text></svg>')
    return "".join(parts)


def link_graph(center: int, others: Sequence[tuple[int, str, bool, str]], *, size: int = 360) -> str:
    """The memory in the middle and the memories it is linked to around it: (id, kind, outgoing, text)."""
    if not others:
        return '<p class="muted">No links.</p>'
    mid = size / 2
    radius = size / 2 - 46
    kinds = sorted({kind for _, kind, _, _ in others})
    colour = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(kinds)}
    parts = [f'<svg role="img" aria-label="links of memory {center}" width="{size}" height="{size + 20}" '
             f'viewBox="0 0 {size} {size + 20}">']
    nodes = []
    for i, (other, kind, outgoing, text) in enumerate(others):
        angle = 2 * math.pi * i / len(others) - math.pi / 2
        x, y = mid + radius * math.cos(angle), mid + radius * math.sin(angle)
        arrow = "→" if outgoing else "←"
        parts.append(f'<line x1="{mid}" y1="{mid}" x2="{x:.1f}" y2="{y:.1f}" stroke="{colour[kind]}" stroke-width="2">'
                     f'<title>{h(kind)} {arrow}</title></line>')
        nodes.append(f'<a href="/memories/{other}"><circle cx="{x:.1f}" cy="{y:.1f}" r="16" fill="#fff" '
                     f'stroke="{colour[kind]}" stroke-width="2"><title>#{other} ({h(kind)}): {h(text[:120])}</title>'
                     f'</circle><text x="{x:.1f}" y="{y + 4:.1f}" font-size="10" text-anchor="middle">{other}</text></a>')
    parts += nodes
    parts.append(f'<circle cx="{mid}" cy="{mid}" r="20" fill="#1d2330"/><text x="{mid}" y="{mid + 4}" font-size="11" '
                 f'text-anchor="middle" fill="#fff">{center}</text>')
    x = 4
    for kind in kinds:
        parts.append(f'<rect x="{x}" y="{size + 6}" width="10" height="10" fill="{colour[kind]}"/>'
                     f'<text x="{x + 14}" y="{size + 15}" font-size="11">{h(kind)}</text>')
        x += 24 + 7 * len(kind)
    parts.append("</svg>")
    return "".join(parts)


def histogram(buckets: list[tuple[str, int]], *, title: str, width: int = 640, height: int = 200) -> str:
    """Counts per bucket (a latency histogram), one labelled bar each."""
    if not buckets or not any(count for _, count in buckets):
        return f'<p class="muted">{h(title)}: nothing yet.</p>'
    top = max(count for _, count in buckets) or 1
    left, plot_h = 10, height - 40
    bar_w = (width - 2 * left) / len(buckets)
    parts = [f'<svg role="img" aria-label="{h(title)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    for i, (label, count) in enumerate(buckets):
        bar = plot_h * count / top
        x = left + i * bar_w
        parts.append(f'<rect x="{x + 2:.1f}" y="{10 + plot_h - bar:.1f}" width="{max(bar_w - 4, 1):.1f}" height="{bar:.1f}" '
                     f'fill="{PALETTE[0]}"><title>{h(label)}: {count}</title></rect>'
                     f'<text x="{x + bar_w / 2:.1f}" y="{height - 14}" font-size="10" text-anchor="middle" '
                     f'fill="#667085">{h(label)}</text>'
                     f'<text x="{x + bar_w / 2:.1f}" y="{8 + plot_h - bar:.1f}" font-size="10" text-anchor="middle">'
                     f'{count if count else ""}</text>')
    parts.append("</svg>")
    return "".join(parts)
