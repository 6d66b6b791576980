"""Idle policies replayed over history (SPEC §9): what culling would have released, whom it hurt.

A policy (`parse_policy`) is an idle length, optionally scoped to a workload kind and a team,
with a start-up grace and its own idle test (`util<N`). The replay reads the classifier's own
pieces (`classify(..., keep_pieces=True)`), so coverage, gaps and categories are exactly the
audit's; nothing here re-derives them:

- An observed row is a held, covered, readable piece of a sample; its utilisation is its
  busy seconds over its length. Unobserved pieces (coverage gaps, unreadable samples) neither
  count as idle nor break an idle stretch, as in the classifier's idle runs.
- A card's idle stretch is a maximal sequence of idle rows of one pod with no active row in
  between; its length is its observed idle time after `bound + grace` (the first `grace` after
  the pod bound the card never counts). The policy fires on a card the instant that length
  reaches `idle`.
- The whole gang is stopped at the earliest instant the policy fires on any of its cards
  (stopping one rank stops the job). Gangs are in scope when any of their pods matches
  `kind` (the pod's workload kind, e.g. Notebook, PyTorchJob; case-insensitive) and `team`.
- After the stop, what each pod of the gang still held inside the window is **released**, by
  the category the classifier gave it (never `busy`; `unobserved` time is neither released nor
  lost), and its busy seconds are **lost**. A stop is a **false stop** for each pod that had an
  active row (by the policy's idle test) after it.
- Spared pods (in scope, never stopped): the longest idle stretch each reached, to show how
  close the policy came.

Stops count in the window that holds their instant; released and lost time is clipped to the
window, so adjacent windows add up. Everything is vectorised over rows; the output is sorted
and rounded in the renderers, so the same store gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from auditor.classify.arrays import (
    INT_MIN,
    BoolArr,
    FloatArr,
    IntArr,
    ObjArr,
    ascending,
    order_by,
    run_factorize,
    run_isin,
    starts_of,
)
from auditor.classify.policy import Policy, parse_policy
from auditor.model import WasteCategory, Window
from auditor.settings import Thresholds

__all__ = ["Policy", "WhatIf", "card_rows", "parse_policy", "replay", "replay_pods", "what_if"]

RELEASED = [
    WasteCategory.RESERVED_IDLE,
    WasteCategory.COMPUTE_IDLE,
    WasteCategory.TEARDOWN,
    WasteCategory.STARTUP,
    WasteCategory.CHECKPOINT,
    WasteCategory.STRAGGLER_WAIT,
]
"""Categories a stop can release, in the order the outputs show them."""

# ---------------------------------------------------------------- rows from pieces

ROW_COLUMNS = ["gpu", "pod_uid", "start_ms", "end_ms", "observed", "util", "busy", *RELEASED]


def card_rows(pieces: pd.DataFrame) -> pd.DataFrame:
    """The classifier's held pieces as one row per stretch of a card: gpu, pod_uid, start_ms,
    end_ms, observed, util (percent, NaN where unobserved), busy and each released category
    (seconds). Sorted by gpu, pod_uid, start_ms."""
    held = pieces[pieces["pod_uid"].notna()]
    key = ["gpu", "pod_uid", "start_ms", "end_ms"]
    if held.empty:
        frame = pd.DataFrame({c: pd.Series([], dtype=object) for c in key[:2]})
        frame["start_ms"] = pd.Series([], dtype=np.int64)
        frame["end_ms"] = pd.Series([], dtype=np.int64)
        frame["observed"] = pd.Series([], dtype=bool)
        for c in ("util", "busy", *RELEASED):
            frame[str(c)] = pd.Series([], dtype=np.float64)
        return frame
    # One sort by codes and one pass of sums, where pandas grouped five keys and unstacked
    # them: the pieces come sorted by card and pod, so only their runs' names are hashed,
    # and the classifier's come in this order already (only another's are sorted).
    gpu, gpu_names = run_factorize(held["gpu"], sort=True)
    pod, pod_names = run_factorize(held["pod_uid"], sort=True)
    category, category_names = pd.factorize(held["category"])
    start = held["start_ms"].to_numpy(dtype=np.int64)
    end = held["end_ms"].to_numpy(dtype=np.int64)
    seconds = held["seconds"].to_numpy(dtype=np.float64)
    if not ascending(gpu, pod, start, end):
        order = order_by(gpu, pod, start - start.min(), end - end.min())
        gpu, pod, start, end = gpu[order], pod[order], start[order], end[order]
        category, seconds = category[order], seconds[order]
    first = starts_of(gpu, pod, start, end)
    group = np.cumsum(first) - 1
    at = np.flatnonzero(first)
    cells = np.zeros((at.size, len(category_names)))
    np.add.at(cells, (group, category), seconds)
    column = {str(name): cells[:, i] for i, name in enumerate(category_names)}
    none = np.zeros(at.size)
    length = (end[at] - start[at]).astype(np.float64) / 1000.0
    busy = column.get("busy", none)
    observed = column.get("unobserved", none) <= 0
    util = np.where(observed, 100.0 * busy / np.maximum(length, 1e-9), np.nan)
    out = pd.DataFrame(
        {
            "gpu": gpu_names[gpu[at]],
            "pod_uid": pod_names[pod[at]],
            "start_ms": start[at],
            "end_ms": end[at],
            "observed": observed,
            "util": util,
            "busy": busy,
        }
    )
    for c in RELEASED:
        out[str(c)] = column.get(str(c), none)
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- the replay


@dataclass(frozen=True)
class WhatIf:
    """What `replay` returns.

    `rows`: one per (policy, team) in scope, policy in the order given, teams sorted:
    pods_stopped, false_stops, released_gpu_hours, released_<category>_gpu_hours,
    busy_lost_gpu_hours, held_idle_gpu_hours (the scope's held non-busy, observed time in the
    window: what any policy could at most release), longest_spared_idle_hours.
    `stops`: one per stopped gang and pod: policy, gang, pod (namespace/name where known),
    pod_uid, team, stop_ms, false_stop,
    busy_lost_gpu_hours, released_gpu_hours; sorted by policy order, stop_ms, gang, pod.
    """

    window: Window
    policies: tuple[str, ...]
    rows: pd.DataFrame
    stops: pd.DataFrame

    def totals(self) -> pd.DataFrame:
        """One row per policy, in the order given, summed over teams (team `(all)`;
        the longest spared stretch is the longest of any team's)."""
        sums = [c for c in ROW_OUT if c not in ("policy", "team", "longest_spared_idle_hours")]
        out = []
        for policy in self.policies:
            mine = self.rows[self.rows["policy"] == policy]
            rec: dict[str, object] = {"policy": policy, "team": ALL_TEAMS}
            for c in sums:
                rec[c] = mine[c].sum() if len(mine) else 0
            longest = mine["longest_spared_idle_hours"].max() if len(mine) else 0.0
            rec["longest_spared_idle_hours"] = 0.0 if pd.isna(longest) else float(longest)
            out.append(rec)
        frame = pd.DataFrame(out, columns=ROW_OUT)
        for c in ("pods_stopped", "false_stops"):
            frame[c] = frame[c].astype(np.int64)
        return frame


ALL_TEAMS = "(all)"


def _released_col(cat: WasteCategory) -> str:
    return f"released_{cat.value}_gpu_hours"


ROW_OUT = [
    "policy",
    "team",
    "pods_stopped",
    "false_stops",
    "released_gpu_hours",
    *(_released_col(c) for c in RELEASED),
    "busy_lost_gpu_hours",
    "held_idle_gpu_hours",
    "longest_spared_idle_hours",
]
STOP_OUT = [
    "policy",
    "gang",
    "pod",
    "pod_uid",
    "team",
    "stop_ms",
    "false_stop",
    "released_gpu_hours",
    "busy_lost_gpu_hours",
]


def _in_scope(pods: pd.DataFrame, policy: Policy) -> np.ndarray:
    keep = np.ones(len(pods), dtype=np.bool_)
    if policy.kind is not None:
        keep &= pods["job_kind"].astype(str).str.lower().to_numpy() == policy.kind.lower()
    if policy.team is not None:
        keep &= pods["team"].astype(str).to_numpy() == policy.team
    return keep


POD_OUT = [
    "policy",
    "pod_uid",
    "pod",
    "gang",
    "team",
    "stop_ms",
    "stopped",
    "false_stop",
    "released",
    *(_released_col(c) for c in RELEASED),
    "lost",
    "held_idle",
    "spared_streak_ms",
]


def replay_pods(
    rows: pd.DataFrame,
    *,
    pods: pd.DataFrame,
    tenures: pd.DataFrame,
    policies: Sequence[Policy],
    window: Window,
    thresholds: Thresholds,
) -> pd.DataFrame:
    """Each policy replayed over `rows` (`card_rows` of pieces covering whole tenures): one
    row per policy (its position in `policies`) and pod in its scope, columns `POD_OUT`
    (seconds; `stop_ms` NaN where the pod's job was never stopped; `stopped` where it was,
    within the window). Every card of a gang must be in `rows` for its stop to be right.

    `pods`: uid, team, job_kind, optionally namespace and name (one row per pod).
    `tenures`: gpu, pod_uid, gang, start_ms (the binding on that card), as `build_tenures`
    makes them."""
    w0, w1 = window
    bound = tenures.groupby(["gpu", "pod_uid"], sort=False)["start_ms"].min()
    gang_of = tenures.drop_duplicates("pod_uid").set_index("pod_uid")["gang"].astype(str)
    info = pods.drop_duplicates("uid").set_index("uid")
    rows = rows[run_isin(rows["pod_uid"], gang_of.index)].reset_index(drop=True)
    # Each pod's and card's lookups are done once per run of its rows (they come sorted by
    # card and pod) and spread by codes: hashing the rows' strings cost most of the replay.
    code, uids = run_factorize(rows["pod_uid"], sort=True)
    pod = uids[code]
    gang_u = gang_of.reindex(uids)
    gang_names = gang_u.to_numpy(dtype=object)
    gang = gang_names[code]
    team_u = info["team"].reindex(uids).fillna("").astype(str).to_numpy(dtype=object)
    label_u = pd.Series(uids, dtype=object)
    if {"namespace", "name"} <= set(info.columns):  # namespace/name, as people know the pod
        names = (info["namespace"].astype(str) + "/" + info["name"].astype(str)).reindex(uids)
        label_u = names.fillna(label_u.set_axis(names.index)).reset_index(drop=True)
    labels = label_u.to_numpy(dtype=object)
    start = rows["start_ms"].to_numpy(dtype=np.int64)
    end = rows["end_ms"].to_numpy(dtype=np.int64)
    length = np.maximum(end - start, 1).astype(np.float64)
    observed = rows["observed"].to_numpy(dtype=np.bool_)
    util = np.nan_to_num(rows["util"].to_numpy(dtype=np.float64), nan=100.0)
    new_card = np.ones(len(rows), dtype=np.bool_)
    if len(rows):
        same = (rows["gpu"].to_numpy()[1:] == rows["gpu"].to_numpy()[:-1]) & (pod[1:] == pod[:-1])
        new_card[1:] = ~same
    heads = np.flatnonzero(new_card)
    idx = pd.MultiIndex.from_arrays([rows["gpu"].to_numpy()[heads], pod[heads]])
    card_bound = np.repeat(
        bound.reindex(idx).to_numpy(dtype=np.float64), np.diff(np.append(heads, len(rows)))
    )
    card_bound = np.where(np.isnan(card_bound), start, card_bound).astype(np.int64)
    in_window = np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0, None) / length
    cat_seconds = np.stack([rows[str(c)].to_numpy(dtype=np.float64) for c in RELEASED], axis=1)
    busy = rows["busy"].to_numpy(dtype=np.float64)
    idle_held = cat_seconds.sum(axis=1) * in_window
    # scope is decided over every pod of the tenures, with samples or not
    present = info.reindex(pd.Index(sorted(gang_of.index))).reset_index(names="uid")
    uid_series = pd.Series(uids, dtype=object)

    out: list[pd.DataFrame] = []
    for number, policy in enumerate(policies):
        eligible_pods = present["uid"][_in_scope(present, policy)]
        eligible_u = uid_series.isin(eligible_pods).to_numpy(dtype=np.bool_)
        pod_eligible = eligible_u[code]
        scope = gang_u.isin(gang_of.reindex(eligible_pods)).to_numpy(dtype=np.bool_)[code]

        idle = observed & policy.idle(util, thresholds)
        active = observed & ~idle
        counted_from = np.maximum(start, card_bound + policy.grace_ms)
        counted = np.where(idle, np.clip(end - counted_from, 0, None), 0).astype(np.int64)
        # observed idle time so far in each card's current stretch (an active row ends one)
        run = np.cumsum(active | new_card)
        total = np.cumsum(counted)
        cum = total
        if run.size:
            first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
            cum = total - np.repeat(total[first] - counted[first], np.diff(np.r_[first, run.size]))
        fires = pod_eligible & idle & (counted > 0) & (cum >= policy.idle_ms)
        fired = pd.DataFrame({"gang": gang[fires], "at": (end - (cum - policy.idle_ms))[fires]})
        first_stop = fired.groupby("gang")["at"].min()
        stop_u = first_stop.reindex(gang_u).to_numpy(dtype=np.float64)
        stop_ms = stop_u[code]
        stopped = scope & ~np.isnan(stop_ms)
        stop_row = np.where(stopped, stop_ms, np.inf)
        after = np.clip(np.minimum(end, w1) - np.maximum(start, np.maximum(stop_row, w0)), 0, None)
        after = np.where(stopped, after / length, 0.0)
        released = cat_seconds * after[:, None]

        scoped = released[scope]
        per_pod = _per_pod(
            code[scope],
            uids=uids,
            each={
                "pod": labels,
                "gang": gang_names,
                "team": team_u,
                "eligible": eligible_u,
                "stop_ms": stop_u,
            },
            any_of={
                "held_after": (stopped & (end > stop_row))[scope],
                "active_after": (stopped & active & (end > stop_row))[scope],
            },
            sums={
                "lost": (busy * after)[scope],
                "released": scoped.sum(axis=1),
                "held_idle": idle_held[scope],
                **{_released_col(c): scoped[:, i] for i, c in enumerate(RELEASED)},
            },
            most={"streak": np.where(pod_eligible & (end > w0) & (start < w1), cum, 0)[scope]},
        )
        stop = per_pod["stop_ms"].to_numpy(dtype=np.float64)
        counts = per_pod["held_after"].to_numpy(dtype=np.bool_) & (stop >= w0) & (stop < w1)
        per_pod["stopped"] = counts
        per_pod["false_stop"] = counts & per_pod["active_after"].to_numpy(dtype=np.bool_)
        per_pod["spared_streak_ms"] = np.where(
            per_pod["eligible"].to_numpy(dtype=np.bool_) & np.isnan(stop), per_pod["streak"], 0
        ).astype(np.int64)
        per_pod["policy"] = number
        out.append(per_pod.reset_index()[POD_OUT])
    if not out:
        return pd.DataFrame(columns=POD_OUT)
    return pd.concat(out, ignore_index=True)


def _per_pod(
    code: IntArr,
    *,
    uids: ObjArr,
    each: dict[str, npt.NDArray[Any]],
    any_of: dict[str, BoolArr],
    sums: dict[str, FloatArr],
    most: dict[str, IntArr],
) -> pd.DataFrame:
    """One row per pod among the rows' `code`s (into `uids`), indexed by pod_uid in code
    order: `each` pod's own value (arrays over `uids`), whether `any_of` its rows is true,
    the `sums` of its rows (pandas' compensated sums, in row order) and the `most` of them.

    By codes, where a groupby took the first of each pod's repeated names per row."""
    seen = np.bincount(code, minlength=uids.size) > 0
    present = np.flatnonzero(seen)
    at = (np.cumsum(seen) - 1)[code]
    out: dict[str, npt.NDArray[Any]] = {name: values[present] for name, values in each.items()}
    for name, flags in any_of.items():
        hit = np.zeros(present.size, dtype=np.bool_)
        hit[at[flags]] = True
        out[name] = hit
    summed = pd.DataFrame(sums).groupby(at, sort=True).sum()
    for name in sums:
        out[name] = summed[name].to_numpy(dtype=np.float64)
    for name, values in most.items():
        top = np.full(present.size, INT_MIN, dtype=np.int64)
        np.maximum.at(top, at, values)
        out[name] = top
    return pd.DataFrame(out, index=pd.Index(uids[present], name="pod_uid"))


def summarise(per_pod: pd.DataFrame, *, policies: Sequence[Policy], window: Window) -> WhatIf:
    """`replay_pods` rows (of one replay, or of several chunks of pods) per policy and team."""
    out_rows: list[pd.DataFrame] = []
    out_stops: list[pd.DataFrame] = []
    for number, policy in enumerate(policies):
        mine = per_pod[per_pod["policy"] == number]
        teams = mine.groupby("team", sort=True)
        agg = pd.DataFrame(
            {
                "pods_stopped": teams["stopped"].sum().astype(np.int64),
                "false_stops": teams["false_stop"].sum().astype(np.int64),
                "released_gpu_hours": teams["released"].sum() / 3600.0,
                **{_released_col(c): teams[_released_col(c)].sum() / 3600.0 for c in RELEASED},
                "busy_lost_gpu_hours": teams["lost"].sum() / 3600.0,
                "held_idle_gpu_hours": teams["held_idle"].sum() / 3600.0,
                "longest_spared_idle_hours": teams["spared_streak_ms"].max() / 3_600_000.0,
            }
        ).reset_index()
        agg.insert(0, "policy", policy.text)
        out_rows.append(agg[ROW_OUT])
        hit = mine[mine["stopped"].astype(bool)]
        out_stops.append(
            pd.DataFrame(
                {
                    "policy": policy.text,
                    "gang": hit["gang"].astype(str),
                    "pod": hit["pod"].astype(str),
                    "pod_uid": hit["pod_uid"].astype(str),
                    "team": hit["team"].astype(str),
                    "stop_ms": hit["stop_ms"].astype(np.int64),
                    "false_stop": hit["false_stop"].astype(bool),
                    "released_gpu_hours": hit["released"] / 3600.0,
                    "busy_lost_gpu_hours": hit["lost"] / 3600.0,
                }
            )
            .sort_values(["stop_ms", "gang", "pod_uid"], kind="stable")
            .reset_index(drop=True)[STOP_OUT]
        )
    rows_out = pd.concat(out_rows, ignore_index=True) if out_rows else pd.DataFrame(columns=ROW_OUT)
    stops_out = (
        pd.concat(out_stops, ignore_index=True) if out_stops else pd.DataFrame(columns=STOP_OUT)
    )
    return WhatIf(
        window=window, policies=tuple(p.text for p in policies), rows=rows_out, stops=stops_out
    )


def replay(
    rows: pd.DataFrame,
    *,
    pods: pd.DataFrame,
    tenures: pd.DataFrame,
    policies: Sequence[Policy],
    window: Window,
    thresholds: Thresholds,
) -> WhatIf:
    """`replay_pods` summarised per policy and team."""
    per_pod = replay_pods(
        rows, pods=pods, tenures=tenures, policies=policies, window=window, thresholds=thresholds
    )
    return summarise(per_pod, policies=policies, window=window)


def in_play(tenures: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The tenures of every gang that held a card in the window: a job is replayed whole."""
    w0, w1 = window
    overlap = (tenures["start_ms"] < w1) & (tenures["end_ms"] > w0)
    return tenures[tenures["gang"].isin(set(tenures.loc[overlap, "gang"]))]


def span(tenures: pd.DataFrame, window: Window) -> Window:
    """The window stretched to the whole of `tenures`: what the replay classifies."""
    if tenures.empty:
        return window
    return Window(
        min(window[0], int(tenures["start_ms"].min())),
        max(window[1], int(tenures["end_ms"].max())),
    )


def what_if(
    samples: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    pods: pd.DataFrame,
    policies: Sequence[Policy],
    window: Window,
    thresholds: Thresholds,
    markers: pd.DataFrame | None = None,
) -> WhatIf:
    """Classify the whole tenures that overlap `window` (SPEC §3 "Whole tenures") and replay
    each policy over them: a pod idle since before the window is stopped as a policy that had
    been on all along would have stopped it. Every gang that held a card in the window is
    classified and replayed whole."""
    from auditor.classify.pipeline import classify

    over = in_play(tenures, window)
    lo, hi = span(over, window)
    found = classify(
        samples,
        over,
        window=Window(lo, hi),
        thresholds=thresholds,
        markers=markers,
        keep_pieces=True,
    )
    assert found.pieces is not None
    return replay(
        card_rows(found.pieces),
        pods=pods,
        tenures=over,
        policies=policies,
        window=window,
        thresholds=thresholds,
    )
