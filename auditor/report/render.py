"""Renderers: a report as a terminal table, JSON (array of row objects) or CSV.

Names are data from outside: the table shows them `terminal_safe` (and never as rich markup),
CSV text cells go through `csv_cell`, and JSON is ASCII with JSON's own escapes, so it keeps
the exact names (a lone surrogate included) and still prints on any terminal.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from auditor.model import CATEGORIES, Window
from auditor.report.causes import FIRST_STEP, SPLITS
from auditor.report.text import csv_cell, safe_lines, terminal_safe

HOURS_DECIMALS = 4


@dataclass(frozen=True)
class Report:
    """What every renderer draws: the grouped rows, fleet totals, offenders, the window."""

    window: Window
    by: str
    rows: pd.DataFrame
    totals: dict[str, float]
    offenders: pd.DataFrame
    rolled_up_seconds: float = 0.0
    """GPU-seconds of the window audited from 1-minute rollups rather than raw samples."""
    util_sources: Mapping[str, int] = field(default_factory=dict)
    """The metric or reader the cards' utilisation came from -> how many cards."""
    nodes: int = 0
    """Nodes with cards in the results."""
    nodes_without_pods: Sequence[str] = ()
    """Nodes whose cards no known pod held in the window (`summary.nodes_without_pods`)."""
    unjoined_cards: Sequence[str] = ()
    """Cards pods held that no sample names (`summary.unjoined_cards`)."""
    waited: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The jobs that waited longest to be scheduled (`auditor.report.waits`)."""
    causes: Mapping[str, float] = field(default_factory=dict)
    """Fleet totals of the causes inside `compute_idle` and `unallocated`
    (`auditor.report.causes.CAUSE_COLUMNS`)."""


ROLLED_UP_FIELD = "window_rolled_up_gpu_hours"
"""JSON field on every row when part of the window was audited from rollups (absent else)."""


def rolled_up_note(report: Report) -> str | None:
    """The sentence that flags a window audited partly from 1-minute rollups, or None."""
    if report.rolled_up_seconds <= 0:
        return None
    return (
        f"Note: {report.rolled_up_seconds / 3600:,.1f} GPU-h of this window were audited from "
        "1-minute rollups (coarser: startup, teardown, straggler and checkpoint splits at minute "
        "resolution)."
    )


STAND_INS: Mapping[str, str] = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "MIG instances"}
"""Utilisation sources that stand in for a GPU's own utilisation, and for which cards."""


def util_source_note(report: Report) -> str | None:
    """The sentence naming cards whose utilisation is a stand-in metric, or None."""
    parts = [
        f"{n} GPU{'' if n == 1 else 's'} from {source} ({STAND_INS[source]})"
        for source, n in report.util_sources.items()
        if source in STAND_INS and n
    ]
    return f"Utilisation of {', '.join(parts)}." if parts else None


def estimated_note(report: Report) -> str | None:
    """The sentence stating how much held time on shared cards was attributed by share."""
    share = report.totals.get("estimated_share", 0.0)
    if not share:
        return None
    return (
        f"{share:.0%} of held GPU-hours are on shared cards without per-pod utilisation: "
        "the card's activity was split among its tenants by share (estimated attribution)."
    )


NODES_NAMED = 5
"""Nodes named in the note on nodes without pods; the rest are counted."""


def unheld_busy_note(report: Report) -> str | None:
    """The sentence on kernel time of cards that no known pod held, or None."""
    hours = report.totals.get("unheld_busy_gpu_hours", 0.0)
    if hours <= 0:
        return None
    unit, scale = table_unit(report.totals["capacity_gpu_hours"])
    return (
        f"Kernels ran on cards no known pod held: {_num(hours * scale)} {unit} of busy time "
        "belong to no pod (the platform's row). Pods are missing from the input, or work "
        "ran outside Kubernetes."
    )


def missing_pods_note(report: Report) -> str | None:
    """The sentence on nodes (or a whole window) with no pod imported, or None."""
    missing = list(report.nodes_without_pods)
    if not missing or report.nodes == 0:
        return None
    if report.totals.get("allocated_gpu_hours", 0.0) <= 0:
        return (
            "No pod held any card in this window: were the pods imported (`auditor import "
            "pods`, or the watcher)? Until they are, every card's time is the platform's."
        )
    named = ", ".join(missing[:NODES_NAMED])
    more = f" and {len(missing) - NODES_NAMED} more" if len(missing) > NODES_NAMED else ""
    return (
        f"No pod held a card on {len(missing)} of {report.nodes} nodes ({named}{more}): "
        "were their pods imported?"
    )


def unjoined_note(report: Report) -> str | None:
    """The sentence naming cards that pods held but no sample names, or None."""
    cards = list(report.unjoined_cards)
    if not cards:
        return None
    named = ", ".join(cards[:NODES_NAMED])
    more = f" and {len(cards) - NODES_NAMED} more" if len(cards) > NODES_NAMED else ""
    return (
        f"No sample in this window names {len(cards)} card{'' if len(cards) == 1 else 's'} "
        f"that pods held ({named}{more}): their held time is unobserved. If the GPU log "
        "names cards by PCI bus id or index, add the uuid column (nvidia-smi "
        "--query-gpu=...,uuid,...)."
    )


def notes(report: Report) -> list[str]:
    """Every sentence a report states beside its figures, in the order they are shown."""
    found = (
        rolled_up_note(report),
        util_source_note(report),
        estimated_note(report),
        missing_pods_note(report),
        unheld_busy_note(report),
        unjoined_note(report),
    )
    return [n for n in found if n is not None]


def cause_lines(report: Report) -> list[tuple[str, str, float, float, str]]:
    """(category, cause, GPU-hours, share of the category, first step) of every cause with
    time, in the splits' order: what the causes table shows."""
    out: list[tuple[str, str, float, float, str]] = []
    for category, names, _ in SPLITS:
        total = report.totals.get(f"{category}_gpu_hours", 0.0)
        for name in names:
            hours = report.causes.get(f"{category}_{name}_gpu_hours", 0.0)
            if hours > 0 and total > 0:
                out.append((category, name, hours, hours / total, FIRST_STEP.get(name, "-")))
    return out


def no_signal_notes(report: Report) -> list[str]:
    """The sentences stating how much of each split rests on no recorded signal."""
    out: list[str] = []
    for category, _, fallback in SPLITS:
        share = report.causes.get(f"{category}_no_signal_share", math.nan)
        if isinstance(share, float) and not math.isnan(share) and share > 0:
            out.append(
                f"{share:.0%} of {category} rests on no recorded signal ({fallback}): "
                + ("record pods' CPU, PCIe and serving signals (see docs/inputs.md)."
                   if category == "compute_idle" else
                   "keep pods that wait and nodes' state (import pods or the watcher).")
            )  # fmt: skip
    return out


def _clean(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if isinstance(value, float):
        return round(value, HOURS_DECIMALS + 2)
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def _records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): _clean(v) for k, v in rec.items()} for rec in rows.to_dict("records")]


PER_OUTPUT_COLUMNS = (
    "outputs",
    "output_unit",
    "gpu_hours_per_1k_outputs",
    "busy_gpu_hours_per_1k_outputs",
)
"""What `report --by job|team` adds per group (SPEC §8); null where a group had no outputs."""


def group_keys(rows: pd.DataFrame) -> list[str]:
    """The grouping columns of report rows (team, namespace, job, pod, node, gpu)."""
    return [
        c
        for c in rows.columns
        if not c.endswith(("_gpu_hours", "_share"))
        and not c.startswith(("util_", "straggler_", "queue_wait_"))
        and c not in PER_OUTPUT_COLUMNS
    ]


def render_json(report: Report) -> str:
    records = _records(report.rows)
    if report.rolled_up_seconds > 0:
        hours = round(report.rolled_up_seconds / 3600, HOURS_DECIMALS + 2)
        records = [{**rec, ROLLED_UP_FIELD: hours} for rec in records]
    return json.dumps(records, indent=2, ensure_ascii=True) + "\n"


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(list(report.rows.columns))
    for rec in _records(report.rows):
        writer.writerow(
            ["" if v is None else csv_cell(v) if isinstance(v, str) else v for v in rec.values()]
        )
    return buf.getvalue()


def _iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%d %H:%M UTC")


def _pct(value: Any) -> str:
    v = _clean(value)
    return "-" if v is None else f"{100 * v:.0f}%"


def _num(value: Any, digits: int = 1) -> str:
    v = _clean(value)
    if v is None:
        return "-"
    if v != 0 and abs(v) < 0.5 * 10**-digits:
        return f"<{10**-digits:.{digits}f}"  # not zero, only too small for the unit
    return f"{v:,.{digits}f}"


MINUTES_BELOW_GPU_HOURS = 10.0
"""A report of less capacity than this is shown in GPU-minutes: a 10-minute window of a few
cards is a fraction of a GPU-hour, and every cell would read 0.0."""


def util_text(rec: Mapping[Any, Any]) -> str:
    """A row's utilisation cell: a card's own (`--by gpu`), else p10/p50/p90 of its cards."""
    if "util_pct" in rec:
        return "-" if _clean(rec["util_pct"]) is None else f"{rec['util_pct']:.0f}"
    return "/".join(
        "-" if _clean(rec[q]) is None else f"{rec[q]:.0f}"
        for q in ("util_p10", "util_p50", "util_p90")
    )


def held_busy(totals: Mapping[str, float]) -> float:
    """Busy GPU-hours of held cards (the fleet's busy less that of cards no pod held)."""
    return totals["busy_gpu_hours"] - totals.get("unheld_busy_gpu_hours", 0.0)


def table_unit(capacity_gpu_hours: float) -> tuple[str, float]:
    """The unit a table shows (`GPU-hours` or `GPU-minutes`) and the factor from hours."""
    if capacity_gpu_hours < MINUTES_BELOW_GPU_HOURS:
        return "GPU-minutes", 60.0
    return "GPU-hours", 1.0


def _short_source(value: Any) -> Any:
    if isinstance(value, str):
        return value.removeprefix("DCGM_FI_DEV_").removeprefix("DCGM_FI_PROF_")
    return value


def _output_cells(rec: Mapping[Any, Any], *, scale: float, cell: Any) -> list[Any]:
    produced = _clean(rec["outputs"])
    text = "-" if produced is None else f"{_num(produced, 0)} {rec['output_unit']}"
    return [cell(text), _num(rec["gpu_hours_per_1k_outputs"] * scale, 3)]


PROSE_WIDTH = 150
"""Where the sentences above and below the tables wrap when no terminal width is given."""
UNBOUNDED = 100_000
"""The width a table is measured in when it may be as wide as its content."""


def render_table(report: Report, *, width: int | None = None) -> str:
    """A readable terminal report: totals, the grouped table, and the top offenders.

    `width`: the terminal's columns. A name a user types back (team, job, pod, node, card)
    is never cut: in a terminal too narrow for it, it folds onto the next line. Without a
    width (a file, a pipe), every table is as wide as its content needs."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any) -> Text:
        """A name as literal text: escaped, and no rich markup or emoji codes read in it."""
        v = _clean(value)
        return Text("-" if v is None else terminal_safe(str(v)))

    buf = io.StringIO()
    console = Console(file=buf, width=width or PROSE_WIDTH, force_terminal=False, color_system=None)

    def show(table: Table) -> None:
        if width is None:  # as wide as the content: nothing is folded either
            unbounded = console.options.update_width(UNBOUNDED)
            console.width = max(PROSE_WIDTH, console.measure(table, options=unbounded).maximum)
        console.print(table)
        console.width = width or PROSE_WIDTH

    t = report.totals
    alloc = t["allocated_gpu_hours"]
    unit, scale = table_unit(t["capacity_gpu_hours"])
    console.print(
        f"GPU waste audit {_iso(report.window[0])} → {_iso(report.window[1])}: "
        f"{_num(t['capacity_gpu_hours'] * scale)} {unit} of capacity, "
        f"{_num(alloc * scale)} held by pods."
    )
    if alloc > 0:
        console.print(
            f"Of held time: busy {held_busy(t) / alloc:.0%}, "
            f"scheduling waste {t['scheduling_waste_gpu_hours'] / alloc:.0%}, "
            f"compute idle {t['compute_idle_gpu_hours'] / alloc:.0%}, "
            f"unobserved {t['unobserved_gpu_hours'] / alloc:.0%}. "
            f"Unallocated: {_num(t['unallocated_gpu_hours'] * scale)} {unit}. "
            f"{t['inferred_share']:.0%} of held GPU-hours rest on inferred GPU→pod mapping."
        )
    for note in notes(report):
        console.print(note)
    keys = group_keys(report.rows)
    if "util_source" in report.rows.columns:
        keys.append("util_source")  # the metric, shown short: GPU_UTIL, GR_ENGINE_ACTIVE
    table = Table(title=f"{unit} by {report.by}", title_justify="left")
    for k in keys:  # names: folded in a narrow terminal, never cut with an ellipsis
        table.add_column("util from" if k == "util_source" else k, overflow="fold")
    short = {
        "reserved_idle": "resv idle",
        "straggler_wait": "straggler",
        "compute_idle": "comp idle",
        "unallocated": "unalloc",
        "unobserved": "unobs",
    }
    table.add_column("held", justify="right")
    for cat in CATEGORIES:
        table.add_column(short.get(cat.value, cat.value), justify="right")
    table.add_column("sched waste", justify="right")
    table.add_column(
        "util" if "util_pct" in report.rows.columns else "util p10/50/90", justify="right"
    )
    has_sm = "sm_active_gpu_hours" in report.rows.columns and bool(
        (report.rows["sm_active_gpu_hours"] > 0).any()
    )
    has_out = "outputs" in report.rows.columns and bool(report.rows["outputs"].notna().any())
    if has_sm:
        table.add_column("SM active (data)", justify="right")
    if has_out:
        table.add_column("outputs", justify="right")
        table.add_column(f"{'GPU-h' if scale == 1 else 'GPU-min'}/1k out", justify="right")
    for rec in report.rows.to_dict("records"):
        util = util_text(rec)
        table.add_row(
            *(cell(_short_source(rec[k]) if k == "util_source" else rec[k]) for k in keys),
            _num(rec["allocated_gpu_hours"] * scale),
            *(_num(rec[f"{c.value}_gpu_hours"] * scale) for c in CATEGORIES),
            f"{_num(rec['scheduling_waste_gpu_hours'] * scale)} "
            f"({_pct(rec['scheduling_waste_share'])})",
            util,
            *(
                [f"{_num(rec['sm_active_gpu_hours'] * scale)} ({_pct(rec['sm_data_share'])})"]
                if has_sm
                else []
            ),
            *(_output_cells(rec, scale=scale, cell=cell) if has_out else []),
        )
    show(table)
    why = cause_lines(report)
    if why:
        split = Table(title="Why held cards idled and free cards sat free", title_justify="left")
        for col, justify in (
            ("category", "left"),
            ("cause", "left"),
            ("GPU-h" if scale == 1 else "GPU-min", "right"),
            ("share", "right"),
            ("first step", "left"),
        ):
            split.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for category, cause, hours, share, step in why:
            split.add_row(category, cause, _num(hours * scale), _pct(share), step)
        show(split)
        for note in no_signal_notes(report):
            console.print(note)
    if not report.waited.empty:
        waited = Table(title="Jobs that waited to be scheduled", title_justify="left")
        for col, justify in (
            ("job", "left"),
            ("GPU-h" if scale == 1 else "GPU-min", "right"),
            ("half-start", "right"),
            ("the scheduler's last word", "left"),
        ):
            waited.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for rec in report.waited.to_dict("records"):
            waited.add_row(
                cell(f"{rec['namespace']}/{rec['job']}"),
                _num(rec["queue_wait_gpu_hours"] * scale),
                _num(rec["half_start_gpu_hours"] * scale),
                cell(rec["queue_wait_message"]),
            )
        show(waited)
    if not report.offenders.empty:
        off = Table(title="Top offenders and next steps", title_justify="left")
        for col, justify in (
            ("category", "left"),
            ("offender", "left"),
            ("GPU-h" if scale == 1 else "GPU-min", "right"),
            ("share", "right"),
            ("next step", "left"),
        ):
            fold = "fold" if col in {"category", "offender"} else "ellipsis"
            off.add_column(col, justify=justify, overflow=fold)  # type: ignore[arg-type]
        for rec in report.offenders.to_dict("records"):
            off.add_row(
                cell(rec["category"]),
                cell(rec["offender"]),
                _num(rec["gpu_hours"] * scale),
                _pct(rec["share_of_category"]),
                cell(rec["next_step"]),
            )
        show(off)
    return safe_lines(buf.getvalue())  # the cells are escaped already: this is the guarantee
