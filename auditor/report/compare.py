"""Outputs per group, and `compare A B` (SPEC §8): figures, confounders, the verdict.

Pure: frames in (the audit results, outputs, latency buckets the store reads), figures out.

The **verdict** holds only if all four conditions hold (tolerance `tol`, default 5 %):

- `throughput`: B delivers at least A's outputs per hour of its window (within `tol`): a
  change that spends fewer GPU-hours by doing less work is no improvement, and a serving
  change cannot raise the traffic it is sent (its throughput per GPU rising is what
  `gpu_hours_per_output` checks);
- `latency`: B's p50 and p95 are no higher than A's by more than `tol` (checked where both
  sides have latency data);
- `quality`: no worse than A's by more than `tol`, in the direction the metric says is
  better (checked where both sides have it);
- `gpu_hours_per_output`: B's held GPU-hours per 1,000 outputs is lower than A's.

Without outputs on a side, `throughput` and `gpu_hours_per_output` fail: nothing shows the
work got cheaper. **Confounders** are named, not judged: different GPU models, a different
average GPU count or world size, traffic (outputs per hour) differing by more than 20 %,
different output units, more than 5 % unobserved or estimated-attribution time on a side.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from auditor.model import CATEGORIES, PLATFORM_TEAM, SCHEDULING_WASTE, Window

UNIT_PREFERENCE = ("tokens", "samples", "steps", "inferences", "requests", "prompt_tokens")
"""Where a pod or group has several units, the one its `outputs` counts: the first present."""
SERVING_UNITS = frozenset({"tokens", "requests", "inferences", "prompt_tokens"})
"""Units of served traffic: where outputs count requests served, outputs per hour is the
traffic, and traffic that differs by more than 20 % confounds a comparison. A training job's
samples per hour is its throughput, not traffic."""
CONDITIONS = ("throughput", "latency", "quality", "gpu_hours_per_output")
TRAFFIC_TOLERANCE = 0.20
UNOBSERVED_TOLERANCE = 0.05


def choose_unit(units: Sequence[str]) -> str | None:
    """The unit a group's `outputs` counts: the most preferred present, else the first by name."""
    present = sorted({str(u) for u in units})
    if not present:
        return None
    for unit in UNIT_PREFERENCE:
        if unit in present:
            return unit
    return present[0]


def outputs_in_window(rows: pd.DataFrame, *, window: Window) -> pd.DataFrame:
    """Output rows with `outputs` prorated to the part of their interval inside the window."""
    if rows.empty:
        return rows.assign(in_window=pd.Series(dtype="float64"))
    start = rows["start_ms"].to_numpy(dtype=np.float64)
    end = rows["end_ms"].to_numpy(dtype=np.float64)
    inside = np.clip(np.minimum(end, window[1]) - np.maximum(start, window[0]), 0, None)
    share = inside / np.maximum(end - start, 1.0)
    return rows.assign(in_window=rows["outputs"].to_numpy(dtype=np.float64) * share)


def outputs_by(rows: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per group: `outputs` (of its chosen unit, prorated) and `output_unit`."""
    cols = [*keys, "outputs", "output_unit"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out: list[dict[str, Any]] = []
    for key, part in rows.groupby(list(keys), dropna=False, sort=True):
        unit = choose_unit(part["unit"].tolist())
        values = key if isinstance(key, tuple) else (key,)
        total = float(part.loc[part["unit"] == unit, "in_window"].sum())
        out.append({**dict(zip(keys, values, strict=True)), "outputs": total, "output_unit": unit})
    return pd.DataFrame(out, columns=cols)


def outputs_by_name(rows: pd.DataFrame, outputs: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`outputs_by` for report rows keyed with a cluster, of outputs that name none (an
    output row names its job, not the job's cluster): a name that only one cluster's rows
    have takes its outputs there; a name of several clusters takes none, since whose they
    were is not known."""
    plain = [k for k in keys if k != "cluster"]
    per = outputs_by(outputs, plain)
    names = rows[list(keys)].drop_duplicates()
    single = names[~names.duplicated(plain, keep=False)]
    return per.merge(single, on=plain, how="inner")[[*keys, "outputs", "output_unit"]]


def per_1k(hours: Any, outputs: Any) -> Any:
    """GPU-hours per 1,000 outputs; NaN where there were no outputs."""
    o = pd.to_numeric(outputs, errors="coerce")
    return (
        1000.0 * hours / o.where(o > 0)
        if isinstance(o, pd.Series)
        else (1000.0 * hours / o if o and o > 0 else math.nan)
    )


def with_outputs(rows: pd.DataFrame, per_group: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Report rows with `outputs`, `output_unit`, `gpu_hours_per_1k_outputs` (held) and
    `busy_gpu_hours_per_1k_outputs`; the platform row and groups without outputs get null."""
    merged = (
        rows.merge(per_group, on=list(keys), how="left")
        if len(per_group)
        else rows.assign(outputs=np.nan, output_unit=None)
    )
    merged["outputs"] = pd.to_numeric(merged["outputs"], errors="coerce").astype("float64")
    merged["output_unit"] = (
        merged["output_unit"].astype(object).where(merged["output_unit"].notna(), None)
    )
    merged["gpu_hours_per_1k_outputs"] = per_1k(merged["allocated_gpu_hours"], merged["outputs"])
    merged["busy_gpu_hours_per_1k_outputs"] = per_1k(merged["busy_gpu_hours"], merged["outputs"])
    return merged


def sm_by(sm: pd.DataFrame, rows: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Report rows with `sm_active_gpu_hours` and `sm_data_share` (the share of busy time
    whose samples had SM activity data; null where the group had no busy time)."""
    if sm.empty:
        agg = pd.DataFrame(columns=[*keys, "sm_active_gpu_hours", "sm_busy"])
    else:
        frame = sm.copy()
        for col in ("team", "namespace", "job", "pod"):
            if col in frame.columns:
                frame[col] = (
                    frame[col].astype(object).where(frame["pod_uid"].notna(), PLATFORM_TEAM)
                )
        agg = (
            frame.groupby(list(keys), dropna=False)[["sm_active_seconds", "sm_busy_seconds"]]
            .sum()
            .reset_index()
        )
        agg["sm_active_gpu_hours"] = agg.pop("sm_active_seconds") / 3600.0
        agg["sm_busy"] = agg.pop("sm_busy_seconds") / 3600.0
    out = (
        rows.merge(agg, on=list(keys), how="left")
        if len(agg)
        else rows.assign(sm_active_gpu_hours=np.nan, sm_busy=np.nan)
    )
    out["sm_active_gpu_hours"] = pd.to_numeric(out["sm_active_gpu_hours"]).fillna(0.0)
    busy = out["busy_gpu_hours"].where(out["busy_gpu_hours"] > 0)
    out["sm_data_share"] = (pd.to_numeric(out.pop("sm_busy")).fillna(0.0) / busy).clip(upper=1.0)
    return out


# ---------------------------------------------------------------- one side's figures


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of cumulative buckets [(le, count)], interpolated linearly inside the
    bucket that holds it, as Prometheus' `histogram_quantile` does; None without counts."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(ordered):
        if count >= rank:
            if math.isinf(le):
                return ordered[i - 1][0] if i > 0 else None
            if i == 0 and le <= 0:
                return le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return ordered[-1][0]


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what was selected, over which window, and its figures."""

    label: str
    window: Window
    figures: dict[str, Any]


def latency_quantiles(buckets: pd.DataFrame) -> tuple[float | None, float | None]:
    """p50 and p95 (seconds) of summed bucket increases; (None, None) without data."""
    if buckets.empty:
        return None, None
    summed = buckets.groupby("le")["count"].sum()
    pairs = list(zip(summed.index.tolist(), summed.tolist(), strict=True))
    return histogram_quantile(pairs, 0.5), histogram_quantile(pairs, 0.95)


def side_figures(
    results: pd.DataFrame,
    outputs: pd.DataFrame,
    latency: pd.DataFrame,
    *,
    window: Window,
) -> dict[str, Any]:
    """The figures `compare` shows for one side: the selected pods' results in the window,
    their output rows (prorated already: column `in_window`) and latency buckets."""
    held = results[results["pod_uid"].notna()]
    per = held.groupby("category")["seconds"].sum() / 3600.0
    fig: dict[str, Any] = {"allocated_gpu_hours": float(held["seconds"].sum() / 3600.0)}
    for c in CATEGORIES:
        fig[f"{c.value}_gpu_hours"] = float(per.get(c.value, 0.0))
    fig["scheduling_waste_gpu_hours"] = sum(fig[f"{c}_gpu_hours"] for c in SCHEDULING_WASTE)
    hours = (window[1] - window[0]) / 3_600_000
    unit = choose_unit(outputs["unit"].tolist()) if len(outputs) else None
    total = float(outputs.loc[outputs["unit"] == unit, "in_window"].sum()) if unit else None
    fig["outputs"] = total
    fig["output_unit"] = unit
    alloc = fig["allocated_gpu_hours"]
    fig["gpu_hours_per_1k_outputs"] = 1000 * alloc / total if total else None
    fig["busy_gpu_hours_per_1k_outputs"] = 1000 * fig["busy_gpu_hours"] / total if total else None
    fig["throughput_per_gpu_hour"] = total / alloc if total is not None and alloc > 0 else None
    fig["outputs_per_hour"] = total / hours if total is not None and hours > 0 else None
    p50, p95 = latency_quantiles(latency)
    fig["latency_p50_s"] = p50
    fig["latency_p95_s"] = p95
    q = outputs[outputs["quality"].notna()] if len(outputs) else outputs
    if len(q):
        weights = q["in_window"].to_numpy(dtype=np.float64)
        values = q["quality"].to_numpy(dtype=np.float64)
        fig["quality"] = float(
            np.average(values, weights=weights) if weights.sum() > 0 else values.mean()
        )
        fig["quality_better"] = (
            str(q["quality_better"].dropna().iloc[0])
            if q["quality_better"].notna().any()
            else "lower"
        )
    else:
        fig["quality"] = None
        fig["quality_better"] = None
    fig["gpu_models"] = sorted({str(m) for m in held["gpu_model"].dropna()}) if len(held) else []
    fig["gpus_held_avg"] = alloc / hours if hours > 0 else 0.0
    world = held.groupby("gang")["pod_uid"].nunique() if len(held) else pd.Series(dtype=int)
    fig["world_size"] = int(world.max()) if len(world) else 0
    fig["unobserved_share"] = fig["unobserved_gpu_hours"] / alloc if alloc > 0 else 0.0
    estimated = held["estimated"] if "estimated" in held.columns else held["inferred"] & False
    fig["estimated_share"] = (
        float(held.loc[estimated.astype(bool), "seconds"].sum() / 3600.0) / alloc
        if alloc > 0
        else 0.0
    )
    return fig


# ---------------------------------------------------------------- confounders, verdict


def confounders(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    if a["gpu_models"] != b["gpu_models"]:
        out.append(
            f"different GPU models: {', '.join(a['gpu_models']) or 'none'} vs"
            f" {', '.join(b['gpu_models']) or 'none'}"
        )
    if round(a["gpus_held_avg"]) != round(b["gpus_held_avg"]):
        out.append(
            f"different GPU count: {a['gpus_held_avg']:.1f} vs {b['gpus_held_avg']:.1f}"
            " held on average"
        )
    if a["world_size"] != b["world_size"]:
        out.append(f"different world size: {a['world_size']} vs {b['world_size']} pods")
    ta, tb = a.get("outputs_per_hour"), b.get("outputs_per_hour")
    serving = a["output_unit"] in SERVING_UNITS or b["output_unit"] in SERVING_UNITS
    if serving and ta and tb and abs(tb - ta) / ta > TRAFFIC_TOLERANCE:
        out.append(
            f"traffic differs by {100 * (tb - ta) / ta:+.0f} % (outputs per hour), more than"
            f" {100 * TRAFFIC_TOLERANCE:.0f} %"
        )
    if a["output_unit"] != b["output_unit"]:
        out.append(f"different output units: {a['output_unit']} vs {b['output_unit']}")
    for name, fig in (("A", a), ("B", b)):
        for key, what in (
            ("unobserved_share", "unobserved"),
            ("estimated_share", "estimated-attribution"),
        ):
            if fig[key] > UNOBSERVED_TOLERANCE:
                out.append(f"{100 * fig[key]:.0f} % {what} time on side {name}")
    return out


def _worse(a: float | None, b: float | None, *, tol: float, lower_is_better: bool) -> bool:
    if a is None or b is None:
        return False
    if lower_is_better:
        return b > a * (1 + tol)
    return b < a * (1 - tol)


def failed_conditions(a: Mapping[str, Any], b: Mapping[str, Any], *, tol: float) -> list[str]:
    """The conditions of the verdict that fail, in the order of `CONDITIONS`."""
    failed: list[str] = []
    ra, rb = a.get("outputs_per_hour"), b.get("outputs_per_hour")
    if ra is None or rb is None or not ra > 0 or rb < ra * (1 - tol):
        failed.append("throughput")
    if any(
        _worse(a.get(k), b.get(k), tol=tol, lower_is_better=True)
        for k in ("latency_p50_s", "latency_p95_s")
    ):
        failed.append("latency")
    if a.get("quality") is not None and b.get("quality") is not None:
        better = b.get("quality_better") or a.get("quality_better") or "lower"
        if _worse(a["quality"], b["quality"], tol=tol, lower_is_better=better == "lower"):
            failed.append("quality")
    pa, pb = a.get("gpu_hours_per_1k_outputs"), b.get("gpu_hours_per_1k_outputs")
    if pa is None or pb is None or not pb < pa:
        failed.append("gpu_hours_per_output")
    return failed


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    confounders: list[str]
    failed: list[str]
    tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "holds" if not self.failed else "does not hold"


def compare_sides(a: Side, b: Side, *, tol: float = 0.05) -> Comparison:
    return Comparison(
        a=a,
        b=b,
        confounders=confounders(a.figures, b.figures),
        failed=failed_conditions(a.figures, b.figures, tol=tol),
        tolerance=tol,
    )


# ---------------------------------------------------------------- rendering

SHOWN: tuple[tuple[str, str], ...] = (
    ("allocated_gpu_hours", "held GPU-h"),
    *((f"{c.value}_gpu_hours", f"{c.value} GPU-h") for c in CATEGORIES),
    ("outputs", "outputs"),
    ("gpu_hours_per_1k_outputs", "GPU-h per 1k outputs"),
    ("busy_gpu_hours_per_1k_outputs", "busy GPU-h per 1k outputs"),
    ("throughput_per_gpu_hour", "outputs per GPU-h"),
    ("outputs_per_hour", "outputs per hour"),
    ("latency_p50_s", "latency p50 (s)"),
    ("latency_p95_s", "latency p95 (s)"),
    ("quality", "quality"),
)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def change_pct(a: Any, b: Any) -> float | None:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not a:
        return None
    return 100.0 * (b - a) / abs(a)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if value and abs(value) < 0.1:
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def render_compare_json(c: Comparison) -> str:
    def side(s: Side) -> dict[str, Any]:
        return {
            "selector": s.label,
            "window": {"start_ms": s.window[0], "end_ms": s.window[1]},
            **{k: _clean(v) for k, v in s.figures.items()},
        }

    body = {
        "a": side(c.a),
        "b": side(c.b),
        "confounders": c.confounders,
        "verdict": c.verdict,
        "failed": c.failed,
    }
    return json.dumps(body, indent=2, ensure_ascii=True) + "\n"


def _rows(c: Comparison) -> list[tuple[str, str, str, str]]:
    rows = []
    for key, name in SHOWN:
        a, b = c.a.figures.get(key), c.b.figures.get(key)
        ch = change_pct(a, b)
        rows.append((name, _fmt(a), _fmt(b), "-" if ch is None else f"{ch:+.1f} %"))
    return rows


def _verdict_line(c: Comparison) -> str:
    if not c.failed:
        return "Verdict: the change holds."
    return f"Verdict: the change does not hold (failed: {', '.join(c.failed)})."


def render_compare_table(c: Comparison) -> str:
    from auditor.report.text import terminal_safe

    unit = c.a.figures.get("output_unit") or c.b.figures.get("output_unit") or "outputs"
    lines = [
        f"A: {terminal_safe(c.a.label)}",
        f"B: {terminal_safe(c.b.label)}",
        f"(outputs in {terminal_safe(str(unit))})",
    ]
    rows = _rows(c)
    w0 = max(len(r[0]) for r in rows)
    w = [max(len(r[i]) for r in rows) for i in range(1, 4)]
    head = ("", "A", "B", "change")
    lines.append(f"  {head[0]:<{w0}}  {head[1]:>{w[0]}}  {head[2]:>{w[1]}}  {head[3]:>{w[2]}}")
    for r in rows:
        lines.append(f"  {r[0]:<{w0}}  {r[1]:>{w[0]}}  {r[2]:>{w[1]}}  {r[3]:>{w[2]}}")
    lines.append(
        "Confounders: " + ("; ".join(terminal_safe(x) for x in c.confounders) or "none found")
    )
    lines.append(_verdict_line(c))
    return "\n".join(lines) + "\n"


def render_compare_html(c: Comparison) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><th scope='row'>{e(n)}</th><td>{e(a)}</td><td>{e(b)}</td><td>{e(ch)}</td></tr>"
        for n, a, b, ch in _rows(c)
    )
    conf = "".join(f"<li>{e(x)}</li>" for x in c.confounders) or "<li>none found</li>"
    verdict = "holds" if not c.failed else "does not hold"
    failed = f"<p>Failed conditions: {e(', '.join(c.failed))}.</p>" if c.failed else ""
    unit = c.a.figures.get("output_unit") or c.b.figures.get("output_unit") or "outputs"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>auditor compare</title><style>body{font-family:sans-serif;max-width:52em;"
        "margin:2em auto}table{border-collapse:collapse}td,th{padding:.25em .8em;"
        "border-bottom:1px solid #ddd;text-align:right}th[scope=row]{text-align:left}"
        ".holds{color:#176117}.fails{color:#9b1c1c}</style></head><body>"
        f"<h1>Did the change make the work cheaper?</h1>"
        f"<p><b>A</b>: {e(c.a.label)}<br><b>B</b>: {e(c.b.label)}<br>"
        f"Outputs counted in {e(str(unit))}.</p>"
        f"<h2 class='{'holds' if not c.failed else 'fails'}'>The change {verdict}</h2>{failed}"
        "<p>It holds only if throughput per GPU rose without serving less, latency and quality"
        f" are no worse (tolerance {100 * c.tolerance:.0f} %), and GPU-hours per output fell.</p>"
        "<table><thead><tr><th></th><th>A</th><th>B</th><th>change</th></tr></thead>"
        f"<tbody>{rows}</tbody></table><h2>Confounders</h2><ul>{conf}</ul></body></html>\n"
    )
