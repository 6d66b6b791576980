"""Renderers of `auditor whatif` (SPEC §9): policies side by side as a table, JSON, CSV, HTML.

Each policy's totals come first, then its teams (sorted). Numbers are rounded here, once, so
the same replay always gives the same bytes; names from the cluster are escaped as the report's
are (`auditor.report.text`).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pandas as pd

from auditor.classify.whatif import RELEASED, WhatIf
from auditor.report.render import HOURS_DECIMALS
from auditor.report.text import csv_cell, html_text, safe_lines, terminal_safe

STOPS_SHOWN = 25
"""Stopped pods listed per policy in the HTML section (the JSON lists them all)."""

SHORT = {
    "reserved_idle": "resv idle",
    "compute_idle": "comp idle",
    "teardown": "teardown",
    "startup": "startup",
    "checkpoint": "checkpt",
    "straggler_wait": "straggler",
}


def _value(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float):
        return round(v, HOURS_DECIMALS) + 0.0  # +0.0: never a "-0.0"
    return v


def table_rows(result: WhatIf) -> pd.DataFrame:
    """Per policy, its totals row then its team rows: what the CSV and the table show."""
    totals = result.totals()
    parts = []
    for i, policy in enumerate(result.policies):
        parts.append(totals.iloc[[i]])
        parts.append(result.rows[result.rows["policy"] == policy])
    return pd.concat(parts, ignore_index=True) if parts else totals


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): _value(v) for k, v in r.items()} for r in frame.to_dict("records")]


def _iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


def render_whatif_json(result: WhatIf) -> str:
    totals = _records(result.totals())
    out = {
        "window": {"start": _iso(result.window[0]), "end": _iso(result.window[1])},
        "policies": [
            {
                "policy": policy,
                "totals": {k: v for k, v in totals[i].items() if k not in ("policy", "team")},
                "teams": [
                    {k: v for k, v in r.items() if k != "policy"}
                    for r in _records(result.rows[result.rows["policy"] == policy])
                ],
                "stops": [
                    {**{k: v for k, v in r.items() if k != "policy"}, "stop": _iso(r["stop_ms"])}
                    for r in _records(result.stops[result.stops["policy"] == policy])
                ],
            }
            for i, policy in enumerate(result.policies)
        ],
    }
    return json.dumps(out, indent=2, ensure_ascii=True) + "\n"


def render_whatif_csv(result: WhatIf) -> str:
    frame = table_rows(result)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(list(frame.columns))
    for rec in _records(frame):
        writer.writerow([csv_cell(v) if isinstance(v, str) else v for v in rec.values()])
    return buf.getvalue()


def _h(v: float) -> str:
    return f"{v:,.1f}"


def render_whatif_table(result: WhatIf, *, width: int = 200) -> str:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(
        f"Idle policies replayed {_iso(result.window[0])} → {_iso(result.window[1])}: "
        "GPU-hours each would have released (never busy), and whom it would have hurt."
    )
    table = Table(title="GPU-hours by policy and team", title_justify="left")
    table.add_column("policy", no_wrap=True)
    table.add_column("team", no_wrap=True)
    for col in ("stopped", "false stops", "released"):
        table.add_column(col, justify="right")
    for c in RELEASED:
        table.add_column(SHORT[c.value], justify="right")
    for col in ("busy lost", "held idle", "longest spared (h)"):
        table.add_column(col, justify="right")
    for r in _records(table_rows(result)):
        table.add_row(
            Text(terminal_safe(str(r["policy"]))),
            Text(terminal_safe(str(r["team"]))),
            str(r["pods_stopped"]),
            str(r["false_stops"]),
            _h(r["released_gpu_hours"]),
            *(_h(r[f"released_{c.value}_gpu_hours"]) for c in RELEASED),
            _h(r["busy_lost_gpu_hours"]),
            _h(r["held_idle_gpu_hours"]),
            _h(r["longest_spared_idle_hours"]),
        )
    console.print(table)
    return safe_lines(buf.getvalue())


def whatif_section(result: WhatIf) -> str:
    """The HTML report's section: the policies side by side (an HTML fragment)."""
    head = (
        "<tr><th>policy</th><th>team</th><th class='n'>pods stopped</th>"
        "<th class='n'>false stops</th><th class='n'>released GPU-h</th>"
        + "".join(f"<th class='n'>{html_text(SHORT[c.value])}</th>" for c in RELEASED)
        + "<th class='n'>busy lost GPU-h</th><th class='n'>held idle GPU-h</th>"
        "<th class='n'>longest spared idle (h)</th></tr>"
    )
    body = []
    for r in _records(table_rows(result)):
        cells = f"<td>{html_text(str(r['policy']))}</td><td>{html_text(str(r['team']))}</td>"
        cells += f"<td class='n'>{r['pods_stopped']}</td><td class='n'>{r['false_stops']}</td>"
        cells += f"<td class='n'>{_h(r['released_gpu_hours'])}</td>"
        cells += "".join(
            f"<td class='n'>{_h(r[f'released_{c.value}_gpu_hours'])}</td>" for c in RELEASED
        )
        cells += f"<td class='n'>{_h(r['busy_lost_gpu_hours'])}</td>"
        cells += f"<td class='n'>{_h(r['held_idle_gpu_hours'])}</td>"
        cells += f"<td class='n'>{_h(r['longest_spared_idle_hours'])}</td>"
        body.append(f"<tr>{cells}</tr>")
    stops = []
    for policy in result.policies:
        mine = _records(result.stops[result.stops["policy"] == policy])
        if not mine:
            continue
        items = "".join(
            f"<tr><td>{html_text(str(r['pod']))}</td><td>{html_text(str(r['team']))}</td>"
            f"<td class='t'>{_iso(int(r['stop_ms']))}</td>"
            f"<td>{'false stop' if r['false_stop'] else ''}</td>"
            f"<td class='n'>{_h(r['released_gpu_hours'])}</td>"
            f"<td class='n'>{_h(r['busy_lost_gpu_hours'])}</td></tr>"
            for r in mine[:STOPS_SHOWN]
        )
        more = len(mine) - STOPS_SHOWN
        stops.append(
            f"<h3>Stopped by {html_text(policy)}</h3><table><tr><th>pod</th><th>team</th>"
            "<th>stop (UTC)</th><th></th><th class='n'>released GPU-h</th>"
            f"<th class='n'>busy lost GPU-h</th></tr>{items}</table>"
            + (
                f"<p class='muted'>… and {more} more (JSON output lists all).</p>"
                if more > 0
                else ""
            )
        )
    return (
        "<h2>Idle policies: what-if</h2><p class='muted'>Each policy replayed over the window "
        "as if it had stopped each job the moment it fired: the GPU-hours it would have "
        "released, by the category they came out of; false stops are pods active again after "
        "their stop, with the busy GPU-hours lost.</p>"
        f"<table>{head}{''.join(body)}</table>{''.join(stops)}"
    )
