"""Idle runs of one card within one tenure (SPEC §3 "Idle runs"), the run-level rules.

Input rows are the held, covered, readable pieces of samples ("observed rows"), sorted by
tenure and time. A row is idle when its utilisation is at most `idle_threshold_pct`. A run
is a maximal sequence of idle rows of one tenure with no active row in between. Unreadable
(NaN) samples and coverage gaps are not rows here: they neither break a run nor count as
idle, their time stays `unobserved`. A run starts at the start of its first idle row; its
length (compared with `reserved_after_s`) is its observed idle time, the sum of its rows'
lengths, so a sampler outage never makes a short idle stretch look long.

First match wins:
- WHOLE: the tenure has no active row → `reserved_idle`.
- LEADING (no active row before it) → `startup` for the part before `bound + startup_cap`
  (measured from binding, so time before the first sample counts against the cap),
  `reserved_idle` after. Segments are already cut at that point.
- TRAILING (no active row after it) → `teardown` for the part before
  `run start + teardown_cap`, `reserved_idle` after; a row that straddles that point is
  reported in `split_at` for the caller to cut.
- MID run at least `reserved_after_s` long → `reserved_idle`.
A tenure still open where the data ends (the pod holds its card at `now`) has no end yet:
its never-active card is treated as LEADING (startup, then reserved_idle after the cap) and
its last idle run as MID, never as teardown.
- Otherwise the rows stay PENDING: the sample-by-sample rules decide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.classify import codes
from auditor.classify.arrays import INT_MAX, INT_MIN, BoolArr, IntArr, ends_of, starts_of
from auditor.settings import Thresholds

WHOLE = 0
LEADING = 1
TRAILING = 2
MID = 3


@dataclass(frozen=True)
class RunDecision:
    """Per row: a category code (or PENDING), its run number (-1 for active rows), and a
    teardown cut point strictly inside the row (INT_MIN for none). Per run: kind, start,
    observed length (ms)."""

    category: IntArr
    run: IntArr
    split_at: IntArr
    run_kind: IntArr
    run_start: IntArr
    run_length: IntArr


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def classify_runs(
    *,
    tenure: IntArr,
    start: IntArr,
    end: IntArr,
    idle: BoolArr,
    bound: IntArr,
    released: BoolArr,
    thresholds: Thresholds,
) -> RunDecision:
    """Apply the run-level rules to observed rows sorted by (tenure, start)."""
    n = tenure.size
    first_active = np.full(bound.size, INT_MAX, dtype=np.int64)
    last_active = np.full(bound.size, INT_MIN, dtype=np.int64)
    act = np.flatnonzero(~idle)
    if act.size:
        first = starts_of(tenure[act])
        first_active[tenure[act[first]]] = start[act[first]]
        last = act[ends_of(first)]
        last_active[tenure[last]] = end[last]

    continues = np.zeros(n, dtype=np.bool_)
    continues[1:] = idle[:-1] & (tenure[1:] == tenure[:-1])
    new_run = idle & ~continues
    run = np.where(idle, np.cumsum(new_run, dtype=np.int64) - 1, -1)

    rows = np.flatnonzero(idle)
    begins = new_run[rows]
    run_first = rows[begins]
    run_ten = tenure[run_first]
    run_start = start[run_first]
    run_length = (
        np.add.reduceat(end[rows] - start[rows], np.flatnonzero(begins))
        if rows.size
        else np.zeros(0, dtype=np.int64)
    )
    run_kind = np.select(
        [
            first_active[run_ten] == INT_MAX,
            run_start < first_active[run_ten],
            run_start >= last_active[run_ten],
        ],
        [WHOLE, LEADING, TRAILING],
        MID,
    ).astype(np.int64)
    still_open = ~released[run_ten]
    run_kind[still_open & (run_kind == WHOLE)] = LEADING
    run_kind[still_open & (run_kind == TRAILING)] = MID

    r = run[rows]
    kind = run_kind[r]
    r_start, r_end = start[rows], end[rows]
    startup_cap = bound[tenure[rows]] + _ms(thresholds.startup_cap_s)
    teardown_cap = run_start[r] + _ms(thresholds.teardown_cap_s)
    long_run = run_length[r] >= _ms(thresholds.reserved_after_s)
    cat = np.select(
        [
            kind == WHOLE,
            (kind == LEADING) & (r_start < startup_cap),
            kind == LEADING,
            (kind == TRAILING) & (r_start < teardown_cap),
            kind == TRAILING,
            long_run,
        ],
        [
            codes.RESERVED_IDLE,
            codes.STARTUP,
            codes.RESERVED_IDLE,
            codes.TEARDOWN,
            codes.RESERVED_IDLE,
            codes.RESERVED_IDLE,
        ],
        codes.PENDING,
    ).astype(np.int64)
    straddles = (kind == TRAILING) & (r_start < teardown_cap) & (r_end > teardown_cap)

    category = np.full(n, codes.PENDING, dtype=np.int64)
    category[rows] = cat
    split_at = np.full(n, INT_MIN, dtype=np.int64)
    split_at[rows[straddles]] = teardown_cap[straddles]
    return RunDecision(
        category=category,
        run=run.astype(np.int64),
        split_at=split_at,
        run_kind=run_kind,
        run_start=run_start,
        run_length=run_length.astype(np.int64),
    )
