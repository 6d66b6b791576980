"""Summaries of audit results: GPU-hours per category and group, shares, utilisation spread.

Input is the results frame the store reads (one row per run, card, pod or none, category,
with the pod's attributes joined). Output frames use the `*_gpu_hours` names of the finance
CSV (SPEC §4) so every format agrees.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.model import CATEGORIES, PLATFORM_TEAM, SCHEDULING_WASTE, WasteCategory
from auditor.model import GroupBy as GroupBy  # noqa: PLC0414 - re-exported: callers import it here
from auditor.report.causes import cause_columns, complete_causes

GROUP_COLUMNS: dict[GroupBy, list[str]] = {
    GroupBy.CLUSTER: ["cluster"],
    GroupBy.TEAM: ["team"],
    GroupBy.NAMESPACE: ["namespace"],
    GroupBy.JOB: ["team", "namespace", "job"],
    GroupBy.POD: ["team", "namespace", "pod"],
    GroupBy.NODE: ["node"],
    GroupBy.GPU: ["node", "gpu"],
}

HOURS_COLUMNS = [f"{c}_gpu_hours" for c in CATEGORIES]

NAMED_IN_CLUSTER = (GroupBy.JOB, GroupBy.POD, GroupBy.NODE, GroupBy.GPU)
"""Groupings whose names are unique only inside a cluster (two clusters may both have a
node `gpu-1`, or a job `ml/train` of pods `ml/train-0`: other objects, however alike): with
results of several clusters their rows are per cluster too. A team or a namespace is one
across clusters."""


def group_keys(by: GroupBy, results: pd.DataFrame) -> list[str]:
    """The columns rows `by` are keyed on: `GROUP_COLUMNS`, with the cluster first for a
    job, pod, node or card of results from more than one cluster (SPEC §11)."""
    keys = GROUP_COLUMNS[by]
    several = "cluster" in results.columns and results["cluster"].nunique() > 1
    return ["cluster", *keys] if by in NAMED_IN_CLUSTER and several else list(keys)


def node_count(results: pd.DataFrame) -> int:
    """Distinct nodes of the results: a node name is one node per cluster."""
    if "cluster" not in results.columns:
        return int(results["node"].nunique())
    return len(results[["cluster", "node"]].drop_duplicates())


def with_platform(results: pd.DataFrame) -> pd.DataFrame:
    """Rows of no pod belong to the platform: team/namespace/job/pod `(platform)`.

    Also fills what older stores lack: `estimated` (no estimated attribution), `card` (the
    physical card: the GPU itself), `share` (unknown)."""
    out = results.copy()
    if "estimated" not in out.columns:
        out["estimated"] = False
    out["estimated"] = out["estimated"].fillna(False).astype(bool)
    if "card" not in out.columns:
        out["card"] = out["gpu"]
    if "share" not in out.columns:
        out["share"] = np.nan
    unheld = out["pod_uid"].isna()
    for col in ("team", "namespace", "job", "pod"):
        out[col] = out[col].astype("object")
        out.loc[unheld, col] = PLATFORM_TEAM
    out["held"] = ~unheld
    return out


def card_utilisation(results: pd.DataFrame) -> pd.DataFrame:
    """Per held card (card × pod): busy share of its observed held time, in percent."""
    held = results[results["pod_uid"].notna()]
    if held.empty:
        # typed, so that a window in which no pod held a card still summarises
        return pd.DataFrame(
            {
                "gpu": pd.Series(dtype=object),
                "pod_uid": pd.Series(dtype=object),
                "util_pct": pd.Series(dtype="float64"),
            }
        )
    pivot = held.pivot_table(
        index=["gpu", "pod_uid"],
        columns="category",
        values="seconds",
        aggfunc="sum",
        fill_value=0.0,
    )
    total = pivot.sum(axis=1)
    unobserved = pivot.get(WasteCategory.UNOBSERVED.value, pd.Series(0.0, index=pivot.index))
    busy = pivot.get(WasteCategory.BUSY.value, pd.Series(0.0, index=pivot.index))
    observed = total - unobserved
    util = (100.0 * busy / observed.where(observed > 0)).rename("util_pct")
    return util.dropna().reset_index()


def summarise(
    results: pd.DataFrame,
    *,
    by: GroupBy,
    team: str | None = None,
    causes: pd.DataFrame | None = None,
    split: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per group: GPU-hours per category, waste apart, shares, p10/p50/p90, inferred,
    and the causes inside `compute_idle` and `unallocated` (`auditor.report.causes`) of the
    stored cause rows `causes` (gpu, pod_uid, category, cause, seconds, signalled_seconds).
    `split`: those rows completed (`complete_causes` of the team's results, platform
    included), where the caller has them already; then `causes` is not read."""
    frame = with_platform(results)
    if team is not None:
        frame = frame[frame["team"] == team]
    if split is None:
        split = complete_causes(frame, causes)
    if by is GroupBy.GPU:  # a MIG instance is a part of its physical card
        frame = frame.assign(gpu=frame["card"])
        split = split.assign(gpu=split["card"])
    keys = group_keys(by, frame)
    hours = frame.assign(hours=frame["seconds"] / 3600.0).pivot_table(
        index=keys, columns="category", values="hours", aggfunc="sum", fill_value=0.0
    )
    for cat in CATEGORIES:
        if cat.value not in hours.columns:
            hours[cat.value] = 0.0
    hours = hours[[c.value for c in CATEGORIES]]
    hours.columns = pd.Index(HOURS_COLUMNS)
    held_hours = frame[frame["held"]].assign(h=frame["seconds"] / 3600.0).groupby(keys)["h"].sum()
    out = hours.copy()
    out.insert(0, "allocated_gpu_hours", held_hours.reindex(out.index).fillna(0.0))
    out["scheduling_waste_gpu_hours"] = out[[f"{c}_gpu_hours" for c in SCHEDULING_WASTE]].sum(
        axis=1
    )
    out["capacity_gpu_hours"] = out[HOURS_COLUMNS].sum(axis=1)
    allocated = out["allocated_gpu_hours"].where(out["allocated_gpu_hours"] > 0)
    held_busy = (
        frame[frame["held"] & (frame["category"] == WasteCategory.BUSY.value)]
        .assign(h=frame["seconds"] / 3600.0)
        .groupby(keys)["h"]
        .sum()
    )
    out["busy_share"] = held_busy.reindex(out.index).fillna(0.0) / allocated
    out["scheduling_waste_share"] = out["scheduling_waste_gpu_hours"] / allocated
    out["compute_idle_share"] = out["compute_idle_gpu_hours"] / allocated
    inferred_hours = (
        frame[frame["inferred"] & frame["held"]]
        .assign(h=frame["seconds"] / 3600.0)
        .groupby(keys)["h"]
        .sum()
    )
    out["inferred_share"] = inferred_hours.reindex(out.index).fillna(0.0) / allocated
    estimated_hours = (
        frame[frame["estimated"] & frame["held"]]
        .assign(h=frame["seconds"] / 3600.0)
        .groupby(keys)["h"]
        .sum()
    )
    out["estimated_share"] = estimated_hours.reindex(out.index).fillna(0.0) / allocated
    if by is GroupBy.GPU:
        out["tenants"] = _tenants(frame, keys).reindex(out.index)
    if by is GroupBy.POD:
        out["share"] = frame[frame["held"]].groupby(keys)["share"].max().reindex(out.index)
    card_keys = list(dict.fromkeys([*keys, "gpu", "pod_uid"]))
    util = card_utilisation(frame).merge(frame[card_keys].drop_duplicates(), on=["gpu", "pod_uid"])
    quantiles = util.groupby(keys)["util_pct"].quantile(np.array([0.1, 0.5, 0.9])).unstack()
    for q, name in ((0.1, "util_p10"), (0.5, "util_p50"), (0.9, "util_p90")):
        out[name] = quantiles[q].reindex(out.index) if q in quantiles.columns else np.nan
    if by is GroupBy.GPU:  # one card: its utilisation, not quantiles over its holders
        out[["util_p10", "util_p50", "util_p90"]] = np.nan
        card = held_cards_utilisation(frame).set_index("gpu")["util_pct"]
        out["util_pct"] = card.reindex(out.index.get_level_values("gpu")).to_numpy()
    out = out.join(cause_columns(split, keys, out.index))
    out = out.reset_index()
    platform_last = (out[keys[0]] == PLATFORM_TEAM).astype(int)
    return (
        out.assign(_p=platform_last)
        .sort_values(
            ["_p", "allocated_gpu_hours", *keys], ascending=[True, False] + [True] * len(keys)
        )
        .drop(columns="_p")
        .reset_index(drop=True)
    )


TENANTS_SHOWN = 5
"""Tenants named per card in `--by gpu` rows; the rest are counted."""


def _tenants(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per card: its tenants in the window as `namespace/pod (share)`, most held first."""
    held = frame[frame["held"]]
    if held.empty:
        return pd.Series(dtype=object)
    per = (
        held.groupby([*keys, "namespace", "pod"], dropna=False)
        .agg(seconds=("seconds", "sum"), share=("share", "max"))
        .reset_index()
        .sort_values(
            [*keys, "seconds", "namespace", "pod"],
            ascending=[*[True] * len(keys), False, True, True],
        )
    )

    def names(group: pd.DataFrame) -> str:
        parts = [
            f"{ns}/{pod}" + ("" if pd.isna(share) else f" ({share:.2g})")
            for ns, pod, share in group[["namespace", "pod", "share"]].itertuples(index=False)
        ]
        more = len(parts) - TENANTS_SHOWN
        return "; ".join(parts[:TENANTS_SHOWN]) + (f"; +{more} more" if more > 0 else "")

    return per.groupby(keys)[["namespace", "pod", "share"]].apply(names)


def held_cards_utilisation(results: pd.DataFrame) -> pd.DataFrame:
    """Per physical card that a pod held in the window: busy share of its observed held
    time, in percent, over all the pods that held it (one row per card, not per pod)."""
    held = with_platform(results)
    held = held[held["held"]]
    observed = held[held["category"] != WasteCategory.UNOBSERVED.value]
    seconds = observed.groupby("card")["seconds"].sum()
    busy = observed[observed["category"] == WasteCategory.BUSY.value].groupby("card")["seconds"]
    util = 100.0 * busy.sum().reindex(seconds.index).fillna(0.0) / seconds.where(seconds > 0)
    return util.rename("util_pct").dropna().rename_axis("gpu").reset_index()


def unjoined_cards(results: pd.DataFrame) -> list[str]:
    """Cards that pods held but no sample names: every second of theirs is `unobserved`
    of a pod (the classifier's `unsampled` rows). Usually the samples name the cards
    otherwise (a log without a `uuid` column names them NODE/pci.bus_id)."""
    if results.empty:
        return []
    held = results["pod_uid"].notna()
    only = results.groupby("gpu")["category"].agg(
        lambda c: set(c) == {WasteCategory.UNOBSERVED.value}
    )
    named = set(results.loc[held, "gpu"].astype(str))
    return sorted(str(g) for g in only.index[only.to_numpy()] if str(g) in named)


def nodes_without_pods(results: pd.DataFrame) -> list[str]:
    """Nodes whose cards no known pod held at any time of the results: their pods were
    not imported (or nothing ran there)."""
    if "node" not in results.columns or results.empty:
        return []
    held = results["pod_uid"].notna().groupby(results["node"]).any()
    return sorted(str(n) for n in held.index[~held.to_numpy()])


def totals(results: pd.DataFrame) -> dict[str, float]:
    """Fleet totals in GPU-hours per category, plus allocated and scheduling waste."""
    frame = with_platform(results)
    per = frame.groupby("category")["seconds"].sum() / 3600.0
    out = {f"{c}_gpu_hours": float(per.get(c.value, 0.0)) for c in CATEGORIES}
    out["allocated_gpu_hours"] = float(frame.loc[frame["held"], "seconds"].sum() / 3600.0)
    unheld_busy = ~frame["held"] & (frame["category"] == WasteCategory.BUSY.value)
    out["unheld_busy_gpu_hours"] = float(frame.loc[unheld_busy, "seconds"].sum() / 3600.0)
    out["scheduling_waste_gpu_hours"] = sum(out[f"{c}_gpu_hours"] for c in SCHEDULING_WASTE)
    out["capacity_gpu_hours"] = float(frame["seconds"].sum() / 3600.0)
    inferred = frame.loc[frame["held"] & frame["inferred"], "seconds"].sum() / 3600.0
    alloc = out["allocated_gpu_hours"]
    out["inferred_share"] = float(inferred / alloc) if alloc > 0 else 0.0
    estimated = frame.loc[frame["held"] & frame["estimated"], "seconds"].sum() / 3600.0
    out["estimated_share"] = float(estimated / alloc) if alloc > 0 else 0.0
    return out
