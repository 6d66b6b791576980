"""Ground truth of a shared physical card under SPEC §7: the split of every covered interval.

A card's capacity is one card-second per second however it is divided. Each tenant `i` holds a
share `s_i` from its binding to its release and has an activity `u_i` (a fraction of the whole
card) at each of the card's samples; the card's own utilisation is `U`. Each piece of time
(sample coverage cut at tenure boundaries and at the startup/teardown caps) is split exactly
as §7 says:

- tenant activities are scaled down to sum to `U` where they exceed it; `busy_i = u_i`;
- the idle part `1 − U` is divided among the holders of unused capacity in proportion to it,
  tenant `i` holding `max(0, s_i − u_i)` and the free share `f = 1 − Σ s_i` the rest (shares
  summing above 1 are scaled to 1 first); the free part is `unallocated`;
- tenant `i`'s idle part goes to the category §3's rules give its *share utilisation*
  `min(1, u_i / s_i)`: leading idle run → `startup` up to the cap, then `reserved_idle`;
  trailing idle run of a closed tenure → `teardown` up to the cap, then `reserved_idle`; a
  tenure never active → `reserved_idle`; a middle run of at least `reserved_after` →
  `reserved_idle`; any other idle → `compute_idle`. The simulated shared workloads have no
  gangs across cards and no regular gaps, so `straggler_wait` and `checkpoint` never arise;
- time no sample covers is `unobserved`: each holder's share of it goes to its pod, the free
  share to the platform.

The runs are read from the activity series itself (not from generator labels), so the same
function gives the truth of §7's *estimated attribution* when it is handed `U` split by share
instead of the tenants' true activities (`estimated_activity`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.model import CATEGORIES, WasteCategory, Window
from auditor.settings import Thresholds

CAT = {c: i for i, c in enumerate(CATEGORIES)}
NO_POD = -1

_LEAD, _TRAIL, _RESERVED, _COMPUTE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Holder:
    """One tenant of a card: its share and when it held it."""

    pod: int
    share: float
    bound_ms: int
    released_ms: int | None


def estimated_activity(util: np.ndarray, ts: np.ndarray, holders: list[Holder]) -> np.ndarray:
    """(tenants × samples) activity when only the card's `util` (0-1) is known: §7's split of
    `U` among the tenants holding the card at each sample, in proportion to their shares."""
    held = _held_at(ts, holders)
    shares = np.array([h.share for h in holders], dtype=np.float64)[:, None] * held
    total = shares.sum(axis=0)
    out: np.ndarray = np.where(total > 0, util[None, :] * shares / np.where(total > 0, total, 1), 0)
    return out


def _held_at(ts: np.ndarray, holders: list[Holder]) -> np.ndarray:
    bound = np.array([h.bound_ms for h in holders], dtype=np.float64)[:, None]
    released = np.array(
        [np.inf if h.released_ms is None else h.released_ms for h in holders], dtype=np.float64
    )[:, None]
    out: np.ndarray = (ts[None, :] >= bound) & (ts[None, :] < released)
    return out


def _sample_kinds(
    g: np.ndarray,
    t: np.ndarray,
    cov_end: np.ndarray,
    own: np.ndarray,
    *,
    closed: bool,
    thresholds: Thresholds,
) -> tuple[np.ndarray, bool, float | None]:
    """Per sample of the card: the kind of a tenant's idle there (only `own` samples matter);
    whether the tenure was never active; the time its trailing run starts (closed tenures)."""
    kinds = np.full(t.size, _COMPUTE, dtype=np.int8)
    idx = np.flatnonzero(own)
    if idx.size == 0:
        return kinds, True, None
    idle = g[idx] * 100.0 <= thresholds.idle_threshold_pct
    if idle.all():
        kinds[idx] = _RESERVED
        return kinds, True, None
    edges = np.flatnonzero(np.diff(np.concatenate([[0], idle.astype(np.int8), [0]])))
    trail_start: float | None = None
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        run = idx[a:b]
        if a == 0:
            kinds[run] = _LEAD
        elif b == idx.size and closed:
            kinds[run] = _TRAIL
            trail_start = float(t[run[0]])
        elif cov_end[run[-1]] - t[run[0]] >= thresholds.reserved_after_s * 1000:
            kinds[run] = _RESERVED
    return kinds, False, trail_start


def shared_card_truth(
    *,
    ts: np.ndarray,
    util: np.ndarray,
    activity: np.ndarray,
    holders: list[Holder],
    window: Window,
    data_end_ms: int,
    thresholds: Thresholds,
    estimated: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pod index or -1, category index, seconds) for one physical card, summed.

    `ts`: the card's sample times (ms, ascending); `util`: the card's utilisation (0-1) at
    each; `activity`: (tenants × samples) each holder's activity (a fraction of the card).
    `estimated`: the activity is `estimated_activity`; each piece then splits `U` among the
    tenants holding the card in that piece (a tenure boundary between two samples changes
    who shares it)."""
    t = ts.astype(np.float64)
    if t.size == 0:
        empty = np.zeros(0)
        return empty.astype(np.int64), empty.astype(np.int64), empty
    spacing = np.diff(t)
    period = float(np.median(spacing)) if spacing.size else thresholds.default_period_s * 1000
    cov_end = np.empty_like(t)
    cov_end[:-1] = np.where(spacing > thresholds.gap_periods * period, t[:-1] + period, t[1:])
    cov_end[-1] = t[-1] + period

    n = len(holders)
    bound = np.array([h.bound_ms for h in holders], dtype=np.float64)
    released = np.array(
        [np.inf if h.released_ms is None else h.released_ms for h in holders], dtype=np.float64
    )
    shares = np.array([h.share for h in holders], dtype=np.float64)
    own = _held_at(t, holders) if n else np.zeros((0, t.size), dtype=bool)
    activity = np.where(own, activity, 0.0)
    total = activity.sum(axis=0)
    activity = activity * np.where(total > util, util / np.where(total > 0, total, 1), 1.0)
    g = np.minimum(1.0, activity / np.where(shares > 0, shares, 1.0)[:, None])
    kinds = np.zeros((n, t.size), dtype=np.int8)
    never = np.zeros(n, dtype=bool)
    trail_cap = np.full(n, np.nan)
    for i, h in enumerate(holders):
        closed = h.released_ms is not None and h.released_ms <= data_end_ms
        kinds[i], never[i], trail = _sample_kinds(
            g[i], t, cov_end, own[i], closed=closed, thresholds=thresholds
        )
        if trail is not None:
            trail_cap[i] = trail + thresholds.teardown_cap_s * 1000
    lead_cap = bound + thresholds.startup_cap_s * 1000

    lo, hi = max(window[0], t[0]), min(window[1], cov_end[-1])
    points = np.concatenate([t, cov_end, bound, released, lead_cap, trail_cap, [lo, hi]])
    points = np.unique(points[np.isfinite(points)])
    points = points[(points >= lo) & (points <= hi)]
    a = points[:-1]
    seconds = np.diff(points) / 1000.0
    s = np.searchsorted(t, a, side="right") - 1
    covered = a < cov_end[s]

    rows_pod: list[np.ndarray] = []
    rows_cat: list[np.ndarray] = []
    rows_sec: list[np.ndarray] = []

    def add(pod: int, mask: np.ndarray, category: WasteCategory, amount: np.ndarray) -> None:
        if mask.any():
            rows_pod.append(np.full(int(mask.sum()), pod))
            rows_cat.append(np.full(int(mask.sum()), CAT[category]))
            rows_sec.append(amount[mask])

    held = (a[None, :] >= bound[:, None]) & (a[None, :] < released[:, None])
    total_share = (shares[:, None] * held).sum(axis=0)
    scale = np.where(total_share > 1.0, 1.0 / np.where(total_share > 0, total_share, 1), 1.0)
    s_eff = shares[:, None] * held * scale[None, :]
    free = np.clip(1.0 - s_eff.sum(axis=0), 0.0, 1.0)
    big_u = util[s]
    if estimated and n:
        u = big_u[None, :] * s_eff / np.where(s_eff.sum(axis=0) > 0, s_eff.sum(axis=0), 1)
    else:
        u = np.where(held, activity[:, s], 0.0) if n else np.zeros((0, a.size))
    u_sum = u.sum(axis=0)
    u = u * np.where(u_sum > big_u, big_u / np.where(u_sum > 0, u_sum, 1), 1.0)[None, :]
    unused = np.maximum(0.0, s_eff - u) * held
    pool = unused.sum(axis=0) + free
    idle = np.clip(1.0 - big_u, 0.0, 1.0)
    per_pool = np.where(pool > 0, idle / np.where(pool > 0, pool, 1), 0.0)
    nobody = ~held.any(axis=0) if n else np.ones(a.size, dtype=bool)

    add(NO_POD, ~covered, WasteCategory.UNOBSERVED, seconds * np.where(nobody, 1.0, free))
    add(NO_POD, covered & nobody, WasteCategory.UNALLOCATED, seconds)
    add(NO_POD, covered & ~nobody, WasteCategory.UNALLOCATED, seconds * free * per_pool)
    for i, h in enumerate(holders):
        mine = held[i]
        add(h.pod, mine & ~covered, WasteCategory.UNOBSERVED, seconds * s_eff[i])
        mine = mine & covered
        add(h.pod, mine, WasteCategory.BUSY, seconds * u[i])
        rest = seconds * unused[i] * per_pool
        if never[i]:
            add(h.pod, mine, WasteCategory.RESERVED_IDLE, rest)
            continue
        before = t[s] < bound[i]  # the part of the tenure before its first own sample
        kind = np.where(before, _LEAD, kinds[i][s])
        early = a < lead_cap[i]
        add(h.pod, mine & (kind == _LEAD) & early, WasteCategory.STARTUP, rest)
        add(h.pod, mine & (kind == _LEAD) & ~early, WasteCategory.RESERVED_IDLE, rest)
        soon = a < np.nan_to_num(trail_cap[i], nan=np.inf)
        add(h.pod, mine & (kind == _TRAIL) & soon, WasteCategory.TEARDOWN, rest)
        add(h.pod, mine & (kind == _TRAIL) & ~soon, WasteCategory.RESERVED_IDLE, rest)
        add(h.pod, mine & (kind == _RESERVED), WasteCategory.RESERVED_IDLE, rest)
        add(h.pod, mine & (kind == _COMPUTE), WasteCategory.COMPUTE_IDLE, rest)

    if not rows_pod:
        empty = np.zeros(0)
        return empty.astype(np.int64), empty.astype(np.int64), empty
    pods = np.concatenate(rows_pod)
    cats = np.concatenate(rows_cat)
    secs = np.concatenate(rows_sec)
    key = (pods + 1) * len(CATEGORIES) + cats
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=secs)
    return keys // len(CATEGORIES) - 1, keys % len(CATEGORIES), sums
