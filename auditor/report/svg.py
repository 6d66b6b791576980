"""Plain inline-SVG charts for the HTML pages: no library, no script, no network.

Every chart is a string of SVG with integer (or one-decimal) coordinates, so a week of a
100-GPU fleet stays small. Colours come from CSS classes `c-<category>` defined once in the
page's style sheet (`COLOURS`), so a shape carries no colour of its own. Labels go through
`html_text` wherever they appear, `<title>` tooltips included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from auditor.model import CATEGORIES
from auditor.report.text import html_text
from auditor.report.timeline import CardTimeline

COLOURS: dict[str, str] = {
    "busy": "#2e7d32",
    "unallocated": "#cfd8dc",
    "reserved_idle": "#c62828",
    "startup": "#ef6c00",
    "teardown": "#f9a825",
    "checkpoint": "#6a1b9a",
    "straggler_wait": "#1565c0",
    "compute_idle": "#80cbc4",
    "unobserved": "#9e9e9e",
}

LABELS: dict[str, str] = {c.value: c.value.replace("_", " ") for c in CATEGORIES}


def css() -> str:
    """The style rules the charts rely on."""
    rules = [f".c-{k}{{fill:{v};background:{v}}}" for k, v in COLOURS.items()]
    rules.append(".o1{opacity:.2}.o2{opacity:.45}.o3{opacity:.7}")
    return "\n".join(rules)


def legend(categories: Sequence[str] = tuple(COLOURS)) -> str:
    items = "".join(
        f'<span class="key"><i class="c-{c}"></i>{html_text(LABELS.get(c, c))}</span>'
        for c in categories
    )
    return f'<div class="legend">{items}</div>'


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def stacked_bars(
    rows: Sequence[tuple[str, dict[str, float]]], *, width: int = 900, unit: str = "GPU-h"
) -> str:
    """One horizontal bar per row, segments per category, scaled to the largest row."""
    label_w, bar_h, gap = 170, 22, 8
    top = max((sum(v.values()) for _, v in rows), default=0.0) or 1.0
    scale = (width - label_w - 90) / top
    h = len(rows) * (bar_h + gap) + gap
    parts = [f'<svg class="chart" width="{width}" height="{h}" viewBox="0 0 {width} {h}">']
    for i, (label, values) in enumerate(rows):
        y = gap + i * (bar_h + gap)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{html_text(label)}</text>'
        )
        x = float(label_w)
        for cat in COLOURS:
            v = values.get(cat, 0.0)
            w = v * scale
            if w < 0.05:
                continue
            title = f"{label}: {LABELS[cat]} {v:,.1f} {unit}"
            parts.append(
                f'<rect class="c-{cat}" x="{_fmt(x)}" y="{y}" width="{_fmt(w)}" height="{bar_h}">'
                f"<title>{html_text(title)}</title></rect>"
            )
            x += w
        total = sum(values.values())
        parts.append(f'<text x="{_fmt(x + 6)}" y="{y + 15}">{total:,.0f} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(values: Sequence[float], *, width: int = 440, bins: int = 10) -> str:
    """Count of cards per utilisation decile (0-10 %, ..., 90-100 %)."""
    counts, _ = np.histogram(
        np.clip(np.asarray(values, dtype=float), 0, 100), bins=bins, range=(0, 100)
    )
    h, base, left = 180, 150, 30
    bw = (width - left - 10) / bins
    top = max(int(counts.max()) if counts.size else 0, 1)
    parts = [f'<svg class="chart" width="{width}" height="{h}" viewBox="0 0 {width} {h}">']
    for i, n in enumerate(counts):
        bh = 130 * int(n) / top
        x = left + i * bw
        parts.append(
            f'<rect class="c-busy" x="{_fmt(x + 1)}" y="{_fmt(base - bh)}" width="{_fmt(bw - 2)}" '
            f'height="{_fmt(bh)}"><title>{i * 10}-{i * 10 + 10} %: {n} cards</title></rect>'
        )
        if n:
            parts.append(
                f'<text x="{_fmt(x + bw / 2)}" y="{_fmt(base - bh - 3)}" '
                f'text-anchor="middle">{n}</text>'
            )
        parts.append(f'<text x="{_fmt(x)}" y="{base + 14}" text-anchor="middle">{i * 10}</text>')
    parts.append(
        f'<text x="{_fmt(left + bins * bw)}" y="{base + 14}" text-anchor="middle">100</text>'
    )
    parts.append(f'<text x="{width - 10}" y="{h - 2}" text-anchor="end">utilisation %</text></svg>')
    return "".join(parts)


def whiskers(rows: Sequence[tuple[str, float, float, float]], *, width: int = 440) -> str:
    """Per group, the p10-p90 range of card utilisation with the median marked."""
    label_w, row_h = 150, 20
    span = width - label_w - 20
    h = len(rows) * row_h + 24
    parts = [f'<svg class="chart" width="{width}" height="{h}" viewBox="0 0 {width} {h}">']
    for i, (label, p10, p50, p90) in enumerate(rows):
        y = 10 + i * row_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 5}" text-anchor="end">{html_text(label)}</text>'
        )
        if np.isnan(p50):
            continue
        x0, x1, xm = (label_w + span * v / 100 for v in (p10, p90, p50))
        parts.append(
            f'<line class="range" x1="{_fmt(x0)}" x2="{_fmt(x1)}" y1="{y}" y2="{y}"/>'
            f'<circle class="c-busy" cx="{_fmt(xm)}" cy="{y}" r="4"><title>{html_text(label)}: '
            f"p10 {p10:.0f} %, p50 {p50:.0f} %, p90 {p90:.0f} %</title></circle>"
        )
    for v in (0, 50, 100):
        parts.append(
            f'<text x="{_fmt(label_w + span * v / 100)}" y="{h - 2}" '
            f'text-anchor="middle">{v}%</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


STEPS_S = (300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800)


def time_axis(lo_ms: int, hi_ms: int, *, width: int = 900) -> str:
    """Ticks under the strips at round UTC times, at most about ten of them."""
    from datetime import UTC, datetime

    span = max(hi_ms - lo_ms, 1)
    step = next((s for s in STEPS_S if span / (s * 1000) <= 10), STEPS_S[-1]) * 1000
    first = -(-lo_ms // step) * step
    # a window of more than a day names the day at every tick, else ticks repeat each day
    fmt = "%m-%d" if step >= 86_400_000 else "%m-%d %H:%M" if span > 86_400_000 else "%H:%M"
    parts = [f'<svg class="axis" width="{width}" height="18" viewBox="0 0 {width} 18">']
    for t in range(first, hi_ms + 1, step):
        x = width * (t - lo_ms) / span
        label = datetime.fromtimestamp(t / 1000, UTC).strftime(fmt)
        anchor = "start" if x < 20 else "end" if x > width - 20 else "middle"
        parts.append(
            f'<line x1="{_fmt(x)}" x2="{_fmt(x)}" y1="0" y2="4" stroke="#666"/>'
            f'<text x="{_fmt(x)}" y="15" text-anchor="{anchor}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


SHADE_LEVELS = (0.05, 0.25, 0.5)
"""A time slot is shaded when its biggest non-busy category holds at least 5 % of it; more
strongly from 25 % and from 50 % (CSS classes o1, o2, o3)."""


def card_strip(t: CardTimeline, *, width: int = 900, height: int = 46) -> str:
    """A card over time: each bucket's biggest idle category as a band (the stronger the
    bigger its share, `SHADE_LEVELS`), utilisation on top.

    Drawn in bucket units (x = bucket index, y = 100 - utilisation) and stretched to
    `width` x `height`, so every coordinate is a small integer: one path per category for
    the bands, one path for the line, broken where no sample covers a bucket."""
    n = len(t.util)
    names, share = t.dominant_share()
    level = np.searchsorted(np.array(SHADE_LEVELS), share, side="right")
    dom = [f"{c} o{k}" if c and k else "" for c, k in zip(names, level, strict=True)]
    runs: dict[str, list[str]] = {}
    start = 0
    for i in range(1, n + 1):
        if i == n or dom[i] != dom[start]:
            if dom[start]:
                runs.setdefault(dom[start], []).append(f"M{start} 0h{i - start}v100h-{i - start}z")
            start = i
    parts = [
        f'<svg class="strip" width="{width}" height="{height}" viewBox="0 0 {n} 100" '
        'preserveAspectRatio="none">'
    ]
    parts += [f'<path class="c-{c}" d="{"".join(d)}"/>' for c, d in runs.items()]
    line: list[str] = []
    pen_up = True
    for i, u in enumerate(t.util):
        if np.isnan(u):
            pen_up = True
            continue
        y = round(100 - float(u))
        line.append(f"M{i} {y}" if pen_up else f"{i} {y}")
        pen_up = False
    if line:
        # Pairs after a moveto are linetos in SVG: "M0 5 1 6 2 4" is a line of three points.
        parts.append(f'<path class="util" d="{" ".join(line).replace(" M", "M")}"/>')
    parts.append("</svg>")
    return "".join(parts)
