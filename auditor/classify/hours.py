"""Results per UTC hour inside a window (SPEC §11 "Any window of audited history").

An hour's bucket is `[max(hour, window start), min(hour + 1 h, window end))`: a window not on
whole hours keeps its edge buckets. A piece's categories are fixed fractions of its time
(`auditor.classify.pieces`), so cutting it at the hour grid and clipping each part to its
bucket gives, per bucket, exactly what a window of that bucket alone would sum: the
classifier judges whole tenures and runs, whatever the window (SPEC §3 "Whole tenures").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.classify.arrays import FloatArr, IntArr, ObjArr
from auditor.classify.codes import N_CATEGORIES
from auditor.classify.pieces import Pieces, Plain, sum_cells
from auditor.classify.timeline import TenureTable
from auditor.model import Window

HOUR_MS = 3_600_000
"""The bucket audit results are stored in."""


def hour_buckets(window: Window, bucket_ms: int = HOUR_MS) -> list[Window]:
    """The buckets of `window`, in time order: whole hours inside, clipped at its edges."""
    out: list[Window] = []
    h = window.start_ms // bucket_ms * bucket_ms
    while h < window.end_ms:
        out.append(Window(max(h, window.start_ms), min(h + bucket_ms, window.end_ms)))
        h += bucket_ms
    return out


def bucket_rows(
    start: IntArr, end: IntArr, *, window: Window, bucket_ms: int = HOUR_MS, sort: bool = True
) -> tuple[IntArr, IntArr]:
    """(row, bucket) for every bucket each `[start, end)` clipped to `window` touches, sorted
    by bucket (the index into `hour_buckets`; stably: each bucket's rows in row order), or
    with `sort=False` in row order, a row's buckets in time order; rows outside the window
    appear in none."""
    first = window.start_ms // bucket_ms * bucket_ms
    lo = np.maximum(start, window.start_ms)
    hi = np.minimum(end, window.end_ms)
    inside = np.flatnonzero(hi > lo)
    k0 = (lo[inside] - first) // bucket_ms
    k1 = (hi[inside] - 1 - first) // bucket_ms
    n = (k1 - k0 + 1).astype(np.int64)
    rows = np.repeat(inside, n)
    offset = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    bucket = np.repeat(k0, n) + offset
    if not sort:
        return rows.astype(np.int64), bucket.astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    return rows[order].astype(np.int64), bucket[order].astype(np.int64)


def _take_pieces(pieces: Pieces, rows: IntArr) -> Pieces:
    return Pieces(
        gpu=pieces.gpu[rows],
        tenure=pieces.tenure[rows],
        start=pieces.start[rows],
        end=pieces.end[rows],
        busy=pieces.busy[rows],
        cat_a=pieces.cat_a[rows],
        frac_a=pieces.frac_a[rows],
        cat_b=pieces.cat_b[rows],
        frac_b=pieces.frac_b[rows],
        blame=pieces.blame[rows],
        run=pieces.run[rows],
        gap=pieces.gap[rows],
        estimated=None if pieces.estimated is None else pieces.estimated[rows],
    )


def _take_plain(rest: Plain, rows: IntArr) -> Plain:
    return Plain(
        gpu=rest.gpu[rows],
        tenure=rest.tenure[rows],
        start=rest.start[rows],
        end=rest.end[rows],
        category=rest.category[rows],
        weight=None if rest.weight is None else rest.weight[rows],
    )


def sum_results_by_hour(
    pieces: Pieces,
    *,
    rest: Plain,
    window: Window,
    tenures: TenureTable,
    uuids: ObjArr,
    bucket_ms: int = HOUR_MS,
) -> pd.DataFrame:
    """`sum_results` per bucket of `window`, with `hour_ms` (the bucket's start) added.

    Each bucket sums only the pieces that touch it, clipped to it: the work is the pieces
    plus the ones an hour boundary cuts, not pieces times hours. The buckets are summed
    together, as many at a time as keep the dense sums within `CELLS` (a long window of
    many tenures goes in groups of hours)."""
    buckets = hour_buckets(window, bucket_ms)
    first = window.start_ms // bucket_ms * bucket_ms
    n_est = 1 if pieces.estimated is None else 2
    size = (tenures.size + uuids.size) * N_CATEGORIES * n_est
    per_group = max(1, CELLS // max(size, 1))
    # in groups, the rows sorted by bucket; in one, as they come (the sums need no order:
    # each cell adds its rows in row order either way)
    grouped = per_group < len(buckets)
    p_rows, p_bucket = bucket_rows(
        pieces.start, pieces.end, window=window, bucket_ms=bucket_ms, sort=grouped
    )
    r_rows, r_bucket = bucket_rows(
        rest.start, rest.end, window=window, bucket_ms=bucket_ms, sort=grouped
    )
    frames: list[pd.DataFrame] = []
    for g0 in range(0, len(buckets), per_group):
        g1 = min(g0 + per_group, len(buckets))
        p = slice(*np.searchsorted(p_bucket, [g0, g1])) if grouped else slice(None)
        r = slice(*np.searchsorted(r_bucket, [g0, g1])) if grouped else slice(None)
        part = _take_pieces(pieces, p_rows[p])
        plain = _take_plain(rest, r_rows[r])
        p_lo, p_hi = _bounds(p_bucket[p], first=first, window=window, bucket_ms=bucket_ms)
        r_lo, r_hi = _bounds(r_bucket[r], first=first, window=window, bucket_ms=bucket_ms)
        got = sum_cells(
            part,
            seconds=_inside_s(part.start, part.end, p_lo, p_hi),
            rest=plain,
            rest_seconds=_inside_s(plain.start, plain.end, r_lo, r_hi),
            tenures=tenures,
            uuids=uuids,
            buckets=(p_bucket[p] - g0, r_bucket[r] - g0, g1 - g0),
        )
        if len(got):
            starts = np.array([b.start_ms for b in buckets[g0:g1]], dtype=np.int64)
            hour = starts[got.pop("bucket").to_numpy(np.int64)]
            frames.append(got.assign(hour_ms=hour))
    if not frames:
        return empty_hourly()
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


CELLS = 1 << 22
"""Dense sums `sum_results_by_hour` keeps at once (32 MiB of float64 per array)."""


def _bounds(bucket: IntArr, *, first: int, window: Window, bucket_ms: int) -> tuple[IntArr, IntArr]:
    """Each bucket's `[start, end)`: its hour, clipped to the window."""
    lo = np.maximum(first + bucket * bucket_ms, window.start_ms)
    hi = np.minimum(first + (bucket + 1) * bucket_ms, window.end_ms)
    return lo, hi


def _inside_s(start: IntArr, end: IntArr, lo: IntArr, hi: IntArr) -> FloatArr:
    """Seconds of each `[start, end)` inside its `[lo, hi)`."""
    out: FloatArr = np.maximum(np.minimum(end, hi) - np.maximum(start, lo), 0) / 1000.0
    return out


def empty_hourly() -> pd.DataFrame:
    from auditor.classify.pieces import empty_results

    return empty_results().assign(hour_ms=pd.Series([], dtype=np.int64))


def cut_at_hours(frame: pd.DataFrame, *, window: Window, bucket_ms: int = HOUR_MS) -> pd.DataFrame:
    """Rows with `start_ms`, `end_ms` and `seconds` (a fixed share of their time) cut at the
    hour grid inside `window`, each part's seconds in proportion to its time, with
    `hour_ms` (its bucket's start). Other columns (a piece's unclipped `mid_ms`) are kept as
    they were, so a cut piece is judged as the whole one was."""
    if frame.empty:
        return frame.assign(hour_ms=pd.Series([], dtype=np.int64))
    start = frame["start_ms"].to_numpy(np.int64)
    end = frame["end_ms"].to_numpy(np.int64)
    rows, bucket = bucket_rows(start, end, window=window, bucket_ms=bucket_ms)
    first = window.start_ms // bucket_ms * bucket_ms
    b_lo = np.maximum(first + bucket * bucket_ms, window.start_ms)
    b_hi = np.minimum(first + (bucket + 1) * bucket_ms, window.end_ms)
    lo = np.maximum(start[rows], b_lo)
    hi = np.minimum(end[rows], b_hi)
    length = np.maximum(end[rows] - start[rows], 1).astype(np.float64)
    share = (hi - lo).astype(np.float64) / length
    out = frame.iloc[rows].reset_index(drop=True)
    out["start_ms"] = lo
    out["end_ms"] = hi
    out["seconds"] = out["seconds"].to_numpy(np.float64) * share
    out["hour_ms"] = b_lo.astype(np.int64)
    return out
