"""Which stored audit runs make up a report window, without counting any second twice.

Runs of adjacent windows add up (SPEC §3, "Whole tenures"), so a week can be read from seven
daily runs; overlapping runs (a daily and a weekly run of the same days) must not both count.
Runs store their results per UTC hour (SPEC §11), so a window of whole hours inside them is
read from the hours it takes of each (`choose_slices`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from auditor.model import DEFAULT_CLUSTER, RunSlice, Window

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class RunChoice:
    run_ids: list[int]
    missing: list[Window]
    """Stretches of the window no chosen run covers."""
    incomplete: list[Window]
    """Windows whose shards are not all stored (a sharded audit still running or failed)."""


def shards_complete(shards: set[str]) -> bool:
    """Whether shard names "i/N" are exactly 0/N .. N-1/N for one N."""
    counts = {name.split("/")[1] for name in shards}
    if len(counts) != 1:
        return False
    n = int(counts.pop())
    return shards == {f"{i}/{n}" for i in range(n)}


def choose_runs(runs: pd.DataFrame, *, start_ms: int, end_ms: int) -> RunChoice:
    """Chain run windows from `start_ms` to `end_ms`, preferring the longest that still chains.

    `runs` has id, window_start_ms, window_end_ms and shard ("all", or "i/N": all N shards of
    a window together stand for it).
    """
    inside = runs[(runs["window_start_ms"] >= start_ms) & (runs["window_end_ms"] <= end_ms)]
    incomplete: list[Window] = []
    if "shard" in inside.columns and len(inside):
        keep = []
        for key, group in inside.groupby(["window_start_ms", "window_end_ms"], sort=True):
            a, b = (int(str(v)) for v in key)
            shards = set(group["shard"])
            if "all" in shards:
                keep.append(group[group["shard"] == "all"])
            elif shards_complete(shards):
                keep.append(group)
            else:
                incomplete.append(Window(a, b))
        inside = pd.concat(keep) if keep else inside.iloc[0:0]
    windows = (
        inside[["window_start_ms", "window_end_ms"]]
        .drop_duplicates()
        .sort_values(["window_start_ms", "window_end_ms"], ascending=[True, False])
    )
    options: dict[int, list[int]] = {}
    for a, b in zip(
        windows["window_start_ms"].astype(int), windows["window_end_ms"].astype(int), strict=True
    ):
        options.setdefault(a, []).append(b)  # longest first
    # points from which windows chain exactly to end_ms, found backwards
    exact: set[int] = {end_ms}
    for a in sorted(options, reverse=True):
        if any(b in exact for b in options[a]):
            exact.add(a)
    starts = sorted(options)
    chosen: list[Window] = []
    missing: list[Window] = []
    pos = start_ms
    while pos < end_ms:
        if pos in options:
            ends = options[pos]
            nxt = next((b for b in ends if b in exact), ends[0])
            chosen.append(Window(pos, nxt))
            pos = nxt
            continue
        later = [a for a in starts if a > pos]
        nxt = later[0] if later else end_ms
        missing.append(Window(pos, nxt))
        pos = nxt
    keys = set(chosen)
    pairs = zip(
        inside["window_start_ms"].astype(int), inside["window_end_ms"].astype(int), strict=True
    )
    ids = [int(i) for i, w in zip(inside["id"], pairs, strict=True) if w in keys]
    return RunChoice(run_ids=sorted(ids), missing=missing, incomplete=incomplete)


@dataclass(frozen=True)
class SliceChoice:
    parts: list[int | RunSlice]
    """Whole runs by id where the window is made of whole runs, else slices of runs."""
    missing: list[Window]
    incomplete: list[Window]
    off_grid: Window | None
    """Where the window cuts an audited run off its hours: the whole hours around the
    window, to suggest; None where it does not."""
    unsplit: Window | None = None
    """A run stored before results were kept per hour that the window would cut: audit
    it again to read hours of it."""


def _complete_windows(
    runs: pd.DataFrame, *, start_ms: int, end_ms: int
) -> tuple[list[tuple[int, int, list[int], bool]], list[Window]]:
    """The complete run windows overlapping [start, end) as (start, end, run ids, hourly),
    and the windows whose shards are not all stored."""
    over = runs[(runs["window_start_ms"] < end_ms) & (runs["window_end_ms"] > start_ms)]
    out: list[tuple[int, int, list[int], bool]] = []
    incomplete: list[Window] = []
    for key, group in over.groupby(["window_start_ms", "window_end_ms"], sort=True):
        a, b = (int(str(v)) for v in key)
        shards = set(group["shard"]) if "shard" in group.columns else {"all"}
        chosen = group
        if "all" in shards:
            chosen = group[group["shard"] == "all"] if "shard" in group.columns else group
        elif not shards_complete(shards):
            incomplete.append(Window(a, b))
            continue
        hourly = "hourly" in chosen.columns and bool(chosen["hourly"].astype(bool).all())
        out.append((a, b, sorted(int(i) for i in chosen["id"]), hourly))
    return out, incomplete


def choose_slices(runs: pd.DataFrame, *, start_ms: int, end_ms: int) -> SliceChoice:
    """The stored rows that make up [start, end), each second once (SPEC §11).

    A window made of whole runs is read as `choose_runs` chooses them. Any other is read
    from the hours of runs stored per hour (`runs` as in `choose_runs`, with `hourly`): it
    may start and end on whole UTC hours, or where an audited run does; from each point,
    the run that reaches furthest is taken, up to its end or the window's."""
    whole = choose_runs(runs, start_ms=start_ms, end_ms=end_ms)
    if not whole.missing and not whole.incomplete:
        return SliceChoice(list(whole.run_ids), [], [], None)
    windows, incomplete = _complete_windows(runs, start_ms=start_ms, end_ms=end_ms)

    def cuts(t: int, a: int, b: int, hourly: bool) -> bool:
        return t in (a, b) or (hourly and t % HOUR_MS == 0)

    around = Window(start_ms // HOUR_MS * HOUR_MS, -(-end_ms // HOUR_MS) * HOUR_MS)
    parts: list[int | RunSlice] = []
    missing: list[Window] = []
    pos = start_ms
    while pos < end_ms:
        holding = [w for w in windows if w[0] <= pos < w[1]]
        usable = [
            (a, b, ids, hourly)
            for a, b, ids, hourly in holding
            if cuts(pos, a, b, hourly) and (b <= end_ms or cuts(end_ms, a, b, hourly))
        ]
        if usable:
            _, b, ids, _ = max(usable, key=lambda w: (min(w[1], end_ms), w[1] - w[0]))
            stop = min(b, end_ms)
            parts += [RunSlice(i, pos, stop) for i in ids]
            pos = stop
            continue
        if holding:  # audited, but not to be cut here
            whole_hours = pos % HOUR_MS == 0 and end_ms % HOUR_MS == 0
            if whole_hours and not any(w[3] for w in holding):
                return SliceChoice([], [], [], None, Window(*holding[0][:2]))
            return SliceChoice([], [], [], around)
        lacking = [w for w in incomplete if w.start_ms <= pos < w.end_ms]
        if lacking:
            return SliceChoice([], [], lacking[:1], None)
        nxt = min([*(w[0] for w in windows if w[0] > pos), end_ms])
        missing.append(Window(pos, nxt))
        pos = nxt
    return SliceChoice([] if missing else parts, missing, [], None)


@dataclass(frozen=True)
class LatestAudit:
    run_ids: list[int]
    window: Window
    completed_ms: int
    """When its last run (its last shard) was stored."""
    cluster: str = DEFAULT_CLUSTER
    """The cluster its runs audited (SPEC §11)."""


def latest_complete(runs: pd.DataFrame, *, cluster: str | None = None) -> LatestAudit | None:
    """The most recently stored audit window whose runs are complete (an unsharded run, or
    every shard of a sharded one): a sharded audit still running, or one whose shards
    failed, does not hide the previous complete one. `runs` as in `choose_runs`, with
    created_ms, and a `cluster` column where they may be of several clusters: the runs of
    two clusters are never one audit (a shard of one cluster does not complete another's
    window). With `cluster`, only that cluster's runs are considered; else the latest
    audit of any cluster. None when no window is complete."""
    if "cluster" in runs.columns:
        if cluster is not None:
            runs = runs[runs["cluster"] == cluster]
        clusters = runs["cluster"].astype(str)
    else:  # runs of one cluster: the default one unless told
        clusters = pd.Series(cluster or DEFAULT_CLUSTER, index=runs.index, dtype=object)
    best: LatestAudit | None = None
    best_key: tuple[int, int, str] | None = None
    keys = [clusters.rename("_cluster"), runs["window_start_ms"], runs["window_end_ms"]]
    for key, group in runs.groupby(keys, sort=True):
        name, a, b = str(key[0]), int(str(key[1])), int(str(key[2]))
        shards = set(group["shard"])
        if "all" in shards:
            chosen = group[group["shard"] == "all"]
        elif shards_complete(shards):
            chosen = group
        else:
            continue
        completed = int(chosen["created_ms"].max())
        rank = (completed, b, name)
        if best_key is None or rank > best_key:
            best_key = rank
            best = LatestAudit(
                run_ids=sorted(int(i) for i in chosen["id"]),
                window=Window(a, b),
                completed_ms=completed,
                cluster=name,
            )
    return best
