"""Array helpers of the classifier: type aliases, sorting and run-length grouping.

The classifier works on flat NumPy arrays sorted by a composite key (GPU, then time; or
gang, then tick, then card) so that every "per GPU" or "per gang" step is one vectorised
pass. This module owns the few idioms those passes share.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import numpy.typing as npt
import pandas as pd

IntArr = npt.NDArray[np.int64]
FloatArr = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]
ObjArr = npt.NDArray[np.object_]

KEY_LIMIT = 2**62
"""Composite keys stay below this, far from int64 overflow."""

INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min


def empty_int() -> IntArr:
    return np.zeros(0, dtype=np.int64)


def composite(major: IntArr, minor: IntArr, *, minor_span: int) -> IntArr | None:
    """`major * minor_span + minor` (both non-negative), or None where it could overflow."""
    if major.size == 0:
        return empty_int()
    if (int(major.max()) + 1) * max(minor_span, 1) >= KEY_LIMIT:
        return None
    return major * np.int64(minor_span) + minor


def order_by(*keys: IntArr) -> IntArr:
    """A stable order by the keys, most significant first (all non-negative).

    Uses one composite key where it fits in int64 (a stable sort is near-linear on the
    mostly sorted arrays the classifier builds), else `np.lexsort`.
    """
    if keys[0].size == 0:
        return empty_int()
    key: IntArr | None = keys[0]
    for minor in keys[1:]:
        if key is None:
            break
        key = composite(key, minor, minor_span=int(minor.max()) + 1)
    if key is not None:
        return np.argsort(key, kind="stable").astype(np.int64, copy=False)
    return np.lexsort(tuple(reversed(keys))).astype(np.int64, copy=False)


def ascending(*keys: IntArr) -> bool:
    """Whether the rows are already in order by the keys, most significant first (ties
    allowed): where they are, `order_by` would return every row where it stands."""
    if keys[0].size < 2:
        return True
    decided = np.zeros(keys[0].size - 1, dtype=np.bool_)  # an earlier key already orders
    for key in keys:
        before, after = key[:-1], key[1:]
        if bool(np.any(~decided & (before > after))):
            return False
        decided |= before < after
    return True


def starts_of(*keys: IntArr) -> BoolArr:
    """True on each row where any key differs from the row before (and on the first row)."""
    n = keys[0].size
    out = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return out
    out[0] = True
    for key in keys:
        out[1:] |= key[1:] != key[:-1]
    return out


def ends_of(starts: BoolArr) -> BoolArr:
    """True on the last row of each group, given the group starts."""
    out = np.zeros(starts.size, dtype=np.bool_)
    if starts.size:
        out[:-1] = starts[1:]
        out[-1] = True
    return out


def group_ids(starts: BoolArr) -> IntArr:
    """0-based group number of each row, given the group starts."""
    return np.cumsum(starts, dtype=np.int64) - 1


def combined(*keys: IntArr) -> IntArr | None:
    """One non-negative int64 key ordering like the keys (most significant first), or None
    where it would not fit."""
    key: IntArr | None = keys[0]
    for minor in keys[1:]:
        if key is None:
            return None
        key = composite(key, minor, minor_span=int(minor.max()) + 1 if minor.size else 1)
    return key


def reduce_groups(
    keys: tuple[IntArr, ...], *, lo: IntArr, hi: IntArr, seconds: FloatArr
) -> tuple[tuple[IntArr, ...], IntArr, IntArr, FloatArr, IntArr]:
    """Group rows by the keys (non-negative): per group its keys, the least `lo`, the greatest
    `hi`, the sum of `seconds` and the index of its first row; groups in key order.

    Linear time: rows already in key order are reduced in place, others through a hash
    factorisation (no sort of the rows).
    """
    n = keys[0].size
    if n == 0:
        e = empty_int()
        return tuple(e for _ in keys), e, e, np.zeros(0), e
    key = combined(*keys)
    if key is None or bool((key[1:] >= key[:-1]).all()):
        order = np.arange(n, dtype=np.int64) if key is not None else order_by(*keys)
        sorted_keys = tuple(k[order] for k in keys)
        at = np.flatnonzero(starts_of(*sorted_keys))
        return (
            tuple(k[at] for k in sorted_keys),
            np.minimum.reduceat(lo[order], at),
            np.maximum.reduceat(hi[order], at),
            np.add.reduceat(seconds[order], at),
            order[at],
        )
    codes, uniques = pd.factorize(key)
    rank = np.empty(uniques.size, dtype=np.int64)
    rank[np.argsort(uniques, kind="stable")] = np.arange(uniques.size, dtype=np.int64)
    group = rank[codes]
    first = np.full(uniques.size, n, dtype=np.int64)
    np.minimum.at(first, group, np.arange(n, dtype=np.int64))
    least = np.full(uniques.size, INT_MAX, dtype=np.int64)
    np.minimum.at(least, group, lo)
    most = np.full(uniques.size, INT_MIN, dtype=np.int64)
    np.maximum.at(most, group, hi)
    total = np.bincount(group, weights=seconds, minlength=uniques.size).astype(np.float64)
    return tuple(k[first] for k in keys), least, most, total, first


def run_factorize(values: pd.Series, *, sort: bool = False) -> tuple[IntArr, ObjArr]:
    """`pd.factorize(values, sort=sort)`, hashing only the first value of each run of equal
    values: the pieces and samples the classifier hands over come grouped by card and pod,
    and hashing every row of them cost more than the step that needed the codes."""
    objects = values.to_numpy(dtype=object)
    if objects.size == 0:
        return empty_int(), np.zeros(0, dtype=object)
    first = np.ones(objects.size, dtype=np.bool_)
    try:
        first[1:] = objects[1:] != objects[:-1]
    except TypeError:  # pd.NA compares to NA, not to a bool: hash every value instead
        codes, uniques = pd.factorize(objects, sort=sort)
        return codes.astype(np.int64), np.asarray(uniques, dtype=object)
    at = np.flatnonzero(first)
    codes, uniques = pd.factorize(objects[at], sort=sort)
    out: IntArr = np.repeat(codes.astype(np.int64), np.diff(np.append(at, objects.size)))
    return out, np.asarray(uniques, dtype=object)


def run_isin(values: pd.Series, wanted: Collection[object]) -> BoolArr:
    """`values.isin(wanted)` as an array, testing only the first value of each run (a
    missing value is never in)."""
    return codes_in(*run_factorize(values), wanted)


def codes_in(codes: IntArr, names: ObjArr, wanted: Collection[object]) -> BoolArr:
    """Per code into `names`, whether its name is in `wanted` (code -1, missing: never)."""
    hit = np.append(pd.Series(names, dtype=object).isin(list(wanted)).to_numpy(), False)
    out: BoolArr = hit[codes]  # code -1 reads the appended False
    return out
