"""Self-contained HTML pages: the fleet report and the explain chart of one job or pod.

One file each, to open from an e-mail: inline CSS and SVG (`auditor.report.svg`), no script,
no font or image from the network. The report shows the fleet summary, stacked bars of the
categories per group, the per-card utilisation distribution, the top offenders with their
next steps, and the timelines of the offending jobs (linked from the offenders table).
Every name goes through `html_text` (`auditor.report.text`): control and bidi characters
become visible escapes, then `html.escape` makes it safe in text and quoted attributes.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pandas as pd

from auditor.classify.whatif import WhatIf
from auditor.model import CATEGORIES
from auditor.report.explain import Explanation, duration, grouped_findings, when
from auditor.report.render import (
    Report,
    cause_lines,
    group_keys,
    held_busy,
    no_signal_notes,
    notes,
    util_text,
)
from auditor.report.svg import (
    COLOURS,
    LABELS,
    card_strip,
    css,
    histogram,
    legend,
    stacked_bars,
    time_axis,
    whiskers,
)
from auditor.report.text import html_text
from auditor.report.whatif import whatif_section

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;
max-width:1000px}h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
.muted{color:#666}.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.tile b{display:block;font-size:20px}table{border-collapse:collapse;margin:6px 0;
display:block;max-width:100%;overflow-x:auto}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{white-space:nowrap}td.n,th.n{text-align:right}.legend{margin:6px 0}
.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
svg text{font-size:12px;fill:#333}.range{stroke:#999;stroke-width:6;stroke-linecap:round}
.util{fill:none;stroke:#111;stroke-width:1.2;vector-effect:non-scaling-stroke}
.strip{display:block;border:1px solid #ccc;background:#fff}.card{margin:8px 0 2px}
td.t{white-space:nowrap}.axis{display:block}.tl{margin-bottom:24px}
"""


MAX_BARS = 30
"""Bars drawn per chart; groups beyond the 29 biggest are summed into one bar."""
REPORT_CARDS = 8
"""Cards per job drawn in the report (all of them in `auditor explain --html`)."""


def slug(text: str) -> str:
    """An anchor id for a job or pod name."""
    return "t-" + re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-").lower()


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html_text(title)}</title><style>{STYLE}{css()}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _tile(label: str, value: str) -> str:
    return f'<div class="tile"><b>{html_text(value)}</b>{html_text(label)}</div>'


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def _summary(report: Report) -> str:
    t = report.totals
    alloc = t["allocated_gpu_hours"]
    tiles = [
        _tile("GPU-hours of capacity", f"{t['capacity_gpu_hours']:,.0f}"),
        _tile("GPU-hours held by pods", f"{alloc:,.0f}"),
        _tile("busy (of held)", _share(held_busy(t), alloc)),
        _tile("scheduling waste (of held)", _share(t["scheduling_waste_gpu_hours"], alloc)),
        _tile("compute idle (of held)", _share(t["compute_idle_gpu_hours"], alloc)),
        _tile("GPU-hours unallocated", f"{t['unallocated_gpu_hours']:,.0f}"),
        _tile("held time on inferred GPU→pod mapping", f"{t['inferred_share']:.0%}"),
    ]
    flag = "".join(f"<p class='muted'>{html_text(n)}</p>" for n in notes(report))
    return f'<div class="tiles">{"".join(tiles)}</div>{flag}'


def _label(rec: Mapping[Hashable, Any], keys: Sequence[str]) -> str:
    return " / ".join(str(rec[k]) for k in keys if rec.get(k) is not None and not pd.isna(rec[k]))


def _groups(report: Report) -> str:
    keys = group_keys(report.rows)
    recs = report.rows.to_dict("records")
    bars = [
        (_label(r, keys), {c.value: float(r[f"{c.value}_gpu_hours"]) for c in CATEGORIES})
        for r in recs
    ]
    if len(bars) > MAX_BARS:  # the table below keeps every row
        rest = bars[MAX_BARS - 1 :]
        other = {c.value: sum(v.get(c.value, 0.0) for _, v in rest) for c in CATEGORIES}
        bars = [*bars[: MAX_BARS - 1], (f"{len(rest)} others", other)]
    head = "".join(f"<th>{html_text(k)}</th>" for k in keys)
    head += '<th class="n">held GPU-h</th><th class="n">busy</th><th class="n">sched. waste</th>'
    util_head = "util" if "util_pct" in report.rows.columns else "util p10/p50/p90"
    head += f'<th class="n">compute idle</th><th class="n">{util_head}</th>'
    has_sm = "sm_active_gpu_hours" in report.rows.columns
    has_out = "outputs" in report.rows.columns
    if has_sm:
        head += '<th class="n">SM active GPU-h</th><th class="n">busy with SM data</th>'
    if has_out:
        head += '<th class="n">outputs</th><th class="n">GPU-h per 1k outputs</th>'
        head += '<th class="n">busy GPU-h per 1k outputs</th>'
    body = []
    for r in recs:
        util = util_text(r)
        cells = "".join(f"<td>{html_text(str(r[k]))}</td>" for k in keys)
        cells += f'<td class="n">{r["allocated_gpu_hours"]:,.1f}</td>'
        for share in ("busy_share", "scheduling_waste_share", "compute_idle_share"):
            cells += f'<td class="n">{"-" if pd.isna(r[share]) else f"{r[share]:.0%}"}</td>'
        cells += f"<td class='n'>{util}</td>"
        if has_sm:
            share = r["sm_data_share"]
            cells += f'<td class="n">{r["sm_active_gpu_hours"]:,.1f}</td>'
            cells += f'<td class="n">{"-" if pd.isna(share) else f"{share:.0%}"}</td>'
        if has_out:
            out = r["outputs"]
            unit = html_text(str(r["output_unit"])) if not pd.isna(out) else ""
            cells += f'<td class="n">{"-" if pd.isna(out) else f"{out:,.0f}"} {unit}</td>'
            for c in ("gpu_hours_per_1k_outputs", "busy_gpu_hours_per_1k_outputs"):
                cells += f'<td class="n">{"-" if pd.isna(r[c]) else f"{r[c]:,.3f}"}</td>'
        body.append(f"<tr>{cells}</tr>")
    return (
        f"<h2>GPU-hours by {html_text(report.by)}</h2>{legend()}{stacked_bars(bars)}"
        f"<table><tr>{head}</tr>{''.join(body)}</table>"
    )


def _distribution(report: Report, card_util: Sequence[float] | None) -> str:
    keys = group_keys(report.rows)
    rows = [
        (_label(r, keys), float(r["util_p10"]), float(r["util_p50"]), float(r["util_p90"]))
        for r in report.rows.to_dict("records")
        if not pd.isna(r["util_p50"])
    ][:MAX_BARS]
    more = f" ({len(rows)} biggest)" if len(report.rows) > MAX_BARS else ""
    hist = ""
    if card_util is not None and len(card_util):
        title = f"Cards per utilisation band ({len(card_util)} cards held by pods)"
        hist = f"<div><h3>{title}</h3>{histogram(card_util)}</div>"
    return (
        "<h2>Per-card utilisation</h2><div style='display:flex;gap:24px;flex-wrap:wrap'>"
        f"{hist}<div><h3>p10–p90 per {html_text(report.by)}, median dot{more}</h3>"
        f"{whiskers(rows)}</div></div>"
    )


def _causes(report: Report) -> str:
    """Why held cards idled and free cards sat free: the fleet's causes (SPEC §10)."""
    lines = cause_lines(report)
    if not lines:
        return ""
    rows = "".join(
        f"<tr><td>{html_text(LABELS.get(cat, cat))}</td><td>{html_text(cause)}</td>"
        f'<td class="n">{hours:,.1f}</td><td class="n">{share:.0%}</td>'
        f"<td>{html_text(step)}</td></tr>"
        for cat, cause, hours, share, step in lines
    )
    notes = "".join(f"<p class='muted'>{html_text(n)}</p>" for n in no_signal_notes(report))
    return (
        "<h2>Why held cards idled and free cards sat free</h2><table><tr><th>category</th>"
        '<th>cause</th><th class="n">GPU-h</th><th class="n">share</th><th>first step</th></tr>'
        f"{rows}</table>{notes}"
    )


def _offenders(report: Report, linked: set[str]) -> str:
    if report.offenders.empty:
        return "<h2>Top offenders</h2><p>None.</p>"
    rows = []
    for r in report.offenders.to_dict("records"):
        who = html_text(str(r["offender"]))
        if str(r["offender"]) in linked:
            who = f'<a href="#{slug(str(r["offender"]))}">{who}</a>'
        cat = str(r["category"])
        rows.append(
            f'<tr><td><span class="key"><i class="c-{cat}"></i>'
            f"{html_text(LABELS.get(cat, cat))}</span></td>"
            f'<td>{who}</td><td class="n">{r["gpu_hours"]:,.1f}</td>'
            f'<td class="n">{r["share_of_category"]:.0%}</td>'
            f"<td>{html_text(str(r['next_step']))}</td></tr>"
        )
    return (
        "<h2>Top offenders and next steps</h2><table><tr><th>category</th><th>offender</th>"
        '<th class="n">GPU-h</th><th class="n">share</th><th>next step</th></tr>'
        f"{''.join(rows)}</table>"
    )


def _each(cards: int) -> str:
    return " each" if cards > 1 else "" if cards else " GPU-time"


def explain_section(ex: Explanation, *, width: int = 900, max_cards: int | None = None) -> str:
    """One job's or pod's cards over time, its findings and next steps (an HTML fragment)."""
    lo, hi = ex.window
    parts = [
        f'<div class="tl" id="{slug(ex.target)}"><h3>{html_text(ex.target)}</h3>'
        f'<p class="muted">{len(ex.cards)} card(s), {when(lo)} → {when(hi)} UTC '
        f"({duration((hi - lo) / 1000)}). Line: utilisation (0–100 %); shading: the biggest "
        "non-busy category of each time slot, stronger where it takes more of the slot.</p>",
        legend([k for k in COLOURS if k not in ("busy", "unallocated")]),
    ]
    for c in ex.cards[:max_cards]:  # None: all
        held = sum(c.totals.values()) or 1.0
        rank = "" if c.rank is None else f" rank {c.rank}"
        parts.append(
            f'<div class="card">{html_text(c.pod)}{rank} · {html_text(c.node)} · '
            f'<span class="muted">{html_text(c.timeline.gpu[:16])}</span> · busy '
            f"{c.totals.get('busy', 0.0) / held:.0%}</div>{card_strip(c.timeline, width=width)}"
        )
    parts.append(time_axis(lo, hi, width=width))
    if max_cards is not None and len(ex.cards) > max_cards:
        parts.append(
            f"<p class='muted'>… and {len(ex.cards) - max_cards} more cards: "
            f"<code>auditor explain {html_text(ex.target)}</code> shows them all.</p>"
        )
    f = grouped_findings(ex.findings)
    if len(f):
        rows = "".join(
            f"<tr><td>{html_text(str(r['kind']))}</td><td class='t'>{when(r['start_ms'])}</td>"
            f"<td class='t'>{when(r['end_ms'])}</td>"
            f"<td class='n'>{duration(float(r['seconds']))}{_each(int(r['cards']))}</td>"
            f"<td class='n'>{r['cards'] or ''}</td><td>{html_text(str(r['pods']))}</td>"
            f"<td>{html_text(str(r['detail']))}</td></tr>"
            for r in f.head(40).to_dict("records")
        )
        parts.append(
            "<table><tr><th>finding</th><th>from (UTC)</th><th>to</th><th class='n'>duration</th>"
            f"<th class='n'>cards</th><th>pods</th><th>detail</th></tr>{rows}</table>"
        )
    s = ex.findings[ex.findings["kind"] == "straggler"]
    for r in s.to_dict("records"):
        parts.append(
            f"<p>The others waited {duration(float(r['seconds']))} on {html_text(str(r['pod']))} "
            f"({html_text(str(r['node']))}, GPU {html_text(str(r['gpu'])[:16])}).</p>"
        )
    if ex.steps:
        items = "".join(
            f"<li><b>{html_text(LABELS.get(c, c))}</b>: {html_text(s)}</li>" for c, s in ex.steps
        )
        parts.append(f"<p>Next steps:</p><ul>{items}</ul>")
    parts.append("</div>")
    return "".join(parts)


def render_report_html(
    report: Report,
    *,
    card_util: Sequence[float] | None = None,
    timelines: Sequence[Explanation] = (),
    whatif: WhatIf | None = None,
) -> str:
    """The whole report as one HTML page (module docstring); with `whatif`, the idle
    policies replayed over the window side by side after the offenders."""
    window = f"{when(report.window[0])} → {when(report.window[1])} UTC"
    linked = {ex.target for ex in timelines}
    body = (
        f"<h1>GPU waste audit</h1><p class='muted'>{html_text(window)}</p>{_summary(report)}"
        f"{_groups(report)}{_distribution(report, card_util)}{_causes(report)}"
        f"{_offenders(report, linked)}"
    )
    if whatif is not None:
        body += whatif_section(whatif)
    if timelines:
        body += "<h2>Job timelines</h2>" + "".join(
            explain_section(ex, max_cards=REPORT_CARDS) for ex in timelines
        )
    return _page(f"GPU waste audit {window}", body)


def render_explain_html(ex: Explanation) -> str:
    """`auditor explain --html`: the explain chart of one job or pod as a page."""
    return _page(
        f"GPU timeline of {ex.target}",
        f"<h1>GPU timeline of {html_text(ex.target)}</h1>{explain_section(ex)}",
    )
