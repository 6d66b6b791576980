"""The causes inside `compute_idle` and `unallocated` (SPEC §10) as report columns.

An audit run stores its causes per (card, pod or none, category, cause) beside its results
(`audit_causes`). A run stored before causes were split has none, and any part of a
category its causes do not cover (float noise aside) is reported as what it then is: time
whose cause rests on no signal, `unexplained` inside `compute_idle` and `no_demand` inside
`unallocated`. So the cause columns of every row sum to its category's column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.classify.causes import IdleCause
from auditor.classify.free_time import FreeCause
from auditor.model import WasteCategory

IDLE = WasteCategory.COMPUTE_IDLE.value
FREE = WasteCategory.UNALLOCATED.value
SPLITS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (IDLE, tuple(c.value for c in IdleCause), IdleCause.UNEXPLAINED.value),
    (FREE, tuple(c.value for c in FreeCause), FreeCause.NO_DEMAND.value),
)
"""Per split category: its causes in order, and the cause of time no cause row covers."""
CAUSE_HOUR_COLUMNS = [f"{cat}_{cause}_gpu_hours" for cat, causes, _ in SPLITS for cause in causes]
NO_SIGNAL_COLUMNS = [f"{cat}_no_signal_share" for cat, _, _ in SPLITS]
CAUSE_COLUMNS = [*CAUSE_HOUR_COLUMNS, *NO_SIGNAL_COLUMNS]
"""What every report row, the finance CSV and the metrics carry for the splits."""

FIRST_STEP = {
    IdleCause.INPUT_BOUND.value: (
        "the input pipeline: more DataLoader workers, prefetch, pinned memory, local SSD,"
        " packed formats; a CPU limit that fits"
    ),
    IdleCause.HOST_TRANSFER.value: "larger, pinned, overlapped host-device copies; data on the GPU",
    IdleCause.COMMUNICATION.value: "overlap communication with compute; check topology and fabric",
    IdleCause.BATCHING.value: (
        "batch size and concurrency limits, CPU pre/post-processing, model switching"
    ),
    IdleCause.LOW_DEMAND.value: "fewer replicas, autoscaling, or a shared or partitioned card",
    FreeCause.UNAVAILABLE.value: "repair, drain or uncordon the node",
    FreeCause.BLOCKED.value: (
        "pods waited while this card sat free: packing, quotas, node pools (read the"
        " scheduler's message)"
    ),
    FreeCause.NO_DEMAND.value: "nothing asked for it: pool size and autoscaling",
}
"""Who acts first, per cause (SPEC §10's table); `unexplained` has no step."""

_KEYS = ["gpu", "pod_uid", "category"]


def complete_causes(results: pd.DataFrame, causes: pd.DataFrame | None) -> pd.DataFrame:
    """The stored cause rows of the split categories, plus what they leave of each
    (gpu, pod, category) result as the no-signal cause, with the result's other columns
    (team, job, node, ...) joined: one row per (gpu, pod, category, cause) and run."""
    split = results[results["category"].isin([IDLE, FREE])]
    cols = [c for c in split.columns if c not in ("seconds", "category")]
    keyed = split.assign(_pod=split["pod_uid"].fillna(""))
    attrs = keyed.drop_duplicates(["gpu", "_pod"])[[*cols, "_pod"]]
    have = pd.DataFrame(columns=[*_KEYS, "cause", "seconds", "signalled_seconds"])
    if causes is not None and not causes.empty:
        have = causes[causes["category"].isin([IDLE, FREE])]
    have = have.assign(_pod=have["pod_uid"].fillna("").astype(str))
    covered = have.groupby(["gpu", "_pod", "category"])["seconds"].sum()
    total = keyed.groupby(["gpu", "_pod", "category"])["seconds"].sum()
    rest = (total - covered.reindex(total.index).fillna(0.0)).reset_index()
    rest = rest[rest["seconds"] > 1e-6]
    fallback = {cat: cause for cat, _, cause in SPLITS}
    rest = rest.assign(cause=rest["category"].map(fallback), signalled_seconds=0.0)
    both = pd.concat(
        [have[["gpu", "_pod", "category", "cause", "seconds", "signalled_seconds"]], rest],
        ignore_index=True,
    )
    both = both.merge(attrs, on=["gpu", "_pod"], how="inner").drop(columns="_pod")
    return both.astype({"seconds": np.float64, "signalled_seconds": np.float64})


def cause_columns(causes: pd.DataFrame, keys: list[str], index: pd.Index) -> pd.DataFrame:
    """`CAUSE_COLUMNS` per group of `keys` (rows in the order of `index`): GPU-hours per
    cause (0 where none) and the share of each split resting on no signal (NaN where the
    group has none of that category)."""
    out = pd.DataFrame(index=index)
    for cat, names, _ in SPLITS:
        mine = causes[causes["category"] == cat]
        if mine.empty:
            for name in names:
                out[f"{cat}_{name}_gpu_hours"] = 0.0
            out[f"{cat}_no_signal_share"] = np.nan
            continue
        per = mine.groupby([*keys, "cause"])["seconds"].sum() / 3600.0
        present = set(per.index.get_level_values("cause"))
        for name in names:
            col = per.xs(name, level="cause").reindex(index) if name in present else None
            out[f"{cat}_{name}_gpu_hours"] = 0.0 if col is None else col.fillna(0.0).to_numpy()
        sums = mine.groupby(keys)[["seconds", "signalled_seconds"]].sum().reindex(index)
        share = 1.0 - sums["signalled_seconds"] / sums["seconds"].where(sums["seconds"] > 0)
        out[f"{cat}_no_signal_share"] = share.clip(lower=0.0).to_numpy()
    return out


def cause_totals(causes: pd.DataFrame) -> dict[str, float]:
    """Fleet totals of `CAUSE_COLUMNS` (a no-signal share is NaN without its category)."""
    frame = causes.assign(_all="all")
    row = cause_columns(frame, ["_all"], pd.Index(["all"], name="_all"))
    return {c: float(row[c].iloc[0]) for c in CAUSE_COLUMNS}


def leading_cause(causes: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys` and split category: the cause with the most time, other than
    the no-signal fallback (`cause`, `cause_seconds`); none where only it holds."""
    fallback = {cat: cause for cat, _, cause in SPLITS}
    named = causes[causes["cause"] != causes["category"].map(fallback)]
    if named.empty:
        return pd.DataFrame(columns=[*keys, "category", "cause", "cause_seconds"])
    per = named.groupby([*keys, "category", "cause"])["seconds"].sum().reset_index()
    per = per.sort_values(["seconds", "cause"], ascending=[False, True], kind="stable")
    top = per.drop_duplicates([*keys, "category"]).rename(columns={"seconds": "cause_seconds"})
    return top.reset_index(drop=True)
