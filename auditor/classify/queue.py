"""Waiting to be scheduled (SPEC §10 queue waste, a gang's half-start). Pure: frames in,
frames out, no I/O and no clock.

A pod **waited** from its creation until it was bound to a node, or, never bound, until it
ended (finished or deleted), or else until the last time it was seen still waiting
(`wait_seen_ms`): never later than what was seen. Only pods seen waiting count (a wait
reason: `auditor.collect.pod_waits`); a pod first seen already bound says nothing of why it
took its time.

What a pod asks for, in cards (`cards_asked`): its GPU count, times the share of each card
where it asks for a share (a Run:ai fraction, gpu-milli, HAMi cores); a Run:ai reservation
pod asks for none.

A gang's **half-start** (`gang_half_starts`): the pods of one distributed job (one gang of
several pods) bound at different times; until its last pod was bound, the cards its early
pods held could do no work for it. Per such gang: the GPU-seconds its early pods held before
the last one was bound, counting only pods still holding then (one that had ended was of an
earlier attempt).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.model import DEFAULT_CLUSTER

WAIT_COLUMNS = [
    "pod_uid",
    "namespace",
    "name",
    "team",
    "job",
    "gang",
    "cards",
    "start_ms",
    "end_ms",
    "reason",
    "message",
]
DEMAND_COLUMNS = ["kind", "start_ms", "end_ms", "cards"]
HALF_START_COLUMNS = ["gang", "job", "pods", "early_pods", "first_bound_ms", "last_bound_ms",
                      "gpu_seconds"]  # fmt: skip


def cards_asked(gpu_count: pd.Series, gpu_share: pd.Series) -> pd.Series:
    """Cards each pod asks for (module docstring): count × share where a share is set."""
    count = pd.to_numeric(gpu_count, errors="coerce").fillna(0).astype(np.float64)
    share = pd.to_numeric(gpu_share, errors="coerce").astype(np.float64)
    return (count * share.where(share.notna(), 1.0)).astype(np.float64)


def wait_spans(pods: pd.DataFrame) -> pd.DataFrame:
    """One row per pod seen waiting: `WAIT_COLUMNS` plus `kind` (the GPU model it asked for,
    None: any) and `cluster` (its pod's; `DEFAULT_CLUSTER` where the pods name none). `pods`
    holds the store's pod columns and wait_reason, wait_message, wanted_model, wait_seen_ms.
    Pods whose wait has no known start or end, lasted no time, or asked for no card are
    left out."""
    out = {c: pd.Series(dtype=object) for c in [*WAIT_COLUMNS, "kind", "cluster"]}
    empty = pd.DataFrame(out).astype({"cards": np.float64, "start_ms": np.int64,
                                      "end_ms": np.int64})  # fmt: skip
    if pods.empty:
        return empty
    waited = pods[pods["wait_reason"].notna()]
    if waited.empty:
        return empty

    def ms(column: str) -> pd.Series:
        return pd.to_numeric(waited[column], errors="coerce").astype(np.float64)

    start = ms("created_ms").fillna(ms("wait_seen_ms"))
    end = ms("bound_ms")
    ended = pd.concat([ms("finished_ms"), ms("deleted_ms")], axis=1).min(axis=1)
    end = end.where(end.notna(), ended.where(ended.notna(), ms("wait_seen_ms")))
    end = end.where(~(ended < end), ended)  # deleted before bound: waited until deleted
    cards = cards_asked(waited["gpu_count"], waited["gpu_share"])
    keep = start.notna() & end.notna() & (end > start) & (cards > 0)
    frame = pd.DataFrame(
        {
            "pod_uid": waited["uid"].astype(object),
            "namespace": waited["namespace"].astype(object),
            "name": waited["name"].astype(object),
            "team": waited["team"].astype(object),
            "job": waited["job"].astype(object),
            "gang": waited["gang"].astype(object),
            "cards": cards,
            "start_ms": start,
            "end_ms": end,
            "reason": waited["wait_reason"].astype(object),
            "message": waited["wait_message"].astype(object),
            "kind": waited["wanted_model"].astype(object),
            "cluster": (
                waited["cluster"].astype(object) if "cluster" in waited else DEFAULT_CLUSTER
            ),
        }
    )[keep]
    frame = frame.astype({"start_ms": np.int64, "end_ms": np.int64})
    frame["kind"] = frame["kind"].where(frame["kind"].notna(), None)
    frame["message"] = frame["message"].where(frame["message"].notna(), None)
    return frame.sort_values(["start_ms", "pod_uid"], kind="stable").reset_index(drop=True)


def clip(spans: pd.DataFrame, *, start_ms: int, end_ms: int) -> pd.DataFrame:
    """The spans cut to `[start_ms, end_ms)`; those left with no time dropped."""
    lo = spans["start_ms"].clip(lower=start_ms)
    hi = spans["end_ms"].clip(upper=end_ms)
    kept = spans.assign(start_ms=lo, end_ms=hi)[hi > lo]
    return kept.astype({"start_ms": np.int64, "end_ms": np.int64}).reset_index(drop=True)


def demand_of(spans: pd.DataFrame) -> pd.DataFrame:
    """The frame `auditor.classify.free_time.split_unallocated(demand=...)` takes: kind (None:
    any card), start_ms, end_ms (int64), cards (float64)."""
    frame = spans[DEMAND_COLUMNS].reset_index(drop=True)
    frame["kind"] = frame["kind"].astype(object).where(frame["kind"].notna(), None)
    return frame.astype({"start_ms": np.int64, "end_ms": np.int64, "cards": np.float64})


def gang_half_starts(pods: pd.DataFrame, *, min_gap_ms: int = 0) -> pd.DataFrame:
    """Per gang of several pods bound more than `min_gap_ms` apart (module docstring):
    `HALF_START_COLUMNS`; `pods` counts the gang's pods still holding when its last was
    bound, `early_pods` those of them bound before it. `pods` holds uid, gang, job,
    bound_ms, finished_ms, deleted_ms, gpu_count, gpu_share (the store's pods frame)."""
    columns = {c: pd.Series(dtype=object) for c in HALF_START_COLUMNS}
    empty = pd.DataFrame(columns).astype(
        {"pods": np.int64, "early_pods": np.int64, "first_bound_ms": np.int64,
         "last_bound_ms": np.int64, "gpu_seconds": np.float64}
    )  # fmt: skip
    if pods.empty:
        return empty
    bound = pd.to_numeric(pods["bound_ms"], errors="coerce").astype(np.float64)
    ends = pd.concat(
        [pd.to_numeric(pods[c], errors="coerce").astype(np.float64)
         for c in ("finished_ms", "deleted_ms")], axis=1
    ).min(axis=1)  # fmt: skip
    frame = pd.DataFrame(
        {
            "uid": pods["uid"].astype(str),
            "gang": pods["gang"].astype(object),
            "job": pods["job"].astype(object),
            "bound": bound,
            "end": ends,
            "cards": cards_asked(pods["gpu_count"], pods["gpu_share"]),
        }
    )
    frame = frame[frame["bound"].notna() & frame["gang"].notna() & (frame["gang"] != frame["uid"])]
    rows = []
    for gang, group in frame.groupby("gang", sort=True):
        if len(group) < 2:
            continue
        last = float(group["bound"].max())
        members = group[~(group["end"] <= last)]  # ended before: an earlier attempt
        first = float(members["bound"].min())
        if len(members) < 2 or last - first <= min_gap_ms:
            continue
        early = members[members["bound"] < last]
        held = ((last - early["bound"]) * early["cards"]).sum() / 1000.0
        rows.append(
            {
                "gang": gang,
                "job": members["job"].iloc[0],
                "pods": len(members),
                "early_pods": len(early),
                "first_bound_ms": int(first),
                "last_bound_ms": int(last),
                "gpu_seconds": float(held),
            }
        )
    if not rows:
        return empty
    return pd.DataFrame(rows, columns=HALF_START_COLUMNS).astype(empty.dtypes.to_dict())
