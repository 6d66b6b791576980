"""The weekly finance CSV (SPEC §4): one row per team × cluster × GPU model, plus the
platform's rows.

Hours carry 4 decimals and money 2. Each column is rounded by the largest-remainder method,
so a column of the file sums exactly to the rounded total of the same column unrounded: the
file reconciles with `auditor report` for the week, and all rows' `allocated_cost` with the
fleet's capacity × price (the platform rows are charged the capacity no pod held).
Text cells have control characters escaped and are neutralised against spreadsheet formula
injection (`auditor.report.text.csv_cell`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from auditor import timespec
from auditor.model import (
    CATEGORIES,
    DEFAULT_CLUSTER,
    PLATFORM_TEAM,
    SCHEDULING_WASTE,
    WasteCategory,
)
from auditor.report.causes import CAUSE_COLUMNS, CAUSE_HOUR_COLUMNS, cause_columns, complete_causes
from auditor.report.text import csv_cell
from auditor.settings import Prices

COLUMNS = [
    "week", "week_start", "week_end", "team", "cost_centre", "gpu_model",
    "allocated_gpu_hours", "busy_gpu_hours", "reserved_idle_gpu_hours", "startup_gpu_hours",
    "teardown_gpu_hours", "checkpoint_gpu_hours", "straggler_wait_gpu_hours",
    "compute_idle_gpu_hours", "unobserved_gpu_hours", "unallocated_gpu_hours",
    "scheduling_waste_gpu_hours", "price_per_gpu_hour", "allocated_cost",
    "scheduling_waste_cost", "compute_idle_cost", "currency",
    *CAUSE_COLUMNS, "cluster",
]  # fmt: skip
"""The causes inside `compute_idle` and `unallocated` (SPEC §10), then the cluster (SPEC
§11), come last, so that a sheet reading the earlier columns by position reads them as
before."""
TEXT_COLUMNS = (
    "week", "week_start", "week_end", "team", "cost_centre", "gpu_model", "currency", "cluster",
)  # fmt: skip
KEYS = ["team", "cluster", "gpu_model"]
"""One row per team, cluster and GPU model: a team running in two clusters is charged in
each."""
HOURS_DECIMALS = 4
MONEY_DECIMALS = 2
PRICE_DECIMALS = 4
UNKNOWN_MODEL = "(unknown)"


@dataclass(frozen=True)
class Week:
    label: str
    start_ms: int
    end_ms: int

    @property
    def start_iso(self) -> str:
        return datetime.fromtimestamp(self.start_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def end_iso(self) -> str:
        return datetime.fromtimestamp(self.end_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_week(text: str) -> Week:
    """`2026-W48` → that ISO week, Monday 00:00 UTC to the next Monday 00:00 UTC."""
    label, (start_ms, end_ms) = timespec.parse_week(text)
    return Week(label, start_ms, end_ms)


def round_column(values: np.ndarray, decimals: int) -> np.ndarray:
    """Round so that the rounded values sum to the rounded sum (largest remainder)."""
    if len(values) == 0:
        return values.astype(float)
    scale = 10.0**decimals
    scaled = values.astype(float) * scale
    floor = np.floor(scaled)
    # the units the rounded total has over the floors (ties of the total to even, as round())
    short = int(np.rint(scaled.sum())) - int(floor.sum())
    order = np.lexsort((np.arange(len(values)), -(scaled - floor)))
    floor[order[:short]] += 1
    return np.round(floor / scale, decimals)


def finance_rows(
    results: pd.DataFrame,
    *,
    week: Week,
    prices: Prices,
    cost_centres: dict[str, str],
    causes: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per team × cluster × GPU model, platform rows last; numbers rounded (text is
    made safe when rendered). `causes`: the runs' stored cause rows
    (`auditor.report.causes`)."""
    if "cluster" not in results.columns:
        results = results.assign(cluster=DEFAULT_CLUSTER)
    frame = results.assign(
        team=results["team"].where(results["pod_uid"].notna(), PLATFORM_TEAM),
        gpu_model=results["gpu_model"].fillna(UNKNOWN_MODEL),
        hours=results["seconds"] / 3600.0,
    )
    hours = frame.pivot_table(
        index=KEYS,
        columns="category",
        values="hours",
        aggfunc="sum",
        fill_value=0.0,
    )
    for cat in CATEGORIES:
        if cat.value not in hours.columns:
            hours[cat.value] = 0.0
    hours = hours.reset_index()
    platform = hours["team"] == PLATFORM_TEAM
    hours["_platform"] = platform.astype(int)
    hours = hours.sort_values(["_platform", *KEYS]).reset_index(drop=True)
    out = pd.DataFrame({k: hours[k] for k in KEYS})
    for cat in CATEGORIES:
        out[f"{cat.value}_gpu_hours"] = round_column(hours[cat.value].to_numpy(), HOURS_DECIMALS)
    # teams are charged what their pods held; the platform the capacity no pod held
    exact_allocated = hours[[c.value for c in CATEGORIES]].sum(axis=1).to_numpy()
    out["allocated_gpu_hours"] = round_column(exact_allocated, HOURS_DECIMALS)
    out["scheduling_waste_gpu_hours"] = np.round(
        out[[f"{c.value}_gpu_hours" for c in SCHEDULING_WASTE]].sum(axis=1), HOURS_DECIMALS
    )
    price = np.array([prices.for_model(m) for m in hours["gpu_model"]], dtype=float)
    out["price_per_gpu_hour"] = np.round(price, PRICE_DECIMALS)
    waste_exact = hours[[c.value for c in SCHEDULING_WASTE]].sum(axis=1).to_numpy()
    idle_exact = hours[WasteCategory.COMPUTE_IDLE.value].to_numpy()
    out["allocated_cost"] = round_column(exact_allocated * price, MONEY_DECIMALS)
    out["scheduling_waste_cost"] = round_column(waste_exact * price, MONEY_DECIMALS)
    out["compute_idle_cost"] = round_column(idle_exact * price, MONEY_DECIMALS)
    out["week"] = week.label
    out["week_start"] = week.start_iso
    out["week_end"] = week.end_iso
    out["cost_centre"] = [
        "" if t == PLATFORM_TEAM else cost_centres.get(str(t), "") for t in out["team"]
    ]
    out["currency"] = prices.currency
    split = complete_causes(results, causes)
    split = split.assign(
        team=split["team"].where(split["pod_uid"].notna(), PLATFORM_TEAM),
        gpu_model=split["gpu_model"].fillna(UNKNOWN_MODEL),
    )
    keys = pd.MultiIndex.from_frame(out[KEYS])
    by_cause = cause_columns(split, KEYS, keys)
    for col in CAUSE_COLUMNS:
        values = by_cause[col].to_numpy(dtype=float)
        out[col] = (
            round_column(values, HOURS_DECIMALS)
            if col in CAUSE_HOUR_COLUMNS
            else np.round(values, HOURS_DECIMALS)
        )
    return out[COLUMNS]


def render_finance_csv(rows: pd.DataFrame) -> str:
    """The CSV text (RFC 4180, CRLF): fixed precision, escaped and neutralised text, stable
    order."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    decimals = {c: HOURS_DECIMALS for c in COLUMNS if c.endswith(("_gpu_hours", "_share"))}
    decimals.update({c: MONEY_DECIMALS for c in COLUMNS if c.endswith("_cost")})
    decimals["price_per_gpu_hour"] = PRICE_DECIMALS
    for rec in rows.to_dict("records"):
        cells: list[str] = []
        for col in COLUMNS:
            value = rec[col]
            if col in decimals and pd.isna(value):
                cells.append("")  # a no-signal share of a row without that category
            elif col in decimals:
                cells.append(f"{float(value):.{decimals[col]}f}")
            else:
                cells.append(csv_cell(str(value)))
        writer.writerow(cells)
    return buf.getvalue()


def unpriced_note(rows: pd.DataFrame, *, prices: Prices) -> str | None:
    """The warning for GPU models whose hours are charged at 0 because no price is set
    (no `[prices]` entry and no `default`), or None."""
    held = rows[(rows["allocated_gpu_hours"] > 0) | (rows["unallocated_gpu_hours"] > 0)]
    models = sorted({str(m) for m in held["gpu_model"] if prices.for_model(str(m)) == 0.0})
    if not models:
        return None
    named = ", ".join(repr(m) for m in models[:5])
    more = f" and {len(models) - 5} more" if len(models) > 5 else ""
    return (
        f"warning: no price for GPU model {named}{more}: its cost columns are 0.00; set "
        "[prices] in the config (a price per GPU-hour per model, or `default`)"
    )
