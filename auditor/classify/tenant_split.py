"""The split of a shared card's covered intervals among its tenants and its free share
(SPEC §7; the whole method is in `auditor.classify.shares`' docstring): per pseudo-sample,
each tenant's share and activity, the card's busy and idle parts, and the free part that is
`unallocated`. Pure numpy over one card's samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from auditor.classify.arrays import BoolArr, FloatArr, IntArr
from auditor.model import Window

EPS = 1e-9
"""Shares within this of 1 count as 1; sums within this of 1 are not oversubscribed."""


@dataclass(frozen=True)
class Tenant:
    """One tenure of a shared card: its row in the tenures, pod, span and share (NaN:
    an equal split)."""

    row: int
    pod: str
    start: int
    end: int
    share: float


def nearest(ts: IntArr, values: FloatArr, at: IntArr, *, within: int) -> FloatArr:
    """Per instant in `at`, the value of the nearest `ts` no further than `within`, else NaN."""
    out = np.full(at.size, np.nan)
    if ts.size == 0:
        return out
    right = np.clip(np.searchsorted(ts, at, side="left"), 0, ts.size - 1)
    left = np.clip(right - 1, 0, ts.size - 1)
    pick = np.where(np.abs(ts[left] - at) <= np.abs(ts[right] - at), left, right)
    ok = np.abs(ts[pick] - at) <= within
    out[ok] = values[pick[ok]]
    return out


def split_card(
    *,
    uuid: str,
    ts: IntArr,
    util: FloatArr,
    cov_end: IntArr,
    last_end: int,
    throttle: IntArr,
    period: int,
    tenants: list[Tenant],
    by_tenant: dict[tuple[str, str], tuple[IntArr, FloatArr]],
    window: Window,
    more_cuts: IntArr | None = None,
    origin: IntArr | None = None,
) -> tuple[
    dict[str, np.ndarray],
    list[tuple[Tenant, dict[str, np.ndarray]]],
    list[tuple[str, int, int, float, str]],
]:
    """One shared card: its free-share pseudo-samples and one set per tenant. `origin`: what
    each sample is known by outside (None: its index here); every pseudo-sample keeps its
    sample's, so that it carries what the sample does (when its reading was taken, and
    whether it is a rolled-up minute), as the sample does unshared."""
    cuts = np.array([t.start for t in tenants] + [t.end for t in tenants], dtype=np.int64)
    if more_cuts is not None:
        cuts = np.concatenate([cuts, more_cuts])
    cuts = cuts[(cuts > ts[0]) & (cuts < last_end)]
    points = np.union1d(ts, cuts).astype(np.int64)
    m = points.size
    parent = np.searchsorted(ts, points, side="right") - 1
    ends = np.append(points[1:], last_end).astype(np.int64)
    p_cov = np.minimum(np.maximum(cov_end[parent], points), ends)
    card_u = util[parent] / 100.0  # NaN where unreadable
    p_origin = (np.arange(ts.size, dtype=np.int64) if origin is None else origin)[parent]

    ranges = [
        (int(np.searchsorted(points, t.start)), int(np.searchsorted(points, t.end)))
        for t in tenants
    ]
    count = np.zeros(m + 1)
    explicit = np.zeros(m + 1)
    for t, (j0, j1) in zip(tenants, ranges, strict=True):
        count[j0] += 1
        count[j1] -= 1
        if not math.isnan(t.share):
            explicit[j0] += t.share
            explicit[j1] -= t.share
    n = np.cumsum(count)[:m]
    n_safe = np.maximum(n, 1)
    explicit_sum = np.cumsum(explicit)[:m]
    n_nan = n.copy()
    for t, (j0, j1) in zip(tenants, ranges, strict=True):
        if not math.isnan(t.share):
            n_nan[j0:j1] -= 1
    total = explicit_sum + n_nan / n_safe
    scaled = total > 1.0 + EPS
    factor = np.where(scaled, 1.0 / np.where(total > 0, total, 1.0), 1.0)
    free = np.where(n > 0, np.maximum(0.0, 1.0 - total * factor), 1.0)

    # Pass 1: each tenant's share at each instant and its measured activity.
    shares: list[FloatArr] = []
    measured: list[FloatArr] = []
    k_sum = np.zeros(m)
    for t, (j0, j1) in zip(tenants, ranges, strict=True):
        raw = np.full(j1 - j0, t.share) if not math.isnan(t.share) else 1.0 / n_safe[j0:j1]
        shares.append(raw * factor[j0:j1])
        got = by_tenant.get((uuid, t.pod))
        if got is None:
            meas = np.full(j1 - j0, np.nan)
        else:
            meas = nearest(got[0], got[1], ts[parent[j0:j1]], within=period // 2)
        measured.append(meas)
        k_sum[j0:j1] += np.nan_to_num(meas)
    # Instants where nothing was measured (or all measured nothing while the card was
    # active) split U by share; where the card did nothing, nobody did.
    trust = (k_sum > 0) | (card_u == 0)
    unmeasured_share = np.zeros(m)
    for (j0, j1), s, meas in zip(ranges, shares, measured, strict=True):
        unknown = np.isnan(meas) | ~trust[j0:j1]
        unmeasured_share[j0:j1] += np.where(unknown, s, 0.0)

    # Pass 2: each tenant's activity and unused capacity.
    acts: list[FloatArr] = []
    unused: list[FloatArr] = []
    estimated: list[BoolArr] = []
    unused_sum = np.zeros(m)
    for (j0, j1), s, meas in zip(ranges, shares, measured, strict=True):
        big_u = card_u[j0:j1]
        k = k_sum[j0:j1]
        rest_share = unmeasured_share[j0:j1]
        unknown = np.isnan(meas) | ~trust[j0:j1]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            from_measure = np.where(
                rest_share > 0, meas * np.minimum(1.0, big_u / k), meas * big_u / k
            )
            leftover = np.where(trust[j0:j1], np.maximum(0.0, big_u - k), big_u)
            from_share = leftover * s / np.where(rest_share > 0, rest_share, 1.0)
        u = np.where(big_u == 0, 0.0, np.where(unknown, from_share, from_measure))
        free_cap = np.maximum(0.0, s - u)
        acts.append(u)
        unused.append(free_cap)
        estimated.append(unknown & (n[j0:j1] >= 2) & (big_u > 0))
        unused_sum[j0:j1] += np.nan_to_num(free_cap)
    room = unused_sum + free
    idle_total = 1.0 - card_u
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        free_covered = np.where(
            np.isnan(card_u),
            free,
            np.where(room > 0, idle_total * free / np.where(room > 0, room, 1.0), 0.0)
            + np.where(n > 0, 0.0, card_u),
        )

    virtual: list[tuple[Tenant, dict[str, np.ndarray]]] = []
    for t, (j0, j1), s, u, cap, est in zip(
        tenants, ranges, shares, acts, unused, estimated, strict=True
    ):
        room_t = room[j0:j1]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            idle_part = np.where(
                room_t > 0, idle_total[j0:j1] * cap / np.where(room_t > 0, room_t, 1.0), 0.0
            )
            share_util = np.minimum(1.0, u / s)
            factor_t = np.where(share_util < 1.0, idle_part / (1.0 - share_util), 0.0)
        virtual.append(
            (
                t,
                {
                    "ts": points[j0:j1],
                    "util": share_util * 100.0,
                    "cov_end": p_cov[j0:j1],
                    "span_end": ends[j0:j1],
                    "throttle": throttle[parent[j0:j1]],
                    "busy": np.nan_to_num(u),
                    "idle": np.nan_to_num(factor_t),
                    "covered": s,
                    "gap": s,
                    "estimated": est,
                    "origin": p_origin[j0:j1],
                },
            )
        )

    over: list[tuple[str, int, int, float, str]] = []
    if scaled.any():
        lo = np.maximum(points, window[0])
        hi = np.minimum(ends, window[1])
        inside = scaled & (hi > lo)
        if inside.any():
            over.append(
                (
                    uuid,
                    int(lo[inside].min()),
                    int(hi[inside].max()),
                    float((hi[inside] - lo[inside]).sum()) / 1000.0,
                    f"tenants' shares add up to {float(total[inside].max()):.2f} of the card;"
                    " scaled to 1",
                )
            )
    free_arrays: dict[str, np.ndarray] = {
        "ts": points,
        "util": util[parent],
        "cov_end": p_cov,
        "span_end": ends,
        "throttle": throttle[parent],
        "covered": np.nan_to_num(free_covered),
        "gap": free,
        # kernels that ran while no tenant held the card: busy, though nobody's (free
        # stretches while tenants are present carry only idle: their busy is the tenants')
        "busy": np.where(n > 0, 0.0, np.nan_to_num(card_u)),
        "origin": p_origin,
    }
    return free_arrays, virtual, over
