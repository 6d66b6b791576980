"""Ground truth: where every GPU-second of the window went, from the labels by construction.

The arithmetic is SPEC §3's: a sample covers until its card's next sample, or one period where
that is more than `gap_periods` periods away (the rest is `unobserved`); tenure boundaries split
an interval in proportion to time; a held interval's busy part is `u·dt` and its idle part
goes to the category its label says. Startup and teardown runs turn into `reserved_idle` past
their caps. An active sample of a multi-card gang waits `(u_max − u)·dt` for a straggler where
the gang's busiest card is more than the tolerance busier (computed by `straggler_points`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.model import CATEGORIES, WasteCategory, Window
from auditor.settings import Thresholds
from auditor.simulate.plan import Label

CAT = {c: i for i, c in enumerate(CATEGORIES)}
NO_POD = -1

_IDLE_OF_LABEL = {
    Label.ACTIVE: WasteCategory.COMPUTE_IDLE,
    Label.RESERVED: WasteCategory.RESERVED_IDLE,
    Label.WAIT: WasteCategory.STRAGGLER_WAIT,
    Label.CHECKPOINT: WasteCategory.CHECKPOINT,
    Label.STALL: WasteCategory.COMPUTE_IDLE,
}


@dataclass(frozen=True, slots=True)
class Tenure:
    """One pod's hold of one card, with what the truth needs to split its runs."""

    pod: int
    bound_ms: int
    released_ms: int | None
    lead: Label
    """Label of the part of the tenure before its first sample (LEAD, or RESERVED when the
    card is never used)."""
    trail_start_ms: int | None
    """First sample of the trailing idle run, if the tenure has one."""


def straggler_points(
    util: np.ndarray, label: np.ndarray, present: np.ndarray, *, tolerance: float
) -> np.ndarray:
    """Per card and tick of one gang: the points by which its busiest card is busier,
    where that exceeds `tolerance` on an active sample; 0 elsewhere."""
    seen = np.where(present, util.astype(np.float32), -1.0)
    top = seen.max(axis=0, keepdims=True)
    gap = top - util
    active = present & (label == Label.ACTIVE)
    return np.where(active & (gap > tolerance), gap, 0.0).astype(np.float32)


def card_truth(
    *,
    ts: np.ndarray,
    present: np.ndarray,
    util: np.ndarray,
    label: np.ndarray,
    strag: np.ndarray,
    tenures: list[Tenure],
    window: Window,
    thresholds: Thresholds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pod index or -1, category index, seconds) for one card, summed per pod and category."""
    t = ts[present].astype(np.float64)
    if t.size == 0:
        empty = np.zeros(0)
        return empty.astype(np.int64), empty.astype(np.int64), empty
    u = util[present] / 100.0
    lab = label[present]
    st = strag[present] / 100.0
    spacing = np.diff(t)
    period = float(np.median(spacing)) if spacing.size else thresholds.default_period_s * 1000
    cov_end = np.empty_like(t)
    cov_end[:-1] = np.where(spacing > thresholds.gap_periods * period, t[:-1] + period, t[1:])
    cov_end[-1] = t[-1] + period

    tenures = sorted(tenures, key=lambda x: x.bound_ms)
    if not tenures:  # never held: a tenure that starts after everything keeps arrays simple
        tenures = [
            Tenure(
                pod=NO_POD, bound_ms=2**62, released_ms=None, lead=Label.LEAD, trail_start_ms=None
            )
        ]
    bound = np.array([x.bound_ms for x in tenures], dtype=np.float64)
    released = np.array(
        [np.inf if x.released_ms is None else x.released_ms for x in tenures], dtype=np.float64
    )
    lead = np.array([int(x.lead) for x in tenures], dtype=np.int8)
    pod = np.array([x.pod for x in tenures], dtype=np.int64)
    lead_cap = bound + thresholds.startup_cap_s * 1000
    trail_cap = (
        np.array(
            [np.nan if x.trail_start_ms is None else x.trail_start_ms for x in tenures],
            dtype=np.float64,
        )
        + thresholds.teardown_cap_s * 1000
    )
    lo, hi = max(window[0], t[0]), min(window[1], cov_end[-1])
    points = np.concatenate([t, cov_end, bound, released, lead_cap, trail_cap, [lo, hi]])
    points = np.unique(points[np.isfinite(points)])
    points = points[(points >= lo) & (points <= hi)]
    a = points[:-1]
    seconds = np.diff(points) / 1000.0

    s = np.searchsorted(t, a, side="right") - 1
    covered = a < cov_end[s]
    ti = np.searchsorted(bound, a, side="right") - 1
    tic = np.clip(ti, 0, None)
    held = (ti >= 0) & (a < released[tic])
    owner = np.where(held, pod[tic], NO_POD)

    cat_rows: list[np.ndarray] = []
    pod_rows: list[np.ndarray] = []
    sec_rows: list[np.ndarray] = []

    def add(mask: np.ndarray, category: WasteCategory, amount: np.ndarray) -> None:
        cat_rows.append(np.full(int(mask.sum()), CAT[category]))
        pod_rows.append(owner[mask])
        sec_rows.append(amount[mask])

    add(~covered, WasteCategory.UNOBSERVED, seconds)
    add(covered & ~held, WasteCategory.UNALLOCATED, seconds)
    inside = covered & held
    own = inside & (t[s] >= bound[tic])
    eff = np.where(own, lab[s], lead[tic])
    busy = u[s] * seconds
    add(inside, WasteCategory.BUSY, busy)
    wait = np.where(eff == Label.ACTIVE, st[s], 0.0) * seconds
    add(inside & (eff == Label.ACTIVE), WasteCategory.STRAGGLER_WAIT, wait)
    rest = seconds - busy - wait
    if bool((inside & (eff == Label.UNHELD)).any()):
        raise AssertionError("a held interval has no label")
    for lbl, category in _IDLE_OF_LABEL.items():
        add(inside & (eff == lbl), category, rest)
    is_lead, is_trail = inside & (eff == Label.LEAD), inside & (eff == Label.TRAIL)
    early = a < lead_cap[tic]
    add(is_lead & early, WasteCategory.STARTUP, rest)
    add(is_lead & ~early, WasteCategory.RESERVED_IDLE, rest)
    before = a < np.nan_to_num(trail_cap[tic], nan=np.inf)
    add(is_trail & before, WasteCategory.TEARDOWN, rest)
    add(is_trail & ~before, WasteCategory.RESERVED_IDLE, rest)

    cats = np.concatenate(cat_rows)
    pods = np.concatenate(pod_rows)
    secs = np.concatenate(sec_rows)
    key = (pods + 1) * len(CATEGORIES) + cats
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=secs)
    return keys // len(CATEGORIES) - 1, keys % len(CATEGORIES), sums
