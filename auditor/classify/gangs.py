"""Cards of one gang compared "at the same instant" (SPEC §3 "Same instant", "Active samples").

The approximation: each gang has a period P, the longest sampling period among its cards.
Every observed row (held, covered, readable) is placed on the tick `round(ts / P)` of a grid
anchored at epoch 0 (half rounds up), so results do not depend on the audit window. A card
with several rows on one tick stands there with their mean utilisation; a card with no row
on a tick is not observed there. Per tick the gang has: the number of active cards, the
busiest card and the runner-up. A row then knows whether another card was active at its
instant, the busiest other card's utilisation, and which card that was (for the straggler).

Gang-wide gaps are maximal sequences of observed ticks of a gang on which no card is active;
ticks with no observed card (outages, unreadable samples) neither break a gap nor count in
it. A gap spans `[first·P − P/2, last·P + P/2)` (what a checkpoint marker must overlap, and
where its start-to-start intervals are measured from); its length is its observed time,
P per idle tick, as for idle runs. A gap is `checkpoint`-able when it overlaps a checkpoint
marker of its gang, or belongs to a regular series (`find_series`; only gaps of at least
`checkpoint_min_samples` ticks can).

Names in `compare_with_gang` (arrays are flat, one entry per item of what the prefix says):
- `s_…` observed rows **sorted** by (gang, tick, card); `order` maps them back;
- `e_…` **entries**: one per (gang, tick, card), a card's rows on one tick merged;
- `t_…` **ticks**: one per (gang, tick), with the count of active cards and the two busiest;
- `g_…`/`gap_…` **gaps**: one per gang-wide gap (maximal run of ticks with no active card).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from auditor.classify.arrays import (
    BoolArr,
    FloatArr,
    IntArr,
    empty_int,
    ends_of,
    group_ids,
    order_by,
    starts_of,
)
from auditor.settings import Thresholds

T = TypeVar("T", bound=np.generic)


@dataclass(frozen=True)
class Series:
    """One regular series of gang-wide gaps."""

    gang: int
    period_s: float
    """Median start-to-start interval."""
    median_length_s: float


@dataclass(frozen=True)
class GangView:
    """Per observed row: what the rest of its gang did at that instant; per gap: the gap."""

    others_active: BoolArr
    gang_idle: BoolArr
    """Every observed card of the gang idle at the row's instant."""
    other_max: FloatArr
    """Utilisation of the busiest other card at that instant (-inf where none observed)."""
    blame: IntArr
    """A row of that busiest other card on that tick (-1 where none)."""
    gap: IntArr
    """The gang-wide gap the row's tick belongs to (-1 where none)."""
    gap_checkpoint: BoolArr
    gap_series: IntArr
    """Index into `series`, -1 where the gap is in none (a marker alone may still count)."""
    series: tuple[Series, ...]


def _first_where(mask: BoolArr, group: IntArr, *, n_groups: int) -> IntArr:
    """Per group, the first index where `mask` holds (groups sorted), else -1."""
    out = np.full(n_groups, -1, dtype=np.int64)
    idx = np.flatnonzero(mask)
    if idx.size:
        first = starts_of(group[idx])
        out[group[idx[first]]] = idx[first]
    return out


def find_series(
    starts: IntArr,
    lengths: IntArr,
    *,
    period_ms: int,
    thresholds: Thresholds,
    averaged: BoolArr | None = None,
) -> list[IntArr]:
    """Indices of the gaps (given by start and length in ms) that form regular series.

    Gaps of 15 s–15 min that span at least `checkpoint_min_samples` sampling periods of
    `period_ms` (the thresholds; `shortest_candidate_ms`) are sorted by length and split
    where one is more than `checkpoint_length_factor` longer than the one before; in each
    group the gaps within that factor of the group's median length are a series when there
    are at least `checkpoint_min_gaps` of them (and at least 2) and the coefficient of
    variation (population standard deviation / mean) of their start-to-start intervals is at
    most `checkpoint_max_cv`. Noise gaps of a similar length between members break the regularity
    of the series (a documented limitation); gaps of a clearly different length do not.
    `averaged` gaps (made of rolled-up minutes, whose readings are means over the minute)
    have a measured length whatever their number of samples.
    """
    factor = max(thresholds.checkpoint_length_factor, 1.0)
    lo = shortest_candidate_ms(period_ms, thresholds=thresholds, averaged=averaged)
    hi = thresholds.checkpoint_max_gap_s * 1000
    need = max(thresholds.checkpoint_min_gaps, 2)
    idx = np.flatnonzero((lengths >= lo) & (lengths <= hi))
    if idx.size < need:
        return []
    by_length = idx[np.lexsort((starts[idx], lengths[idx]))]
    sorted_len = lengths[by_length].astype(np.float64)
    breaks = np.flatnonzero(sorted_len[1:] > sorted_len[:-1] * factor) + 1
    found: list[IntArr] = []
    for group in np.split(by_length, breaks):
        if group.size < need:
            continue
        median = float(np.median(lengths[group]))
        members = group[(lengths[group] >= median / factor) & (lengths[group] <= median * factor)]
        if members.size < need:
            continue
        members = members[np.argsort(starts[members], kind="stable")]
        kept = _regular_chain(
            starts[members],
            droppable=lengths[members] < np.median(lengths[members]),
            need=need,
            max_cv=thresholds.checkpoint_max_cv,
        )
        if kept is not None:
            found.append(np.sort(members[kept]))
    return found


def shortest_candidate_ms(
    period_ms: int | IntArr, *, thresholds: Thresholds, averaged: BoolArr | None = None
) -> npt.NDArray[np.float64]:
    """The shortest gang-wide gap (ms) that can belong to a series at a sampling period.

    A gap of `k` idle samples lasted anything from `(k − 1)·P` to `(k + 1)·P`: one or two
    samples do not measure a length, and at a coarse period every input stall long enough
    to be caught by a sample is one or two of them. So a gap must span
    `checkpoint_min_samples` periods as well as last `checkpoint_min_gap_s` (at the default
    5 s the two are the same 15 s). Such short gaps still count at a checkpoint marker.
    A gap made of rolled-up minutes (`averaged`) needs `checkpoint_min_gap_s` only: an idle
    minute mean says the whole minute was idle."""
    floor_ms = thresholds.checkpoint_min_gap_s * 1000
    out = np.maximum(floor_ms, thresholds.checkpoint_min_samples * np.asarray(period_ms, float))
    if averaged is not None:
        out = np.where(averaged, floor_ms, out)
    return np.asarray(out, dtype=np.float64)


def _cv(gaps: npt.NDArray[np.float64]) -> float:
    mean = float(gaps.mean())
    return float(gaps.std()) / mean if mean > 0 else math.inf


def _regular_chain(
    starts: IntArr, *, droppable: BoolArr, need: int, max_cv: float
) -> IntArr | None:
    """Positions of the gaps (sorted by start) whose start-to-start intervals are regular
    (coefficient of variation at most `max_cv`): all of them when they are; else the chain
    left after dropping, one at a time, the `droppable` gap (shorter than the group's
    median: a stall between two checkpoints, which coarse sampling makes look alike) whose
    removal makes the rest most regular. At most a third of the gaps go, and a chain found
    so needs twice `need` gaps: noise alone rarely keeps that many at a steady pace. None
    when no chain is regular."""
    keep = np.arange(starts.size)
    if _cv(np.diff(starts.astype(np.float64))) <= max_cv:
        return keep
    floor = max(2 * need, starts.size - starts.size // 3)
    found: IntArr | None = None
    while keep.size > floor and droppable[keep].any():
        cv = _cv_without_each(starts[keep].astype(np.float64))
        cv = np.where(droppable[keep], cv, np.inf)
        best = int(np.argmin(cv))
        now = _cv(np.diff(starts[keep].astype(np.float64)))
        if found is not None and cv[best] > PRUNE_GAIN * now:
            break  # regular already, and no stall left whose removal helps much
        keep = np.delete(keep, best)
        if cv[best] <= max_cv:
            found = keep
    return found


PRUNE_GAIN = 0.8
"""Once a chain is regular, a further gap is dropped only where that lowers the chain's
coefficient of variation by a fifth or more (a stall left inside; a checkpoint's own
jitter changes it little)."""


def _cv_without_each(at: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The coefficient of variation of the intervals of `at` (sorted) with each point
    dropped in turn: an end drops its one interval, an interior point merges its two."""
    gaps = np.diff(at)
    n = gaps.size
    total, squares = float(gaps.sum()), float((gaps**2).sum())
    merged = gaps[:-1] + gaps[1:]
    cand_sum = np.concatenate([[total - gaps[0]], np.full(n - 1, total), [total - gaps[-1]]])
    cand_sq = np.concatenate(
        [[squares - gaps[0] ** 2],
         squares - gaps[:-1] ** 2 - gaps[1:] ** 2 + merged**2,
         [squares - gaps[-1] ** 2]]
    )  # fmt: skip
    mean = cand_sum / max(n - 1, 1)
    var = np.maximum(cand_sq / max(n - 1, 1) - mean**2, 0.0)
    out: npt.NDArray[np.float64] = np.where(
        mean > 0, np.sqrt(var) / np.where(mean > 0, mean, 1.0), np.inf
    )
    return out


def _marked(
    *, gap_start: IntArr, gap_end: IntArr, marker_start: IntArr, marker_end: IntArr
) -> BoolArr:
    """Which gaps overlap at least one marker (a marker without length is an instant)."""
    if marker_start.size == 0:
        return np.zeros(gap_start.size, dtype=np.bool_)
    order = np.argsort(marker_start, kind="stable")
    m_start = marker_start[order]
    m_end = np.maximum.accumulate(np.maximum(marker_end[order], m_start + 1))
    before = np.searchsorted(m_start, gap_end, side="left")
    reach = np.where(before > 0, m_end[np.maximum(before - 1, 0)], np.iinfo(np.int64).min)
    return np.asarray(reach > gap_start, dtype=np.bool_)


def compare_with_gang(
    *,
    gang: IntArr,
    gpu: IntArr,
    ts: IntArr,
    util: FloatArr,
    gang_period: IntArr,
    marker_gang: IntArr,
    marker_start: IntArr,
    marker_end: IntArr,
    thresholds: Thresholds,
    averaged: BoolArr | None = None,
) -> GangView:
    """Compare every observed row with its gang at the same instant (module docstring): for
    each row, whether another card of its gang was active, the busiest other card, and the
    gang-wide gap (and checkpoint series) its tick belongs to."""
    n = gang.size
    period = gang_period[gang]
    tick = (2 * ts + period) // (2 * period)
    tick_min = int(tick.min()) if n else 0
    order = order_by(gang, tick - tick_min, gpu)
    s_gang, s_tick, s_gpu, s_util = gang[order], tick[order], gpu[order], util[order]
    del period, tick  # memory: the row-sized temporaries go as soon as they are used

    entry_first = starts_of(s_gang, s_tick, s_gpu)
    entry_at = np.flatnonzero(entry_first)
    entry = group_ids(entry_first)
    counts = np.diff(np.append(entry_at, n))
    e_util = np.add.reduceat(s_util, entry_at) / counts if n else np.zeros(0)
    e_active = e_util > thresholds.idle_threshold_pct
    # a tick is averaged where a rolled-up minute (a mean, not a point reading) stands on it
    e_avg = None if averaged is None else np.maximum.reduceat(averaged[order], entry_at)
    e_gang, e_tick, e_gpu = s_gang[entry_at], s_tick[entry_at], s_gpu[entry_at]
    del s_gang, s_tick, s_util, entry_first

    tick_first = starts_of(e_gang, e_tick)
    tick_at = np.flatnonzero(tick_first)
    e_tick_id = group_ids(tick_first)
    n_ticks = tick_at.size
    if n:
        n_active = np.add.reduceat(e_active.astype(np.int64), tick_at)
        max1 = np.maximum.reduceat(e_util, tick_at)
    else:
        n_active = np.zeros(0, dtype=np.int64)
        max1 = np.zeros(0)
    arg1 = _first_where(e_util == max1[e_tick_id], e_tick_id, n_groups=n_ticks)
    runner = e_util.copy()
    runner[arg1] = -np.inf
    max2 = np.maximum.reduceat(runner, tick_at) if n else np.zeros(0)
    has2 = max2 > -np.inf
    arg2 = _first_where((runner == max2[e_tick_id]) & has2[e_tick_id], e_tick_id, n_groups=n_ticks)

    row_tick = e_tick_id[entry]
    top = e_gpu[arg1[row_tick]] == s_gpu
    other_max = np.where(top, max2[row_tick], max1[row_tick])
    blame_entry = np.where(top, arg2[row_tick], arg1[row_tick])
    del top, s_gpu
    blame = np.where(blame_entry >= 0, order[entry_at[np.maximum(blame_entry, 0)]], -1)
    del blame_entry
    others_active = (n_active[row_tick] - e_active[entry]) > 0
    gang_idle = n_active[row_tick] == 0

    # Gang-wide gaps over the ticks.
    t_gang, t_tick = e_gang[tick_at], e_tick[tick_at]
    idle_tick = n_active == 0
    continues = np.zeros(n_ticks, dtype=np.bool_)
    continues[1:] = idle_tick[:-1] & (t_gang[1:] == t_gang[:-1])
    gap_new = idle_tick & ~continues
    gap_of_tick = np.where(idle_tick, np.cumsum(gap_new, dtype=np.int64) - 1, -1)
    idle_at = np.flatnonzero(idle_tick)
    begins = gap_new[idle_at]
    g_first, g_last = idle_at[begins], idle_at[ends_of(begins)]
    gap_gang = t_gang[g_first]
    g_period = gang_period[gap_gang]
    gap_start = t_tick[g_first] * g_period - g_period // 2
    gap_end = gap_start + (t_tick[g_last] - t_tick[g_first] + 1) * g_period
    gap_length = (np.flatnonzero(ends_of(begins)) - np.flatnonzero(begins) + 1) * g_period
    gap_avg: BoolArr | None = None
    if e_avg is not None and idle_at.size:
        t_avg = np.maximum.reduceat(e_avg, tick_at)
        gap_avg = np.asarray(
            np.maximum.reduceat(t_avg[idle_at], np.flatnonzero(begins)), dtype=np.bool_
        )

    checkpoint = np.zeros(gap_gang.size, dtype=np.bool_)
    gap_series = np.full(gap_gang.size, -1, dtype=np.int64)
    series: list[Series] = []
    gang_at = np.flatnonzero(starts_of(gap_gang))
    bounds = np.append(gang_at, gap_gang.size)
    shortest = shortest_candidate_ms(g_period, thresholds=thresholds, averaged=gap_avg)
    candidate = (gap_length >= shortest) & (gap_length <= thresholds.checkpoint_max_gap_s * 1000)
    n_candidates = (
        np.add.reduceat(candidate.astype(np.int64), gang_at) if gang_at.size else empty_int()
    )
    marked_gangs = set(np.unique(marker_gang).tolist())
    need = max(thresholds.checkpoint_min_gaps, 2)
    for i in np.flatnonzero(
        (n_candidates >= need) | np.isin(gap_gang[gang_at], marker_gang)
    ).tolist():
        a, b = int(bounds[i]), int(bounds[i + 1])
        g = int(gap_gang[a])
        starts, ends, lengths = gap_start[a:b], gap_end[a:b], gap_length[a:b]
        if n_candidates[i] >= need:
            found = find_series(
                starts,
                lengths,
                period_ms=int(gang_period[g]),
                thresholds=thresholds,
                averaged=None if gap_avg is None else gap_avg[a:b],
            )
            for members in found:
                gap_series[a + members] = len(series)
                checkpoint[a + members] = True
                median_len = float(np.median(lengths[members])) / 1000
                interval = float(np.median(np.diff(starts[members]))) / 1000
                series.append(Series(gang=g, period_s=interval, median_length_s=median_len))
        if g in marked_gangs:
            mine = marker_gang == g
            checkpoint[a:b] |= _marked(
                gap_start=starts,
                gap_end=ends,
                marker_start=marker_start[mine],
                marker_end=marker_end[mine],
            )

    def unsort(values: npt.NDArray[T]) -> npt.NDArray[T]:
        out = np.empty_like(values)
        out[order] = values
        return out

    return GangView(
        others_active=unsort(others_active),
        gang_idle=unsort(gang_idle),
        other_max=unsort(other_max),
        blame=unsort(blame),
        gap=unsort(gap_of_tick[row_tick]),
        gap_checkpoint=checkpoint,
        gap_series=gap_series,
        series=tuple(series),
    )
