"""Classified pieces of time, clipped to the audit window and summed into results.

A piece is a stretch `[start, end)` of one held GPU whose utilisation was read, its time
split by fixed fractions: `busy` of it is busy, `frac_a` goes to `cat_a`, `frac_b` to
`cat_b` (the straggler share of an active sample). Because the fractions are per unit of
time, clipping a piece to the window clips every category in proportion, which is what
makes the results of adjacent windows add up to those of their union.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify import codes
from auditor.classify.arrays import BoolArr, FloatArr, IntArr, ObjArr, order_by, reduce_groups
from auditor.classify.timeline import TenureTable
from auditor.model import CATEGORIES, Window

RESULT_COLUMNS = ["gpu", "pod_uid", "category", "seconds", "estimated"]


@dataclass(frozen=True)
class Pieces:
    """Parallel arrays, one entry per piece (see the module docstring)."""

    gpu: IntArr
    tenure: IntArr
    start: IntArr
    end: IntArr
    busy: FloatArr
    cat_a: IntArr
    frac_a: FloatArr
    cat_b: IntArr
    """NO_CATEGORY where the piece has no second category."""
    frac_b: FloatArr
    blame: IntArr
    """Observed row standing for the card waited on (-1 where nobody was waited on)."""
    run: IntArr
    """Idle run of the row the piece comes from (-1 where none)."""
    gap: IntArr
    """Gang-wide gap of the row the piece comes from (-1 where none)."""
    estimated: BoolArr | None = None
    """Per piece, whether its attribution was estimated by share (shared cards, SPEC §7);
    None where no card is shared."""

    def window_ms(self, start_ms: int, end_ms: int) -> tuple[IntArr, IntArr, FloatArr]:
        """Each piece clipped to the window: clipped start, clipped end, seconds inside."""
        lo = np.maximum(self.start, start_ms)
        hi = np.minimum(self.end, end_ms)
        return lo, hi, np.maximum(hi - lo, 0).astype(np.float64) / 1000.0


@dataclass(frozen=True)
class Plain:
    """Segments that are wholly one category: `unallocated` or `unobserved`."""

    gpu: IntArr
    tenure: IntArr
    start: IntArr
    end: IntArr
    category: IntArr
    weight: FloatArr | None = None
    """Card-seconds per second of each segment (a share of a partitioned card); None: 1."""


def empty_results() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu": pd.Series([], dtype=object),
            "pod_uid": pd.Series([], dtype=object),
            "category": pd.Series([], dtype=object),
            "seconds": pd.Series([], dtype=np.float64),
            "estimated": pd.Series([], dtype=bool),
        }
    )


def sum_results(
    pieces: Pieces,
    *,
    seconds: FloatArr,
    rest: Plain,
    window: Window,
    tenures: TenureTable,
    uuids: ObjArr,
) -> pd.DataFrame:
    """Seconds per (GPU, pod, category, estimated) inside the window.

    `seconds` is each piece's time inside the window; `rest` is clipped (and weighted) here.
    """
    rest_seconds = (
        np.maximum(np.minimum(rest.end, window[1]) - np.maximum(rest.start, window[0]), 0) / 1000.0
    )
    return sum_cells(
        pieces, seconds=seconds, rest=rest, rest_seconds=rest_seconds, tenures=tenures, uuids=uuids
    )


def sum_cells(
    pieces: Pieces,
    *,
    seconds: FloatArr,
    rest: Plain,
    rest_seconds: FloatArr,
    tenures: TenureTable,
    uuids: ObjArr,
    buckets: tuple[IntArr, IntArr, int] | None = None,
) -> pd.DataFrame:
    """Seconds per (GPU, pod, category, estimated): `seconds` of each piece and
    `rest_seconds` of each plain segment (unweighted), as `sum_results` gives them.

    With `buckets` = (the pieces' bucket, the segments' bucket, number of buckets), per
    bucket too: a `bucket` column leads, and rows come in bucket order, each bucket's in
    the order one bucket alone gives."""
    n_ten = tenures.size
    n_cat = codes.N_CATEGORIES
    n_est = 1 if pieces.estimated is None else 2
    size = (n_ten + uuids.size) * n_cat * n_est
    n_buckets = 1 if buckets is None else buckets[2]

    def cell(gpu: IntArr, tenure: IntArr) -> IntArr:
        return np.where(tenure >= 0, tenure, n_ten + gpu) * (n_cat * n_est)

    base = cell(pieces.gpu, pieces.tenure)
    if pieces.estimated is not None:
        base = base + pieces.estimated.astype(np.int64) * n_cat
    rest_base = cell(rest.gpu, rest.tenure) + rest.category
    if buckets is not None:
        base = base + buckets[0] * size
        rest_base = rest_base + buckets[1] * size
    cells = size * n_buckets
    totals = np.zeros(cells)
    totals += np.bincount(base + codes.BUSY, weights=pieces.busy * seconds, minlength=cells)
    totals += np.bincount(base + pieces.cat_a, weights=pieces.frac_a * seconds, minlength=cells)
    has_b = pieces.cat_b >= 0
    if has_b.any():
        totals += np.bincount(
            base[has_b] + pieces.cat_b[has_b],
            weights=pieces.frac_b[has_b] * seconds[has_b],
            minlength=cells,
        )
    if rest.weight is not None:
        rest_seconds = rest_seconds * rest.weight
    totals += np.bincount(rest_base, weights=rest_seconds, minlength=cells)
    nonzero = np.flatnonzero(totals > 0)
    if nonzero.size == 0:
        empty = empty_results()
        return empty if buckets is None else empty.assign(bucket=pd.Series([], dtype=np.int64))
    bucket, inside = nonzero // size, nonzero % size
    grp, rem = inside // (n_cat * n_est), inside % (n_cat * n_est)
    est, cat = rem // n_cat, rem % n_cat
    held = grp < n_ten
    ten = np.where(held, grp, 0)
    gpu = np.where(held, tenures.gpu[ten] if n_ten else 0, grp - n_ten)
    pod = np.where(held, tenures.pod[ten] if n_ten else 0, -1)
    (bucket, gpu, pod1, cat, est), _, _, seconds_sum, _ = reduce_groups(
        (bucket, gpu, pod + 1, cat, est), lo=gpu, hi=gpu, seconds=totals[nonzero]
    )
    names = np.array([str(c) for c in CATEGORIES], dtype=object)
    pod_uid = np.full(pod1.size, None, dtype=object)
    if tenures.pods.size:
        pod_uid[pod1 > 0] = tenures.pods[pod1[pod1 > 0] - 1]
    out = pd.DataFrame(
        {
            "gpu": pd.Series(uuids[gpu], dtype=object),
            "pod_uid": pd.Series(pod_uid, dtype=object),
            "category": pd.Series(names[cat], dtype=object),
            "seconds": seconds_sum,
            "estimated": est.astype(bool),
        }
    )
    if buckets is not None:
        out.insert(0, "bucket", bucket.astype(np.int64))
    return out


PIECE_COLUMNS = ["gpu", "pod_uid", "start_ms", "end_ms", "category", "seconds", "mid_ms"]


def empty_piece_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu": pd.Series([], dtype=object),
            "pod_uid": pd.Series([], dtype=object),
            "start_ms": pd.Series([], dtype=np.int64),
            "end_ms": pd.Series([], dtype=np.int64),
            "category": pd.Series([], dtype=object),
            "seconds": pd.Series([], dtype=np.float64),
            "mid_ms": pd.Series([], dtype=np.int64),
        }
    )


def piece_frame(
    pieces: Pieces,
    *,
    lo: IntArr,
    hi: IntArr,
    seconds: FloatArr,
    rest: Plain,
    window: Window,
    tenures: TenureTable,
    uuids: ObjArr,
    categories: Collection[str] | None = None,
) -> pd.DataFrame:
    """The classified pieces over time: one row per (piece, category) with seconds > 0, of
    `categories` only when given (the audit's causes need two of them).

    Columns `PIECE_COLUMNS`: start_ms and end_ms are the piece clipped to the window (`lo`,
    `hi`, `seconds` as `Pieces.window_ms` returns them); mid_ms is the midpoint of the
    whole piece, unclipped, so that a piece a window cuts is judged at the same instant in
    either window (the causes of SPEC §10); seconds is the category's fraction
    of the clipped time, computed as `sum_results` computes it, so that the seconds summed per
    (gpu, pod_uid, category) are the results. pod_uid is None where nobody held the card.
    Sorted by gpu, pod_uid (None first), start_ms and category (in `CATEGORIES` order),
    unless `categories` are given.
    """
    r_lo = np.maximum(rest.start, window[0])
    r_hi = np.minimum(rest.end, window[1])
    r_seconds = np.maximum(r_hi - r_lo, 0) / 1000.0
    if rest.weight is not None:
        r_seconds = r_seconds * rest.weight
    n = pieces.gpu.size
    chosen = None if categories is None else {str(c) for c in categories}
    wanted = np.array([chosen is None or c.value in chosen for c in CATEGORIES])
    # (rows of the pieces, their categories, their seconds) per block, filtered first
    blocks: list[tuple[IntArr, IntArr, FloatArr]] = []
    if wanted[codes.BUSY]:
        blocks.append((np.arange(n), np.full(n, codes.BUSY, dtype=np.int64), pieces.busy * seconds))
    a = np.flatnonzero(wanted[pieces.cat_a])
    blocks.append((a, pieces.cat_a[a], pieces.frac_a[a] * seconds[a]))
    b = np.flatnonzero((pieces.cat_b >= 0) & wanted[np.maximum(pieces.cat_b, 0)])
    blocks.append((b, pieces.cat_b[b], pieces.frac_b[b] * seconds[b]))
    rows = np.concatenate([r for r, _, _ in blocks])
    r_keep = np.flatnonzero(wanted[rest.category])
    category = np.concatenate([*(c for _, c, _ in blocks), rest.category[r_keep]])
    part = np.concatenate([*(x for _, _, x in blocks), r_seconds[r_keep]])
    keep = np.flatnonzero(part > 0)
    if keep.size == 0:
        return empty_piece_frame()
    # Each column is gathered from where it lives (the pieces' arrays, then the plain
    # segments') at the kept rows only, then put in reading order: row-sized gathers are
    # most of this function's time.
    n_rows = rows.size
    split = int(np.searchsorted(keep, n_rows))
    p_at, r_at = rows[keep[:split]], r_keep[keep[split:] - n_rows]
    order: IntArr | None = None

    def column(of_pieces: IntArr, of_rest: IntArr) -> IntArr:
        out = np.concatenate([of_pieces[p_at], of_rest[r_at]])
        return out if order is None else out[order]

    gpu, tenure, start = (
        column(pieces.gpu, rest.gpu),
        column(pieces.tenure, rest.tenure),
        column(lo, r_lo),
    )
    category, part = category[keep], part[keep]
    held = tenure >= 0
    pod = np.full(keep.size, -1, dtype=np.int64)
    pod[held] = tenures.pod[tenure[held]]
    # sorted for a reader that walks them in time; a selection (the audit's) needs no order
    if categories is None:
        order = order_by(gpu, pod + 1, start - start.min(), category)
        gpu, pod, start, held = gpu[order], pod[order], start[order], held[order]
        category, part = category[order], part[order]
    end = column(hi, r_hi)
    mid = np.concatenate(
        [(pieces.start[p_at] + pieces.end[p_at]) // 2, (rest.start[r_at] + rest.end[r_at]) // 2]
    )
    mid = mid if order is None else mid[order]
    pod_uid = np.full(keep.size, None, dtype=object)
    pod_uid[held] = tenures.pods[pod[held]]
    names = np.array([str(c) for c in CATEGORIES], dtype=object)
    # copy=False: the columns are this call's own arrays, kept as they are, where a copy
    # would gather them into one block per dtype (every object reference written again)
    return pd.DataFrame(
        {
            "gpu": pd.Series(uuids[gpu], dtype=object),
            "pod_uid": pd.Series(pod_uid, dtype=object),
            "start_ms": start.astype(np.int64, copy=False),
            "end_ms": end.astype(np.int64, copy=False),
            "category": pd.Series(names[category], dtype=object),
            "seconds": part,
            "mid_ms": mid.astype(np.int64, copy=False),
        },
        copy=False,
    )
