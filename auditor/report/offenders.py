"""Top offenders per waste category, each with a one-line next step, and each job's straggler."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import pandas as pd

from auditor.model import WasteCategory
from auditor.report.advice import STALLED_BUSY_STEP, next_step, throttle_names
from auditor.report.causes import FIRST_STEP, complete_causes, leading_cause
from auditor.report.summary import with_platform

OFFENDER_CATEGORIES = (
    WasteCategory.RESERVED_IDLE,
    WasteCategory.STARTUP,
    WasteCategory.TEARDOWN,
    WasteCategory.CHECKPOINT,
    WasteCategory.STRAGGLER_WAIT,
    WasteCategory.COMPUTE_IDLE,
    WasteCategory.UNOBSERVED,
    WasteCategory.UNALLOCATED,
)

STRAGGLER_COLUMNS = ["straggler_pod", "straggler_rank", "straggler_node", "straggler_gpu"]


def stragglers(findings: pd.DataFrame, *, by_cluster: bool = False) -> pd.DataFrame:
    """Per (namespace, job): the card the others waited on most, with its throttle reasons;
    per (cluster, namespace, job) with `by_cluster` (the findings' `cluster`)."""
    keys = ["cluster", "namespace", "job"] if by_cluster else ["namespace", "job"]
    cols = [*keys, *STRAGGLER_COLUMNS, "straggler_throttle", "straggler_seconds"]
    s = findings[findings["kind"] == "straggler"]
    if s.empty:
        return pd.DataFrame(columns=cols)
    s = s.sort_values(["seconds", "gpu"], ascending=[False, True]).drop_duplicates(keys)
    return pd.DataFrame(
        {
            **({"cluster": s["cluster"].to_numpy()} if by_cluster else {}),
            "namespace": s["namespace"].to_numpy(),
            "job": s["job"].to_numpy(),
            "straggler_pod": s["pod"].to_numpy(),
            "straggler_rank": s["rank"].astype("Int64").to_numpy(),
            "straggler_node": s["node"].to_numpy(),
            "straggler_gpu": s["gpu"].to_numpy(),
            "straggler_throttle": [
                ", ".join(throttle_names(d if isinstance(d, str) else None)) for d in s["detail"]
            ],
            "straggler_seconds": s["seconds"].to_numpy(),
        }
    )


def _describe_straggler(row: Mapping[Hashable, Any]) -> str | None:
    if pd.isna(row.get("straggler_pod")):
        return None
    text = f"{row['straggler_pod']} (rank {row['straggler_rank']}) on {row['straggler_node']}"
    if row.get("straggler_throttle"):
        text += f", throttled: {row['straggler_throttle']}"
    return text


def top_offenders(
    results: pd.DataFrame,
    findings: pd.DataFrame,
    *,
    top: int = 3,
    causes: pd.DataFrame | None = None,
    split: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The `top` jobs (or nodes, for platform categories) per category, with the next step:
    for `compute_idle` and `unallocated`, the first step of the offender's leading cause
    (`causes`: the runs' stored cause rows) where a signal named one. `split`: those rows
    completed (`complete_causes` of `results`, platform included), where the caller has
    them already; then `causes` is not read."""
    frame = with_platform(results)
    slow = stragglers(findings)
    if split is None:
        split = complete_causes(frame, causes)
    rows: list[dict[str, object]] = []
    for cat in OFFENDER_CATEGORIES:
        part = frame[frame["category"] == cat.value]
        if part.empty:
            continue
        total = float(part["seconds"].sum())
        platform = cat in (WasteCategory.UNALLOCATED,) or (
            cat is WasteCategory.UNOBSERVED and not part["held"].any()
        )
        keys = ["node"] if platform else ["team", "namespace", "job"]
        if cat is WasteCategory.UNOBSERVED:
            keys = ["node"]
        agg = part.groupby(keys, dropna=False).agg(
            seconds=("seconds", "sum"), workload=("workload", "first")
        )
        agg = agg.sort_values("seconds", ascending=False).head(top).reset_index()
        if "job" in agg.columns and not slow.empty:
            agg = agg.merge(slow, on=["namespace", "job"], how="left")
        lead = leading_cause(split[split["category"] == cat.value], keys)
        if not lead.empty:
            agg = agg.merge(lead.drop(columns="category"), on=keys, how="left")
        for row in agg.to_dict("records"):
            where = row["node"] if "node" in keys else f"{row['namespace']}/{row['job']}"
            step = next_step(
                cat,
                workload=None if pd.isna(row["workload"]) else str(row["workload"]),
                straggler=_describe_straggler(row) if "straggler_pod" in row else None,
            )
            cause = row.get("cause")
            if isinstance(cause, str) and row["seconds"] > 0:
                share = float(row["cause_seconds"]) / float(row["seconds"])
                step = f"{cause} ({share:.0%}): {FIRST_STEP.get(cause, step)}"
            rows.append(
                {
                    "category": cat.value,
                    "team": row.get("team", None),
                    "offender": where,
                    "gpu_hours": float(row["seconds"]) / 3600.0,
                    "share_of_category": float(row["seconds"]) / total if total else 0.0,
                    "next_step": step,
                }
            )
    rows += _stalled(findings, top=top)
    return pd.DataFrame(
        rows,
        columns=["category", "team", "offender", "gpu_hours", "share_of_category", "next_step"],
    )


def _stalled(findings: pd.DataFrame, *, top: int) -> list[dict[str, object]]:
    """The `top` jobs by `stalled_busy` GPU-hours (busy cards whose SMs sat idle)."""
    part = findings[findings["kind"] == "stalled_busy"] if len(findings) else findings
    if part.empty:
        return []
    total = float(part["seconds"].sum())
    agg = (
        part.groupby(["team", "namespace", "job"], dropna=False)["seconds"]
        .sum()
        .sort_values(ascending=False, kind="stable")
        .head(top)
        .reset_index()
    )
    return [
        {
            "category": "stalled_busy",
            "team": row["team"],
            "offender": f"{row['namespace']}/{row['job']}",
            "gpu_hours": float(row["seconds"]) / 3600.0,
            "share_of_category": float(row["seconds"]) / total if total else 0.0,
            "next_step": STALLED_BUSY_STEP,
        }
        for row in agg.to_dict("records")
    ]
