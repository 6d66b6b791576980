"""The checkpoint series rule at coarse sampling: a gap of one or two samples (an input
stall at 60 s) never joins a series, however steady its pace; at a finer period, a stall of
the same length group between checkpoints does not hide the series, and random stalls alone
make none."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from auditor.classify.gangs import find_series
from auditor.settings import Thresholds

TH = Thresholds()
S = 1000


def test_gaps_of_one_or_two_samples_make_no_series() -> None:
    # a 120 s gap every 900 s for 5 hours: at 60 s two samples each, at 20 s six
    starts = np.arange(20) * 900 * S
    lengths = np.full(20, 120 * S)
    assert find_series(starts, lengths, period_ms=60 * S, thresholds=TH) == []
    (series,) = find_series(starts, lengths, period_ms=20 * S, thresholds=TH)
    assert series.tolist() == list(range(20))
    loose = replace(TH, checkpoint_min_samples=2)
    (series,) = find_series(starts, lengths, period_ms=60 * S, thresholds=loose)
    assert series.tolist() == list(range(20))


def test_stalls_between_checkpoints_do_not_hide_the_series() -> None:
    # sampled every 20 s: a 180 s checkpoint every 1,800 s for 7 hours, 120 s input stalls
    # at odd times (of the checkpoints' length group, long enough to be candidates)
    checkpoints = [(2340 + 1800 * k, 180) for k in range(13)]
    stalls = [(1380, 120), (8460, 120), (17280, 120), (18120, 120), (21420, 120)]
    gaps = sorted(checkpoints + stalls)
    starts = np.array([s * S for s, _ in gaps], dtype=np.int64)
    lengths = np.array([n * S for _, n in gaps], dtype=np.int64)
    (series,) = find_series(starts, lengths, period_ms=20 * S, thresholds=TH)
    assert sorted(int(starts[i]) // S for i in series) == [s for s, _ in checkpoints]


def test_random_stalls_alone_rarely_make_a_series() -> None:
    """Gang-wide stalls of 60 or 120 s at random times, sampled every 20 s: the pruning finds
    a chain in almost none of them (measured: see the assertion), beyond what the
    whole-group rule, unchanged, finds."""
    rng = np.random.default_rng(7)
    pruned = 0
    draws = 300
    for _ in range(draws):
        n = int(rng.integers(6, 16))
        starts = np.sort(rng.choice(np.arange(0, 30_000, 60), n, replace=False)) * S
        lengths = rng.choice([60, 120], n) * S
        for series in find_series(
            starts.astype(np.int64), lengths.astype(np.int64), period_ms=60 * S, thresholds=TH
        ):
            group = lengths[series[0]]
            members = np.flatnonzero((lengths >= group / 1.5) & (lengths <= group * 1.5))
            pruned += len(series) < len(members)
    assert pruned <= draws // 50
