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

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.errors import InputError
from auditor.model import WasteCategory
from auditor.settings import Thresholds

RELEASED = [
    WasteCategory.RESERVED_IDLE,
    WasteCategory.COMPUTE_IDLE,
    WasteCategory.TEARDOWN,
    WasteCategory.STARTUP,
    WasteCategory.CHECKPOINT,
    WasteCategory.STRAGGLER_WAIT,
]
"""Categories a stop can release, in the order the outputs show them."""

UTIL_EPSILON = 1e-9
"""Utilisation is recovered from seconds (busy / length): compare with this much slack."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FIELDS = ("idle", "kind", "team", "grace", "util")


@dataclass(frozen=True)
class Policy:
    """One culling policy as `parse_policy` reads it."""

    text: str
    """The spec as given (stripped): the policy's name in every output."""
    idle_ms: int
    kind: str | None = None
    team: str | None = None
    grace_ms: int = 0
    util_below: float | None = None
    """A row is idle when its utilisation is below this (percent); None: the classifier's
    test, at most `idle_threshold_pct`."""

    def idle(self, util: np.ndarray, thresholds: Thresholds) -> np.ndarray:
        if self.util_below is None:
            return np.asarray(util <= thresholds.idle_threshold_pct + UTIL_EPSILON)
        return np.asarray(util < self.util_below - UTIL_EPSILON)


def _duration_ms(text: str, *, field: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if not m:
        raise InputError(f"not a duration like 30m, 2h, 1d: {text.strip()!r}", field=field)
    return round(float(m.group(1)) * _UNITS[m.group(2)] * 1000)


def parse_policy(text: str) -> Policy:
    """`idle>=2h[,kind=Notebook][,team=research][,grace=1h][,util<10]` → a Policy.

    A bad spec raises one `InputError` naming the field (`--policy idle`, ...)."""
    spec = text.strip()
    values: dict[str, str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        m = re.fullmatch(r"([A-Za-z_]+)\s*(>=|<=|<|=)\s*(.*)", item)
        if not m:
            raise InputError(
                f"expected NAME=VALUE, idle>=DURATION or util<PERCENT, got {item!r}",
                field="--policy",
            )
        name, op, value = m.group(1).lower(), m.group(2), m.group(3).strip()
        field = f"--policy {name}"
        if name not in _FIELDS:
            raise InputError(f"unknown field {name!r} (known: {', '.join(_FIELDS)})", field=field)
        if name in values:
            raise InputError(f"{name} given twice in {spec!r}", field=field)
        wanted = {"idle": (">=",), "util": ("<", "<=")}.get(name, ("=",))
        if op not in wanted:
            raise InputError(f"{name} takes {' or '.join(wanted)}, got {op!r}", field=field)
        if not value:
            raise InputError(f"{name} has no value", field=field)
        values[name] = f"{op}{value}" if name == "util" else value
    if "idle" not in values:
        raise InputError(
            f"a policy needs an idle length, e.g. idle>=2h: {spec!r}", field="--policy idle"
        )
    idle_ms = _duration_ms(values["idle"], field="--policy idle")
    if idle_ms <= 0:
        raise InputError("the idle length must be positive", field="--policy idle")
    util_below: float | None = None
    if "util" in values:
        op, number = (
            ("<=", values["util"][2:])
            if values["util"].startswith("<=")
            else (
                "<",
                values["util"][1:],
            )
        )
        try:
            pct = float(number)
        except ValueError:
            raise InputError(f"not a percentage: {number!r}", field="--policy util") from None
        if not 0 < pct <= 100 or math.isnan(pct):
            raise InputError(f"a percentage in (0, 100], got {number!r}", field="--policy util")
        # util<=N is util<N+ε: both compare against the utilisation as stored
        util_below = pct + 2 * UTIL_EPSILON if op == "<=" else pct
    return Policy(
        text=spec,
        idle_ms=idle_ms,
        kind=values.get("kind"),
        team=values.get("team"),
        grace_ms=_duration_ms(values["grace"], field="--policy grace") if "grace" in values else 0,
        util_below=util_below,
    )


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
    wide = (
        held.groupby([*key, "category"], sort=True, observed=True)["seconds"]
        .sum()
        .unstack("category")
        .fillna(0.0)
    )
    for c in ("busy", "unobserved", *RELEASED):
        if str(c) not in wide.columns:
            wide[str(c)] = 0.0
    wide = wide.reset_index()
    length = (wide["end_ms"] - wide["start_ms"]).to_numpy(dtype=np.float64) / 1000.0
    observed = wide["unobserved"].to_numpy() <= 0
    util = np.where(observed, 100.0 * wide["busy"].to_numpy() / np.maximum(length, 1e-9), np.nan)
    out = wide[key].copy()
    out["observed"] = observed
    out["util"] = util
    out["busy"] = wide["busy"].to_numpy(dtype=np.float64)
    for c in RELEASED:
        out[str(c)] = wide[str(c)].to_numpy(dtype=np.float64)
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- the replay


@dataclass(frozen=True)
class WhatIf:
    """What `replay` returns.

    `rows`: one per (policy, team) in scope, policy in the order given, teams sorted:
    pods_stopped, false_stops, released_gpu_hours, released_<category>_gpu_hours,
    busy_lost_gpu_hours, held_idle_gpu_hours (the scope's held non-busy, observed time in the
    window: what any policy could at most release), longest_spared_idle_hours.
    `stops`: one per stopped gang and pod: policy, gang, pod_uid, team, stop_ms, false_stop,
    busy_lost_gpu_hours, released_gpu_hours; sorted by policy order, stop_ms, gang, pod.
    """

    window: tuple[int, int]
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


def replay(
    rows: pd.DataFrame,
    *,
    pods: pd.DataFrame,
    tenures: pd.DataFrame,
    policies: Sequence[Policy],
    window: tuple[int, int],
    thresholds: Thresholds,
) -> WhatIf:
    """Replay each policy over `rows` (`card_rows` of pieces covering whole tenures).

    `pods`: uid, team, job_kind (one row per pod). `tenures`: gpu, pod_uid, gang, start_ms
    (the binding on that card), as `build_tenures` makes them."""
    w0, w1 = window
    bound = tenures.groupby(["gpu", "pod_uid"], sort=False)["start_ms"].min()
    gang_of = tenures.drop_duplicates("pod_uid").set_index("pod_uid")["gang"].astype(str)
    info = pods.drop_duplicates("uid").set_index("uid")
    rows = rows[rows["pod_uid"].isin(gang_of.index)].reset_index(drop=True)
    pod = rows["pod_uid"].astype(str).to_numpy(dtype=object)
    gang = gang_of.reindex(pod).to_numpy(dtype=object)
    team = info["team"].reindex(pod).fillna("").astype(str).to_numpy(dtype=object)
    start = rows["start_ms"].to_numpy(dtype=np.int64)
    end = rows["end_ms"].to_numpy(dtype=np.int64)
    length = np.maximum(end - start, 1).astype(np.float64)
    observed = rows["observed"].to_numpy(dtype=np.bool_)
    util = rows["util"].to_numpy(dtype=np.float64)
    idx = pd.MultiIndex.from_arrays([rows["gpu"], rows["pod_uid"]])
    card_bound = bound.reindex(idx).to_numpy(dtype=np.float64)
    card_bound = np.where(np.isnan(card_bound), start, card_bound).astype(np.int64)
    new_card = np.ones(len(rows), dtype=np.bool_)
    if len(rows):
        same = (rows["gpu"].to_numpy()[1:] == rows["gpu"].to_numpy()[:-1]) & (pod[1:] == pod[:-1])
        new_card[1:] = ~same
    in_window = np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0, None) / length
    cat_seconds = np.stack([rows[str(c)].to_numpy(dtype=np.float64) for c in RELEASED], axis=1)
    busy = rows["busy"].to_numpy(dtype=np.float64)
    idle_held = cat_seconds.sum(axis=1)
    pod_scope_all = info.reindex(pd.Index(sorted(set(pod.tolist())))).reset_index(names="uid")

    out_rows: list[pd.DataFrame] = []
    out_stops: list[pd.DataFrame] = []
    for policy in policies:
        eligible_pods = set(pod_scope_all["uid"][_in_scope(pod_scope_all, policy)].tolist())
        pod_eligible = np.array([p in eligible_pods for p in pod.tolist()], dtype=np.bool_)
        eligible_gangs = set(gang[pod_eligible].tolist())
        scope = np.array([g in eligible_gangs for g in gang.tolist()], dtype=np.bool_)

        idle = observed & policy.idle(np.nan_to_num(util, nan=100.0), thresholds)
        active = observed & ~idle
        counted_from = np.maximum(start, card_bound + policy.grace_ms)
        counted = np.where(idle, np.clip(end - counted_from, 0, None), 0).astype(np.int64)
        run = np.cumsum(active | new_card)
        total = np.cumsum(counted)
        run_first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]]) if run.size else run
        base = np.zeros(run.size, dtype=np.int64)
        if run.size:
            starts_total = total[run_first] - counted[run_first]
            base = np.repeat(starts_total, np.diff(np.r_[run_first, run.size]))
        cum = total - base
        fires = pod_eligible & idle & (counted > 0) & (cum >= policy.idle_ms)
        fire_at = end - (cum - policy.idle_ms)
        fired = pd.DataFrame({"gang": gang[fires], "at": fire_at[fires]})
        stop_of = fired.groupby("gang", sort=True)["at"].min()
        stop_ms = stop_of.reindex(gang).to_numpy(dtype=np.float64)
        stopped = scope & ~np.isnan(stop_ms)
        stop_row = np.where(stopped, stop_ms, np.inf)
        after = np.clip(np.minimum(end, w1) - np.maximum(start, np.maximum(stop_row, w0)), 0, None)
        after = np.where(stopped, after / length, 0.0)
        released = cat_seconds * after[:, None]
        lost = busy * after
        active_after = stopped & active & (end > stop_row)
        held_after = stopped & (end > stop_row)

        per_row = pd.DataFrame(
            {
                "pod_uid": pod,
                "gang": gang,
                "team": team,
                "scope": scope,
                "eligible": pod_eligible,
                "stop_ms": stop_ms,
                "held_after": held_after,
                "active_after": active_after,
                "lost": lost,
                "released": released.sum(axis=1),
                "held_idle": np.where(scope, idle_held * in_window, 0.0),
                "streak": np.where(pod_eligible & (end > w0) & (start < w1), cum, 0),
            }
        )
        for i, c in enumerate(RELEASED):
            per_row[_released_col(c)] = released[:, i]
        per_pod = (
            per_row[per_row["scope"]]
            .groupby("pod_uid", sort=True)
            .agg(
                gang=("gang", "first"),
                team=("team", "first"),
                eligible=("eligible", "any"),
                stop_ms=("stop_ms", "first"),
                held_after=("held_after", "any"),
                active_after=("active_after", "any"),
                lost=("lost", "sum"),
                released=("released", "sum"),
                held_idle=("held_idle", "sum"),
                streak=("streak", "max"),
                **{_released_col(c): (_released_col(c), "sum") for c in RELEASED},
            )
        )
        stop = per_pod["stop_ms"].to_numpy(dtype=np.float64)
        counts = per_pod["held_after"].to_numpy() & (stop >= w0) & (stop < w1)
        per_pod["stopped"] = counts
        per_pod["false_stop"] = counts & per_pod["active_after"].to_numpy()
        per_pod["spared_streak"] = np.where(
            per_pod["eligible"].to_numpy() & np.isnan(stop), per_pod["streak"], 0
        )
        teams = per_pod.groupby("team", sort=True)
        agg = pd.DataFrame(
            {
                "pods_stopped": teams["stopped"].sum().astype(np.int64),
                "false_stops": teams["false_stop"].sum().astype(np.int64),
                "released_gpu_hours": teams["released"].sum() / 3600.0,
                **{_released_col(c): teams[_released_col(c)].sum() / 3600.0 for c in RELEASED},
                "busy_lost_gpu_hours": teams["lost"].sum() / 3600.0,
                "held_idle_gpu_hours": teams["held_idle"].sum() / 3600.0,
                "longest_spared_idle_hours": teams["spared_streak"].max() / 3_600_000.0,
            }
        ).reset_index()
        agg.insert(0, "policy", policy.text)
        out_rows.append(agg[ROW_OUT])
        hit = per_pod[per_pod["stopped"]].reset_index()
        out_stops.append(
            pd.DataFrame(
                {
                    "policy": policy.text,
                    "gang": hit["gang"].astype(str),
                    "pod_uid": hit["pod_uid"].astype(str),
                    "team": hit["team"].astype(str),
                    "stop_ms": hit["stop_ms"].astype(np.int64),
                    "false_stop": hit["active_after"].astype(bool),
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
        window=window,
        policies=tuple(p.text for p in policies),
        rows=rows_out,
        stops=stops_out,
    )


def what_if(
    samples: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    pods: pd.DataFrame,
    policies: Sequence[Policy],
    window: tuple[int, int],
    thresholds: Thresholds,
    markers: pd.DataFrame | None = None,
) -> WhatIf:
    """Classify the whole tenures that overlap `window` (SPEC §3 "Whole tenures") and replay
    each policy over them: a pod idle since before the window is stopped as a policy that had
    been on all along would have stopped it."""
    from auditor.classify.engine import Window, classify

    w0, w1 = window
    over = tenures[(tenures["start_ms"] < w1) & (tenures["end_ms"] > w0)]
    lo = min(w0, int(over["start_ms"].min())) if len(over) else w0
    hi = max(w1, int(over["end_ms"].max())) if len(over) else w1
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
