"""1-minute rollups of GPU samples, and the pseudo-samples the classifier reads back from them.

Pure NumPy/pandas, no I/O; `auditor.store.rollup` reads, writes and prunes.

Rolling up: every sample's coverage is computed by `coverage.load_samples`, exactly as the
classifier computes it, and cut at UTC minute boundaries (a sample at 12:00:58 covering 5 s
puts 2 s into 12:00 and 3 s into 12:01). Per GPU and minute that gives: the samples stamped
in it, the covered time, the readable part of it, the coverage-weighted mean utilisation
over the readable part (so busy time, `util/100 × readable time`, is kept exactly), the
least and greatest readable utilisation, and the first and last covered instant.

Reading back (`pseudo_samples`): per minute one row at the first covered instant with the
mean utilisation, covering the readable time, and one with NaN utilisation covering the
unreadable rest; where the minute's coverage had a hole, the last row is moved to end at
the last covered instant. So per GPU and minute the covered, readable and busy time, and a
GPU's observed span (its capacity), are what the raw samples gave; what is lost is where
inside a minute the busy and idle time lay, which only moves startup/teardown/straggler
and checkpoint splits, at minute resolution.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from auditor.classify.arrays import FloatArr, IntArr, ObjArr, starts_of
from auditor.classify.coverage import SampleTable, load_samples
from auditor.model import Window
from auditor.settings import Thresholds

MINUTE_MS = 60_000

ROLLUP_COLUMNS = (
    "gpu",
    "minute_ms",
    "samples",
    "covered_ms",
    "readable_ms",
    "util_min",
    "util_mean",
    "util_max",
    "covered_from_ms",
    "covered_to_ms",
    "memory_used_max_mib",
    "power_mean_w",
)
"""Columns of `minute_aggregates`' frame (`gpu` is the UUID)."""

PSEUDO_COLUMNS = ("gpu", "ts_ms", "util", "throttle_reasons", "cover_ms")


def _cut_at_minutes(ts: IntArr, end: IntArr) -> tuple[IntArr, IntArr, IntArr, IntArr]:
    """(sample index, minute start, piece start, piece length) of `[ts, end)` cut at minutes."""
    m0 = ts // MINUTE_MS
    m1 = (end - 1) // MINUTE_MS
    count = (m1 - m0 + 1).astype(np.int64)
    sample = np.repeat(np.arange(ts.size, dtype=np.int64), count)
    offset = np.arange(sample.size, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    minute = (m0[sample] + offset) * MINUTE_MS
    start = np.maximum(ts[sample], minute)
    stop = np.minimum(end[sample], minute + MINUTE_MS)
    return sample, minute, start, stop - start


def minute_aggregates(
    samples: pd.DataFrame, *, before_ms: int, thresholds: Thresholds
) -> pd.DataFrame:
    """Per GPU and UTC minute, what the samples stamped before `before_ms` covered.

    `samples`: gpu (UUID), ts_ms, util (percent, NaN unreadable), optionally
    memory_used_mib and power_w; it should also hold the samples up to a few periods after
    `before_ms`, so that the last sample before it sees its successor (those later samples
    are not rolled up themselves). Coverage that runs past `before_ms` lands in the minutes
    it reaches. Returns `ROLLUP_COLUMNS`, sorted by gpu and minute; empty minutes are absent.
    """
    frame = samples.sort_values(["gpu", "ts_ms"], kind="stable")
    st = load_samples(frame[["gpu", "ts_ms", "util"]], thresholds=thresholds)
    take = np.flatnonzero(st.ts < before_ms)
    if take.size == 0:
        return _empty_aggregates()
    sample, minute, start, length = _cut_at_minutes(st.ts[take], st.cov_end[take])
    row = take[sample]
    first = np.ones(sample.size, dtype=np.bool_)
    first[1:] = sample[1:] != sample[:-1]
    gpu = st.gpu[row]
    at = np.flatnonzero(starts_of(gpu, minute))
    util = st.util[row]
    readable = ~np.isnan(util)
    read_ms = np.where(readable, length, 0)
    readable_ms = np.add.reduceat(read_ms, at)
    busy = np.add.reduceat(np.where(readable, util, 0.0) * read_ms, at)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(readable_ms > 0, busy / np.maximum(readable_ms, 1), np.nan)
    memory, power = _extras(frame, st, take)
    p_mem, p_pow = memory[sample], power[sample]
    p_pow_ms = np.where(np.isnan(p_pow), 0, length)
    pow_ms = np.add.reduceat(p_pow_ms, at)
    pow_sum = np.add.reduceat(np.nan_to_num(p_pow) * p_pow_ms, at)
    with np.errstate(invalid="ignore", divide="ignore"):
        power_mean = np.where(pow_ms > 0, pow_sum / np.maximum(pow_ms, 1), np.nan)
    uuids: ObjArr = st.uuids
    return pd.DataFrame(
        {
            "gpu": uuids[gpu[at]],
            "minute_ms": minute[at],
            "samples": np.add.reduceat(first.astype(np.int64), at),
            "covered_ms": np.add.reduceat(length, at),
            "readable_ms": readable_ms,
            "util_min": np.fmin.reduceat(util, at),
            "util_mean": mean,
            "util_max": np.fmax.reduceat(util, at),
            "covered_from_ms": np.minimum.reduceat(start, at),
            "covered_to_ms": np.maximum.reduceat(start + length, at),
            "memory_used_max_mib": np.fmax.reduceat(p_mem, at),
            "power_mean_w": power_mean,
        }
    )


def _extras(frame: pd.DataFrame, st: SampleTable, take: IntArr) -> tuple[FloatArr, FloatArr]:
    """Memory used and power of the samples `take` of `st`, NaN where the source had none.

    `frame` is sorted as `load_samples` sorts; where it had no duplicate instants (a store's
    rows never do) its rows are the samples, one to one; else they are matched by key.
    """
    aligned = (
        len(frame) == st.ts.size
        and np.array_equal(frame["ts_ms"].to_numpy(dtype=np.int64), st.ts)
        and bool((frame["gpu"].astype(str).to_numpy(dtype=object) == st.uuids[st.gpu]).all())
    )
    want = None if aligned else pd.MultiIndex.from_arrays([st.uuids[st.gpu[take]], st.ts[take]])
    out: list[FloatArr] = []
    for col in ("memory_used_mib", "power_w"):
        if col not in frame.columns or take.size == 0:
            out.append(np.full(take.size, np.nan, dtype=np.float64))
            continue
        values = pd.to_numeric(frame[col], errors="coerce").astype("float64").to_numpy()
        if want is None:
            out.append(values[take].astype(np.float64, copy=False))
            continue
        keys = pd.MultiIndex.from_arrays([frame["gpu"].astype(str), frame["ts_ms"].astype("int64")])
        # duplicates of one instant were merged by load_samples: keep the largest reading
        by_key = pd.Series(values, index=keys).groupby(level=[0, 1]).max()
        found = by_key.reindex(want).to_numpy(dtype=np.float64, na_value=np.nan)
        out.append(found.astype(np.float64, copy=False))
    return out[0], out[1]


def _empty_aggregates() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="float64") for c in ROLLUP_COLUMNS})
    frame["gpu"] = frame["gpu"].astype(object)
    for c in ("minute_ms", "samples", "covered_ms", "readable_ms", "covered_from_ms"):
        frame[c] = frame[c].astype("int64")
    frame["covered_to_ms"] = frame["covered_to_ms"].astype("int64")
    return frame


def pseudo_samples(minutes: pd.DataFrame) -> pd.DataFrame:
    """Rolled-up minutes as rows `classify` takes: gpu, ts_ms, util, throttle_reasons, cover_ms.

    `minutes`: gpu, covered_ms, readable_ms, util_mean, covered_from_ms, covered_to_ms (as
    `minute_aggregates` makes them and the store keeps them). See the module docstring for
    where the rows go; sorted by gpu and ts_ms.
    """
    gpu = minutes["gpu"].to_numpy(dtype=object)
    c = minutes["covered_ms"].to_numpy(dtype=np.int64)
    r = np.minimum(minutes["readable_ms"].to_numpy(dtype=np.int64), c)
    u = minutes["util_mean"].to_numpy(dtype=np.float64, na_value=np.nan)
    s = minutes["covered_from_ms"].to_numpy(dtype=np.int64)
    e = np.maximum(minutes["covered_to_ms"].to_numpy(dtype=np.int64), s + c)
    n = c - r
    hole = e - s > c
    half_r, half_n = r // 2, n // 2
    # first row: at the first covered instant
    u1 = np.where(r > 0, u, np.nan)
    len1 = np.where(r > 0, r, n)
    len1 = np.where(hole & (n == 0), r - half_r, len1)
    len1 = np.where(hole & (r == 0), n - half_n, len1)
    # second row: the unreadable rest after it, or, over a hole, ending at the last instant
    u2 = np.where((r > 0) & (n == 0), u, np.nan)
    len2 = np.where(r > 0, n, 0)
    len2 = np.where(hole & (n == 0), half_r, len2)
    len2 = np.where(hole & (r == 0), half_n, len2)
    t2 = np.where(hole, e - len2, s + len1)
    keep1, keep2 = len1 > 0, len2 > 0
    out = pd.DataFrame(
        {
            "gpu": np.concatenate([gpu[keep1], gpu[keep2]]),
            "ts_ms": np.concatenate([s[keep1], t2[keep2]]).astype(np.int64),
            "util": np.concatenate([u1[keep1], u2[keep2]]).astype(np.float64),
            "throttle_reasons": None,
            "cover_ms": np.concatenate([len1[keep1], len2[keep2]]).astype(np.int64),
        },
        columns=list(PSEUDO_COLUMNS),
    )
    return out.sort_values(["gpu", "ts_ms"], kind="stable").reset_index(drop=True)


def with_rolled(raw: pd.DataFrame, rolled: pd.DataFrame) -> pd.DataFrame:
    """Raw samples and rolled-up pseudo-samples as one frame for `classify`.

    `raw` itself where nothing was rolled up (so an audit without rollups reads exactly what
    it always did); else both, raw rows with a NaN `cover_ms`, sorted by gpu and ts_ms.
    """
    if rolled.empty:
        return raw
    parts = [
        raw.assign(gpu=raw["gpu"].astype(str).astype(object), cover_ms=np.nan),
        rolled.assign(gpu=rolled["gpu"].astype(object), cover_ms=rolled["cover_ms"].astype(float)),
    ]
    both = pd.concat([p for p in parts if len(p)], ignore_index=True)
    both["ts_ms"] = both["ts_ms"].astype("int64")
    both["util"] = both["util"].astype("float64")
    return both.sort_values(["gpu", "ts_ms"], kind="stable").reset_index(drop=True)


def rolled_up_seconds(
    samples: pd.DataFrame, *, window: Window, gpus: Collection[str] | None = None
) -> float:
    """GPU-seconds of `window` that rolled-up rows (a `cover_ms` value) cover, of `gpus`.

    What an audit run records as audited from rollups. A rolled-up row covers
    `[ts, ts + min(cover_ms, time to the GPU's next row))`, as in `coverage.load_samples`.
    """
    if "cover_ms" not in samples.columns or samples.empty:
        return 0.0
    frame = samples[["gpu", "ts_ms", "cover_ms"]]
    if gpus is not None:
        frame = frame[frame["gpu"].isin(list(gpus))]
    frame = frame.sort_values(["gpu", "ts_ms"], kind="stable")
    cover = frame["cover_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
    if not bool((~np.isnan(cover)).any()):
        return 0.0
    gpu = frame["gpu"].to_numpy(dtype=object)
    ts = frame["ts_ms"].to_numpy(dtype=np.int64)
    has_next = np.zeros(ts.size, dtype=np.bool_)
    has_next[:-1] = gpu[1:] == gpu[:-1]
    nxt = np.append(ts[1:], 0)
    rolled = ~np.isnan(cover)
    end = ts + np.nan_to_num(cover).astype(np.int64)
    end = np.where(has_next, np.minimum(end, nxt), end)
    lo = np.maximum(ts, window[0])
    hi = np.minimum(end, window[1])
    return float(np.clip(hi - lo, 0, None)[rolled].sum()) / 1000.0
