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


@dataclass(frozen=True, slots=True)
class Pieces:
    """One card's time, unsummed: per piece its start (ms), length (ms), pod index (-1:
    none), category index and seconds. A piece is an elementary interval (between samples,
    coverage ends, tenure boundaries and caps) and one category of it; an interval's busy,
    straggler and idle parts are pieces with the same start and length."""

    start_ms: np.ndarray
    length_ms: np.ndarray
    pod: np.ndarray
    cat: np.ndarray
    seconds: np.ndarray

    def of(self, category: WasteCategory) -> Pieces:
        keep = self.cat == CAT[category]
        return Pieces(
            self.start_ms[keep],
            self.length_ms[keep],
            self.pod[keep],
            self.cat[keep],
            self.seconds[keep],
        )


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
    got = card_pieces(
        ts=ts,
        present=present,
        util=util,
        label=label,
        strag=strag,
        tenures=tenures,
        window=window,
        thresholds=thresholds,
    )
    return summed(got)


def summed(got: Pieces) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pod index or -1, category index, seconds) of pieces, summed per pod and category."""
    key = (got.pod + 1) * len(CATEGORIES) + got.cat
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=got.seconds)
    return keys // len(CATEGORIES) - 1, keys % len(CATEGORIES), sums


def card_pieces(
    *,
    ts: np.ndarray,
    present: np.ndarray,
    util: np.ndarray,
    label: np.ndarray,
    strag: np.ndarray,
    tenures: list[Tenure],
    window: Window,
    thresholds: Thresholds,
) -> Pieces:
    """Every piece of one card's time in the window (`Pieces`), by SPEC §3's arithmetic."""
    t = ts[present].astype(np.float64)
    if t.size == 0:
        empty = np.zeros(0)
        ints = empty.astype(np.int64)
        return Pieces(empty, empty, ints, ints, empty)
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
    start_rows: list[np.ndarray] = []
    len_rows: list[np.ndarray] = []
    length = np.diff(points)

    def add(mask: np.ndarray, category: WasteCategory, amount: np.ndarray) -> None:
        cat_rows.append(np.full(int(mask.sum()), CAT[category]))
        pod_rows.append(owner[mask])
        sec_rows.append(amount[mask])
        start_rows.append(a[mask])
        len_rows.append(length[mask])

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

    return Pieces(
        start_ms=np.concatenate(start_rows),
        length_ms=np.concatenate(len_rows),
        pod=np.concatenate(pod_rows),
        cat=np.concatenate(cat_rows),
        seconds=np.concatenate(sec_rows),
    )
