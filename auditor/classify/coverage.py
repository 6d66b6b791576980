"""Sample coverage (SPEC §3 "Sample coverage"): what stretch of time each sample stands for.

Per GPU the samples are sorted by time and duplicate timestamps are merged (the highest
readable utilisation wins, so that the result does not depend on row order). The GPU's
period is the median spacing of its samples, rounded to a whole millisecond (a GPU with a
single sample gets `default_period_s`). A sample at `t` covers `[t, t + dt)` with `dt` the
time to the GPU's next sample, except where that is more than `gap_periods` periods away:
then it covers one period and the rest of the gap is unobserved. The last sample covers one
period. A GPU's observed span, whose intersection with the audit window is its capacity,
runs from its first sample to the end of its last sample's coverage.

Rolled-up minutes (`auditor.classify.rollup`) come as pseudo-samples with a `cover_ms`
column: such a row already knows what it covers, so it covers `[t, t + min(cover_ms, dt))`
whatever the period, and it is left out of the period (a GPU keeps the period of its raw
samples; one with rolled-up rows only gets `ROLLED_PERIOD_MS`). The period rule still
decides what a raw sample covers, also where its successor is a rolled-up row. Without the
column, or with it all NaN, nothing changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify.arrays import (
    BoolArr,
    FloatArr,
    IntArr,
    ObjArr,
    order_by,
    run_factorize,
    starts_of,
)
from auditor.settings import Thresholds


@dataclass(frozen=True)
class SampleTable:
    """Samples sorted by (GPU, time), one per timestamp, with what each covers.

    GPUs are numbered 0..n-1 in the sorted order of their UUIDs (`uuids`); per-sample arrays
    share one index, per-GPU arrays are indexed by that number.
    """

    uuids: ObjArr
    gpu: IntArr
    ts: IntArr
    util: FloatArr
    """Percent, clipped to 0-100; NaN where the source could not read it."""
    cov_end: IntArr
    """End of the time the sample covers."""
    span_end: IntArr
    """The next sample's time, or `cov_end` for a GPU's last sample."""
    throttle: IntArr | None
    """Per sample: code of its throttle reasons in `throttle_names`, -1 where none."""
    throttle_names: ObjArr
    period: IntArr
    first: IntArr
    last_end: IntArr
    rolled: BoolArr | None = None
    """Per sample: a rolled-up minute (a mean over what it covers, not a point reading);
    None where there are none."""
    read: IntArr | None = None
    """Per sample: when the reading it carries was taken, where that is not `ts` (a shared
    card's samples cut where a tenure or a share begins: the piece after the cut still
    carries the reading before it); None where every sample is its own reading."""

    @property
    def reading_ms(self) -> IntArr:
        """Per sample, when its reading was taken."""
        return self.ts if self.read is None else self.read

    @property
    def n_gpus(self) -> int:
        return int(self.uuids.size)


def _merge_duplicates(
    *, gpu: IntArr, ts: IntArr, util: FloatArr, throttle: IntArr | None, cover: FloatArr | None
) -> tuple[IntArr, IntArr, FloatArr, IntArr | None, FloatArr | None]:
    first = starts_of(gpu, ts)
    if bool(first.all()):
        return gpu, ts, util, throttle, cover
    at = np.flatnonzero(first)
    merged = np.fmax.reduceat(util, at)
    # a rolled-up row and a raw sample at one instant: the row that knows its cover wins
    cover = None if cover is None else np.fmax.reduceat(cover, at)
    return gpu[at], ts[at], merged, None if throttle is None else throttle[at], cover


ROLLED_PERIOD_MS = 60_000
"""Period of a GPU known only through rolled-up minutes: the rollup's resolution."""

GROUPED_PROBE = 4096
"""Rows looked at to guess whether samples come grouped by GPU (as a store returns them)."""


def gpu_codes(values: pd.Series) -> tuple[IntArr, ObjArr]:
    """Each row's GPU as a number (-1 where missing) and the UUIDs, sorted, by number.

    Hashing a few million strings dominates the load, so where the rows come grouped by GPU
    only the first row of each run is hashed; a categorical column is not hashed at all.
    """
    if isinstance(values.dtype, pd.CategoricalDtype):
        raw = values.cat.codes.to_numpy(dtype=np.int64)
        names = np.array([str(c) for c in values.cat.categories], dtype=object)
    else:
        objects = values.to_numpy(dtype=object)
        head = objects[:GROUPED_PROBE]
        if objects.size > GROUPED_PROBE and int((head[1:] != head[:-1]).sum()) <= 64:
            first = np.ones(objects.size, dtype=np.bool_)
            first[1:] = objects[1:] != objects[:-1]
            at = np.flatnonzero(first)
            run_codes, uniques = pd.factorize(objects[at])
            raw = np.repeat(run_codes.astype(np.int64), np.diff(np.append(at, objects.size)))
        else:
            codes, uniques = pd.factorize(objects)
            raw = codes.astype(np.int64)
        names = np.array([str(u) for u in uniques], dtype=object)
    used = np.bincount(raw[raw >= 0], minlength=names.size) > 0
    kept = np.flatnonzero(used)
    by_name = kept[np.argsort(names[kept].astype(str), kind="stable")]
    number = np.full(names.size + 1, -1, dtype=np.int64)  # the last slot maps -1 to -1
    number[by_name] = np.arange(by_name.size, dtype=np.int64)
    return number[raw], names[by_name]


def _throttle_codes(values: pd.Series) -> tuple[IntArr, ObjArr]:
    """Throttle reasons as codes into their sorted distinct texts; blank or missing → -1.
    A card's reasons stay the same for long runs of samples: only each run's first is
    hashed (`run_factorize`)."""
    codes, uniques = run_factorize(values, sort=True)
    names = np.array([str(u) for u in uniques], dtype=object)
    blank = np.array([not n.strip() for n in names.tolist()], dtype=np.bool_)
    codes = codes.astype(np.int64)
    if blank.any():
        codes = np.where((codes >= 0) & blank[np.maximum(codes, 0)], -1, codes)
    return codes, names


def _periods(gpu_start: IntArr, *, n: int, ts: IntArr, default_ms: int) -> IntArr:
    diffs = np.diff(ts)
    ends = np.append(gpu_start[1:], n)
    period = np.full(gpu_start.size, default_ms, dtype=np.int64)
    for g, (a, b) in enumerate(zip(gpu_start.tolist(), ends.tolist(), strict=True)):
        if b - a >= 2:
            period[g] = max(1, math.floor(float(np.median(diffs[a : b - 1])) + 0.5))
    return period


def _raw_periods(
    gpu_start: IntArr, *, n: int, ts: IntArr, rolled: BoolArr, default_ms: int
) -> IntArr:
    """Periods from the spacing of consecutive raw samples only (rolled-up rows left out)."""
    diffs = np.diff(ts)
    raw_pair = ~rolled[:-1] & ~rolled[1:]
    ends = np.append(gpu_start[1:], n)
    period = np.full(gpu_start.size, default_ms, dtype=np.int64)
    for g, (a, b) in enumerate(zip(gpu_start.tolist(), ends.tolist(), strict=True)):
        spacing = diffs[a : b - 1][raw_pair[a : b - 1]]
        if spacing.size:
            period[g] = max(1, math.floor(float(np.median(spacing)) + 0.5))
        elif bool(rolled[a:b].any()):
            period[g] = ROLLED_PERIOD_MS
    return period


def load_samples(samples: pd.DataFrame, *, thresholds: Thresholds) -> SampleTable:
    """Sort, merge duplicates, and compute each sample's coverage."""
    frame = samples
    if frame["ts_ms"].dtype != np.int64 and bool(frame["ts_ms"].isna().any()):
        frame = frame[frame["ts_ms"].notna()]
    gpu, uuids = gpu_codes(frame["gpu"])
    if gpu.size and bool((gpu < 0).any()):
        frame = frame[gpu >= 0]
        gpu = gpu[gpu >= 0]
    ts = frame["ts_ms"].to_numpy(dtype=np.int64)
    util = np.clip(frame["util"].to_numpy(dtype=np.float64, na_value=np.nan), 0.0, 100.0)
    throttle: IntArr | None = None
    throttle_names = np.zeros(0, dtype=object)
    if "throttle_reasons" in frame.columns:
        throttle, throttle_names = _throttle_codes(frame["throttle_reasons"])
    cover: FloatArr | None = None
    if "cover_ms" in frame.columns:
        cover = frame["cover_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
        if bool(np.isnan(cover).all()):
            cover = None
    default_ms = max(1, round(thresholds.default_period_s * 1000))
    if ts.size == 0:
        none = np.zeros(0, dtype=np.int64)
        return SampleTable(
            uuids, none, none, np.zeros(0), none, none, throttle, throttle_names, none, none, none
        )

    base = int(ts.min())
    order = order_by(gpu, ts - base)
    if not bool((order[1:] > order[:-1]).all()):  # a store hands them over in order
        gpu, ts, util = gpu[order], ts[order], util[order]
        throttle = None if throttle is None else throttle[order]
        cover = None if cover is None else cover[order]
    gpu, ts, util, throttle, cover = _merge_duplicates(
        gpu=gpu, ts=ts, util=util, throttle=throttle, cover=cover
    )

    n = ts.size
    gpu_start = np.flatnonzero(starts_of(gpu)).astype(np.int64)
    rolled = None if cover is None else ~np.isnan(cover)
    if rolled is None:
        period = _periods(gpu_start, n=n, ts=ts, default_ms=default_ms)
    else:
        period = _raw_periods(gpu_start, n=n, ts=ts, rolled=rolled, default_ms=default_ms)

    has_next: BoolArr = np.zeros(n, dtype=np.bool_)
    has_next[:-1] = gpu[1:] == gpu[:-1]
    nxt = np.empty(n, dtype=np.int64)
    nxt[:-1] = ts[1:]
    nxt[-1] = 0
    dt = nxt - ts
    own = period[gpu]
    regular = has_next & (dt <= thresholds.gap_periods * own)
    cov = np.where(regular, dt, own)
    if cover is not None and rolled is not None:
        cov = np.where(rolled, np.maximum(np.nan_to_num(cover), 1).astype(np.int64), cov)
    cov = np.where(has_next, np.minimum(cov, dt), cov)
    cov_end = ts + cov
    span_end = np.where(has_next, nxt, cov_end)
    last = np.append(gpu_start[1:], n) - 1
    return SampleTable(
        uuids=uuids,
        gpu=gpu,
        ts=ts,
        util=util,
        cov_end=cov_end,
        span_end=span_end,
        throttle=throttle,
        throttle_names=throttle_names,
        period=period,
        first=ts[gpu_start],
        last_end=span_end[last],
        rolled=rolled,
    )
