"""Decision table of the classifier (SPEC §3): one case per category and per precedence.

Each case is a few hand-made samples (one every 10 s) and tenures, and the exact seconds per
(GPU, pod, category) it must produce. The thresholds are SPEC's scaled down so the cases stay
small: startup cap 60 s, teardown cap 30 s, reserved after 120 s, checkpoint gaps 10–60 s
of at least two samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from auditor.classify import classify
from auditor.model import CATEGORIES, Window
from auditor.settings import Thresholds

S = 1000
OUT: Any = None
"""In a util list: no sample at that slot (the sampler was down)."""
NAN = math.nan

TH = Thresholds(
    startup_cap_s=60,
    teardown_cap_s=30,
    reserved_after_s=120,
    checkpoint_min_gap_s=10,
    checkpoint_max_gap_s=60,
    checkpoint_min_samples=2,
    default_period_s=10,
)
TH_60 = replace(TH, checkpoint_min_samples=3, checkpoint_max_gap_s=900, reserved_after_s=1800)
"""For samples every 60 s: the default checkpoint_min_samples, gaps of up to 15 minutes."""
EVERYTHING = Window(-(10**13), 10**13)
NOW_S = 1_795_420_800
"""2026-11-23 08:00 UTC: where real samples lie, far from the epoch."""

Key = tuple[str, str | None, str]


def card(
    gpu: str,
    utils: Sequence[float | None],
    *,
    start_s: int = 0,
    every_s: int = 10,
    throttle: Sequence[str | None] | None = None,
) -> pd.DataFrame:
    """One GPU's samples, one per 10 s from `start_s`; OUT leaves a slot without a sample."""
    rows = [
        (gpu, (start_s + every_s * i) * S, u, None if throttle is None else throttle[i])
        for i, u in enumerate(utils)
        if u is not OUT
    ]
    return pd.DataFrame(rows, columns=["gpu", "ts_ms", "util", "throttle_reasons"])


def held(
    gpu: str, pod: str, start_s: float, end_s: float, gang: str | None = None
) -> dict[str, Any]:
    return {
        "gpu": gpu,
        "pod_uid": pod,
        "gang": gang or pod,
        "start_ms": int(start_s * S),
        "end_ms": int(end_s * S),
    }


def tenure_frame(tenures: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(tenures, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"])


def as_dict(results: pd.DataFrame) -> dict[Key, float]:
    out: dict[Key, float] = {}
    cols = results[["gpu", "pod_uid", "category", "seconds"]]
    for gpu, pod, cat, sec in cols.itertuples(index=False):
        out[(gpu, pod, cat)] = out.get((gpu, pod, cat), 0.0) + sec
    return out


@dataclass
class Case:
    samples: list[pd.DataFrame]
    tenures: list[dict[str, Any]]
    expected: dict[Key, float]
    window: Window = EVERYTHING
    thresholds: Thresholds = TH
    markers: list[tuple[str, float, float | None]] = field(default_factory=list)

    def run(self) -> pd.DataFrame:
        markers = None
        if self.markers:
            markers = pd.DataFrame(
                [(g, int(a * S), None if b is None else int(b * S)) for g, a, b in self.markers],
                columns=["gang", "start_ms", "end_ms"],
            )
        return classify(
            pd.concat(self.samples, ignore_index=True),
            tenure_frame(self.tenures),
            window=self.window,
            thresholds=self.thresholds,
            markers=markers,
        ).results


PERIODIC = [100.0] * 4 + ([0.0] * 2 + [100.0] * 4) * 5
"""340 s: active, then five 20 s idle gaps every 60 s, ending active."""
PERIODIC_3 = [100.0] * 4 + ([0.0] * 3 + [100.0] * 4) * 5
"""Five gaps of three samples every seven samples, ending active."""
IRREGULAR = (
    ([100.0] * 4 + [0.0] * 2 + [100.0] + [0.0] * 2 + [100.0] * 9 + [0.0] * 2 + [100.0] * 2)
    + [0.0] * 2
    + [100.0] * 4
)
"""280 s: four 20 s gaps starting 30, 110 and 40 s apart (CV 0.59)."""

CASES = {
    # --- one per category
    "busy only": Case(
        [card("g1", [100] * 6)], [held("g1", "p1", 0, 60)], {("g1", "p1", "busy"): 60}
    ),
    "partly busy active card is compute_idle": Case(
        [card("g1", [40] * 6)],
        [held("g1", "p1", 0, 60)],
        {("g1", "p1", "busy"): 24, ("g1", "p1", "compute_idle"): 36},
    ),
    "no pod held it: its kernel time busy of no pod, the rest unallocated": Case(
        [card("g1", [40, 0, 100, 0, 40, 40])],
        [],
        {("g1", None, "busy"): 22, ("g1", None, "unallocated"): 38},
    ),
    "a pod on a card no sample names: its tenure unobserved, the sampled card untouched": Case(
        [card("g1", [0] * 6)],
        [held("g9", "p1", 10, 40)],
        {("g1", None, "unallocated"): 60, ("g9", "p1", "unobserved"): 30},
    ),
    "unheld and never active: all unallocated": Case(
        [card("g1", [0] * 6)], [], {("g1", None, "unallocated"): 60}
    ),
    "active after its pod released it: busy of no pod": Case(
        [card("g1", [100] * 3 + [50] * 3)],
        [held("g1", "p1", 0, 30)],
        {("g1", "p1", "busy"): 30, ("g1", None, "busy"): 15, ("g1", None, "unallocated"): 15},
    ),
    "never touched: reserved_idle": Case(
        [card("g1", [0] * 6)], [held("g1", "p1", 0, 60)], {("g1", "p1", "reserved_idle"): 60}
    ),
    "idle samples keep their busy fraction": Case(
        [card("g1", [3] * 6)],
        [held("g1", "p1", 0, 60)],
        {("g1", "p1", "busy"): 1.8, ("g1", "p1", "reserved_idle"): 58.2},
    ),
    "startup shorter than the cap": Case(
        [card("g1", [0] * 3 + [100] * 9)],
        [held("g1", "p1", 0, 120)],
        {("g1", "p1", "startup"): 30, ("g1", "p1", "busy"): 90},
    ),
    "startup longer than the cap: cap, then reserved_idle": Case(
        [card("g1", [0] * 9 + [100] * 3)],
        [held("g1", "p1", 0, 120)],
        {
            ("g1", "p1", "startup"): 60,
            ("g1", "p1", "reserved_idle"): 30,
            ("g1", "p1", "busy"): 30,
        },
    ),
    "startup cap counts from binding, before the first sample": Case(
        [card("g1", [0] * 6 + [100] * 3, start_s=30)],
        [held("g1", "p1", 0, 120)],
        {
            ("g1", "p1", "startup"): 30,
            ("g1", "p1", "reserved_idle"): 30,
            ("g1", "p1", "busy"): 30,
        },
    ),
    "teardown within the cap": Case(
        [card("g1", [100] * 6 + [0] * 2)],
        [held("g1", "p1", 0, 80)],
        {("g1", "p1", "busy"): 60, ("g1", "p1", "teardown"): 20},
    ),
    "teardown over the cap: cap, then reserved_idle": Case(
        [card("g1", [100] * 3 + [0] * 5)],
        [held("g1", "p1", 0, 80)],
        {
            ("g1", "p1", "busy"): 30,
            ("g1", "p1", "teardown"): 30,
            ("g1", "p1", "reserved_idle"): 20,
        },
    ),
    "teardown cap inside a sample splits it by time": Case(
        [card("g1", [100] * 3 + [0] * 5)],
        [held("g1", "p1", 0, 80)],
        {
            ("g1", "p1", "busy"): 30,
            ("g1", "p1", "teardown"): 25,
            ("g1", "p1", "reserved_idle"): 25,
        },
        thresholds=replace(TH, teardown_cap_s=25),
    ),
    "mid-tenure idle of reserved_after or more: reserved_idle": Case(
        [card("g1", [100] * 2 + [0] * 12 + [100] * 2)],
        [held("g1", "p1", 0, 160)],
        {("g1", "p1", "busy"): 40, ("g1", "p1", "reserved_idle"): 120},
    ),
    "mid-tenure short idle: compute_idle": Case(
        [card("g1", [100] * 2 + [0] * 3 + [100] * 2)],
        [held("g1", "p1", 0, 70)],
        {("g1", "p1", "busy"): 40, ("g1", "p1", "compute_idle"): 30},
    ),
    "straggler: one rank idle while the other computes": Case(
        [card("g1", [100] * 2 + [0] * 2 + [100] * 2), card("g2", [100] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {
            ("g1", "p1", "busy"): 40,
            ("g1", "p1", "straggler_wait"): 20,
            ("g2", "p2", "busy"): 60,
        },
    ),
    "cards sampled at different periods are compared at the slower one's": Case(
        [card("g1", [100] * 12, every_s=5), card("g2", [100] + [0] * 4 + [100])],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {
            ("g1", "p1", "busy"): 60,
            ("g2", "p2", "busy"): 20,
            ("g2", "p2", "straggler_wait"): 40,
        },
    ),
    "a marker makes a gang-wide gap a checkpoint on every card": Case(
        [card("g1", [100] * 4 + [0] * 2 + [100] * 4), card("g2", [100] * 4 + [0] * 2 + [100] * 4)],
        [held("g1", "p1", 0, 100, "J"), held("g2", "p2", 0, 100, "J")],
        {
            ("g1", "p1", "busy"): 80,
            ("g1", "p1", "checkpoint"): 20,
            ("g2", "p2", "busy"): 80,
            ("g2", "p2", "checkpoint"): 20,
        },
        markers=[("J", 50, 52)],
    ),
    "active straggler: 50 against 90": Case(
        [card("g1", [90] * 6), card("g2", [50] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {
            ("g1", "p1", "busy"): 54,
            ("g1", "p1", "compute_idle"): 6,
            ("g2", "p2", "busy"): 30,
            ("g2", "p2", "straggler_wait"): 24,
            ("g2", "p2", "compute_idle"): 6,
        },
    ),
    "within tolerance: 85 against 90 is compute_idle": Case(
        [card("g1", [90] * 6), card("g2", [85] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {
            ("g1", "p1", "busy"): 54,
            ("g1", "p1", "compute_idle"): 6,
            ("g2", "p2", "busy"): 51,
            ("g2", "p2", "compute_idle"): 9,
        },
    ),
    "exactly the tolerance is not more than it": Case(
        [card("g1", [90] * 6), card("g2", [80] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {
            ("g1", "p1", "busy"): 54,
            ("g1", "p1", "compute_idle"): 6,
            ("g2", "p2", "busy"): 48,
            ("g2", "p2", "compute_idle"): 12,
        },
    ),
    "cards of different gangs are not compared": Case(
        [card("g1", [90] * 6), card("g2", [50] * 6)],
        [held("g1", "p1", 0, 60), held("g2", "p2", 0, 60)],
        {
            ("g1", "p1", "busy"): 54,
            ("g1", "p1", "compute_idle"): 6,
            ("g2", "p2", "busy"): 30,
            ("g2", "p2", "compute_idle"): 30,
        },
    ),
    "periodic gang-wide gaps: checkpoint": Case(
        [card("g1", PERIODIC), card("g2", PERIODIC)],
        [held("g1", "p1", 0, 340, "J"), held("g2", "p2", 0, 340, "J")],
        {
            ("g1", "p1", "busy"): 240,
            ("g1", "p1", "checkpoint"): 100,
            ("g2", "p2", "busy"): 240,
            ("g2", "p2", "checkpoint"): 100,
        },
    ),
    "checkpoint in a single-GPU job": Case(
        [card("g1", PERIODIC)],
        [held("g1", "p1", 0, 340)],
        {("g1", "p1", "busy"): 240, ("g1", "p1", "checkpoint"): 100},
    ),
    "irregular gaps: compute_idle": Case(
        [card("g1", IRREGULAR)],
        [held("g1", "p1", 0, 280)],
        {("g1", "p1", "busy"): 200, ("g1", "p1", "compute_idle"): 80},
    ),
    "two regular gaps are too few for a series": Case(
        [card("g1", [100] * 4 + ([0] * 2 + [100] * 4) * 2)],
        [held("g1", "p1", 0, 160)],
        {("g1", "p1", "busy"): 120, ("g1", "p1", "compute_idle"): 40},
    ),
    "gaps of fewer than checkpoint_min_samples samples are not checkpoints": Case(
        [card("g1", PERIODIC)],
        [held("g1", "p1", 0, 340)],
        {("g1", "p1", "busy"): 240, ("g1", "p1", "compute_idle"): 100},
        thresholds=replace(TH, checkpoint_min_samples=3),
    ),
    "... however long they last: 2 samples of 60 s make no series": Case(
        [card("g1", PERIODIC, every_s=60)],
        [held("g1", "p1", 0, 2040)],
        {("g1", "p1", "busy"): 1440, ("g1", "p1", "compute_idle"): 600},
        thresholds=TH_60,
    ),
    "... but 3 samples do, and a marker counts for a shorter gap": Case(
        [card("g1", PERIODIC_3, every_s=60), card("g2", PERIODIC, every_s=60, start_s=10**4)],
        [held("g1", "p1", 0, 60 * len(PERIODIC_3)), held("g2", "p2", 10**4, 10**4 + 2040)],
        {
            ("g1", "p1", "busy"): 1440,
            ("g1", "p1", "checkpoint"): 900,
            ("g2", "p2", "busy"): 1440,
            ("g2", "p2", "checkpoint"): 120,
            ("g2", "p2", "compute_idle"): 480,
        },
        thresholds=TH_60,
        markers=[("p2", 10**4 + 240 + 30, None)],
    ),
    "gaps longer than checkpoint_max_gap_s are not checkpoints": Case(
        [card("g1", [100] * 4 + ([0] * 7 + [100] * 4) * 4)],
        [held("g1", "p1", 0, 480)],
        {("g1", "p1", "busy"): 200, ("g1", "p1", "compute_idle"): 280},
        thresholds=replace(TH, checkpoint_max_gap_s=60),
    ),
    "a gap at a checkpoint marker: checkpoint": Case(
        [card("g1", [100] * 4 + [0] * 2 + [100] * 4)],
        [held("g1", "p1", 0, 100)],
        {("g1", "p1", "busy"): 80, ("g1", "p1", "checkpoint"): 20},
        markers=[("p1", 45, 46)],
    ),
    "an instant marker counts too": Case(
        [card("g1", [100] * 4 + [0] * 2 + [100] * 4)],
        [held("g1", "p1", 0, 100)],
        {("g1", "p1", "busy"): 80, ("g1", "p1", "checkpoint"): 20},
        markers=[("p1", 41, None)],
    ),
    "a marker counts at today's timestamps, not only near the epoch": Case(
        [card("g1", [100] * 4 + [0] * 2 + [100] * 4, start_s=NOW_S)],
        [held("g1", "p1", NOW_S, NOW_S + 100)],
        {("g1", "p1", "busy"): 80, ("g1", "p1", "checkpoint"): 20},
        markers=[("p1", NOW_S + 45, NOW_S + 46)],
    ),
    "a marker of another gang does not count": Case(
        [card("g1", [100] * 4 + [0] * 2 + [100] * 4)],
        [held("g1", "p1", 0, 100)],
        {("g1", "p1", "busy"): 80, ("g1", "p1", "compute_idle"): 20},
        markers=[("other", 45, 46)],
    ),
    "two pods in a row on one GPU": Case(
        [card("g1", [100] * 3 + [0] * 3)],
        [held("g1", "p1", 0, 30), held("g1", "p2", 30, 60)],
        {("g1", "p1", "busy"): 30, ("g1", "p2", "reserved_idle"): 30},
    ),
    "a sampler outage mid-tenure is unobserved, never idle": Case(
        [card("g1", [100, 100, 0, 0] + [OUT] * 10 + [0, 0, 100, 100])],
        [held("g1", "p1", 0, 180)],
        {
            ("g1", "p1", "busy"): 40,
            ("g1", "p1", "unobserved"): 100,
            ("g1", "p1", "compute_idle"): 40,
        },
    ),
    "unreadable utilisation is unobserved": Case(
        [card("g1", [100, NAN, 100])],
        [held("g1", "p1", 0, 30)],
        {("g1", "p1", "busy"): 20, ("g1", "p1", "unobserved"): 10},
    ),
    "unreadable samples do not break an idle run": Case(
        [card("g1", [100] * 2 + [0] * 6 + [NAN] + [0] * 6 + [100] * 2)],
        [held("g1", "p1", 0, 170)],
        {
            ("g1", "p1", "busy"): 40,
            ("g1", "p1", "reserved_idle"): 120,
            ("g1", "p1", "unobserved"): 10,
        },
    ),
    "the last sample covers one period": Case(
        [card("g1", [100] * 3)], [held("g1", "p1", 0, 100)], {("g1", "p1", "busy"): 30}
    ),
    "a single sample covers default_period_s": Case(
        [card("g1", [100])],
        [held("g1", "p1", 0, 100)],
        {("g1", "p1", "busy"): 7},
        thresholds=replace(TH, default_period_s=7),
    ),
    "a gap of more than 3 periods: one period, then unobserved": Case(
        [card("g1", [50, 50, 50, 50, OUT, OUT, OUT, 50])],
        [],
        {("g1", None, "busy"): 25, ("g1", None, "unallocated"): 25, ("g1", None, "unobserved"): 30},
    ),
    "a gap of exactly 3 periods is covered": Case(
        [card("g1", [50, 50, 50, 50, OUT, OUT, 50])],
        [],
        {("g1", None, "busy"): 35, ("g1", None, "unallocated"): 35},
    ),
    "a tenure boundary mid-interval splits it in proportion": Case(
        [card("g1", [50, 50, 50])],
        [held("g1", "p1", 5, 25)],
        {
            ("g1", None, "busy"): 5,
            ("g1", None, "unallocated"): 5,
            ("g1", "p1", "busy"): 10,
            ("g1", "p1", "compute_idle"): 10,
        },
    ),
    "a tenure to the end of one GPU's span does not spill onto the next GPU": Case(
        [card("g1", [100] * 3), card("g2", [100] * 3)],
        [held("g1", "p1", 0, 1000)],
        {("g1", "p1", "busy"): 30, ("g2", None, "busy"): 30},
    ),
    "held time outside the observed span carries no capacity": Case(
        [card("g1", [100] * 3, start_s=100)],
        [held("g1", "p1", 0, 1000)],
        {("g1", "p1", "busy"): 30},
    ),
    # --- precedence conflicts
    "a straggler gap that is also periodic: straggler_wait wins": Case(
        [card("g1", PERIODIC), card("g2", [100] * len(PERIODIC))],
        [held("g1", "p1", 0, 340, "J"), held("g2", "p2", 0, 340, "J")],
        {
            ("g1", "p1", "busy"): 240,
            ("g1", "p1", "straggler_wait"): 100,
            ("g2", "p2", "busy"): 340,
        },
    ),
    "startup wins over straggler_wait": Case(
        [card("g1", [0] * 2 + [100] * 4), card("g2", [100] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {("g1", "p1", "startup"): 20, ("g1", "p1", "busy"): 40, ("g2", "p2", "busy"): 60},
    ),
    "teardown wins over straggler_wait": Case(
        [card("g1", [100] * 4 + [0] * 2), card("g2", [100] * 6)],
        [held("g1", "p1", 0, 60, "J"), held("g2", "p2", 0, 60, "J")],
        {("g1", "p1", "teardown"): 20, ("g1", "p1", "busy"): 40, ("g2", "p2", "busy"): 60},
    ),
    "a long mid-tenure run wins over straggler_wait": Case(
        [card("g1", [100] + [0] * 12 + [100]), card("g2", [100] * 14)],
        [held("g1", "p1", 0, 140, "J"), held("g2", "p2", 0, 140, "J")],
        {
            ("g1", "p1", "busy"): 20,
            ("g1", "p1", "reserved_idle"): 120,
            ("g2", "p2", "busy"): 140,
        },
    ),
    "a sibling that is idle too is no straggler: gang-wide, irregular": Case(
        [card("g1", [100] + [0] * 2 + [100]), card("g2", [3] * 4)],
        [held("g1", "p1", 0, 40, "J"), held("g2", "p2", 0, 40, "J")],
        {
            ("g1", "p1", "busy"): 20,
            ("g1", "p1", "compute_idle"): 20,
            ("g2", "p2", "busy"): 1.2,
            ("g2", "p2", "reserved_idle"): 38.8,
        },
    ),
    "the whole-tenure rule wins over startup and teardown": Case(
        [card("g1", [0] * 12)],
        [held("g1", "p1", 0, 120)],
        {("g1", "p1", "reserved_idle"): 120},
    ),
    # --- window clipping of whole-tenure results
    "a window inside the startup sees the startup only": Case(
        [card("g1", [0] * 9 + [100] * 3)],
        [held("g1", "p1", 0, 120)],
        {("g1", "p1", "startup"): 30},
        window=Window(0, 30 * S),
    ),
    "a window after the cap still knows the run began before it": Case(
        [card("g1", [0] * 9 + [100] * 3)],
        [held("g1", "p1", 0, 120)],
        {("g1", "p1", "reserved_idle"): 20, ("g1", "p1", "busy"): 30},
        window=Window(70 * S, 500 * S),
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_decision_table(case: Case) -> None:
    got = as_dict(case.run())

    assert set(got) == set(case.expected)
    assert got == pytest.approx(case.expected, rel=1e-9, abs=1e-9)


def test_results_shape_and_order() -> None:
    out = CASES["a tenure boundary mid-interval splits it in proportion"].run()

    assert list(out.columns) == ["gpu", "pod_uid", "category", "seconds", "estimated"]
    assert out["seconds"].dtype == np.float64
    assert out["pod_uid"].tolist() == [None, None, "p1", "p1"]
    assert out["category"].tolist() == ["busy", "unallocated", "busy", "compute_idle"]
    assert set(out["category"]) <= {str(c) for c in CATEGORIES}


def findings_of(case: Case) -> pd.DataFrame:
    return classify(
        pd.concat(case.samples, ignore_index=True),
        tenure_frame(case.tenures),
        window=case.window,
        thresholds=case.thresholds,
    ).findings


def test_straggler_finding_names_the_busiest_card_and_its_throttle_reasons() -> None:
    busy_throttle: list[str | None] = ["HW_SLOWDOWN", "HW_SLOWDOWN", "HW_SLOWDOWN"]
    busy_throttle += ["HW_SLOWDOWN", "SW_POWER_CAP", None]
    case = Case(
        [
            card("g1", [100] * 6, throttle=busy_throttle),
            card("g2", [100] + [0] * 4 + [100]),
            card("g3", [100] + [0] * 4 + [100]),
        ],
        [held(g, f"p{g[1]}", 0, 60, "J") for g in ("g1", "g2", "g3")],
        {},
    )

    found = findings_of(case)
    straggler = found[found["kind"] == "straggler"].to_dict("records")

    assert straggler == [
        {
            "kind": "straggler",
            "gang": "J",
            "gpu": "g1",
            "pod_uid": "p1",
            "start_ms": 10 * S,
            "end_ms": 50 * S,
            "seconds": pytest.approx(80.0),
            "detail": "HW_SLOWDOWN",
        }
    ]


def test_startup_teardown_and_reserved_findings() -> None:
    case = Case(
        [card("g1", [0] * 9 + [100] * 3 + [0] * 5)],
        [held("g1", "p1", 0, 170)],
        {},
    )

    found = findings_of(case)
    rows = found[["kind", "gpu", "pod_uid", "start_ms", "end_ms", "seconds"]].to_dict("records")

    assert rows == [
        {"kind": "reserved_idle", "gpu": "g1", "pod_uid": "p1", "start_ms": 60 * S,
         "end_ms": 90 * S, "seconds": 30.0},
        {"kind": "reserved_idle", "gpu": "g1", "pod_uid": "p1", "start_ms": 150 * S,
         "end_ms": 170 * S, "seconds": 20.0},
        {"kind": "startup", "gpu": "g1", "pod_uid": "p1", "start_ms": 0,
         "end_ms": 60 * S, "seconds": 60.0},
        {"kind": "teardown", "gpu": "g1", "pod_uid": "p1", "start_ms": 120 * S,
         "end_ms": 150 * S, "seconds": 30.0},
    ]  # fmt: skip
    assert found["detail"].tolist()[:2] == [
        "no activity within 1 min of binding",
        "held 0.5 min or more after its last activity",
    ]


def test_checkpoint_finding_describes_the_series() -> None:
    case = CASES["periodic gang-wide gaps: checkpoint"]

    found = findings_of(case).to_dict("records")

    assert found == [
        {
            "kind": "checkpoint",
            "gang": "J",
            "gpu": None,
            "pod_uid": None,
            "start_ms": 40 * S,
            "end_ms": 300 * S,
            "seconds": pytest.approx(200.0),
            "detail": "5 gaps, period ~60 s, median length 20 s",
        }
    ]


def test_findings_are_clipped_to_the_window() -> None:
    case = CASES["startup longer than the cap: cap, then reserved_idle"]
    case = Case(case.samples, case.tenures, {}, window=Window(20 * S, 70 * S))

    found = findings_of(case)[["kind", "start_ms", "end_ms", "seconds"]].to_dict("records")

    assert found == [
        {"kind": "reserved_idle", "start_ms": 60 * S, "end_ms": 70 * S, "seconds": 10.0},
        {"kind": "startup", "start_ms": 20 * S, "end_ms": 60 * S, "seconds": 40.0},
    ]


def test_empty_inputs() -> None:
    empty = pd.DataFrame({"gpu": [], "ts_ms": [], "util": []}).astype(
        {"gpu": object, "ts_ms": np.int64, "util": np.float64}
    )

    out = classify(empty, tenure_frame([]), window=EVERYTHING, thresholds=TH)

    assert out.results.empty
    assert list(out.results.columns) == ["gpu", "pod_uid", "category", "seconds", "estimated"]
    assert out.findings.empty
    assert list(out.findings.columns) == [
        "kind", "gang", "gpu", "pod_uid", "start_ms", "end_ms", "seconds", "detail",
    ]  # fmt: skip


def test_duplicate_timestamps_keep_the_highest_readable_reading() -> None:
    samples = pd.concat([card("g1", [0, 0, 0]), card("g1", [NAN, 100, NAN])])

    out = classify(samples, tenure_frame([]), window=EVERYTHING, thresholds=TH)

    assert as_dict(out.results) == {("g1", None, "busy"): 10, ("g1", None, "unallocated"): 20}
    held_out = classify(
        samples, tenure_frame([held("g1", "p1", 0, 30)]), window=EVERYTHING, thresholds=TH
    )
    assert as_dict(held_out.results) == pytest.approx(
        {("g1", "p1", "startup"): 10, ("g1", "p1", "busy"): 10, ("g1", "p1", "teardown"): 10}
    )


def test_nullable_columns_and_missing_values_are_accepted() -> None:
    samples = pd.DataFrame(
        {
            "gpu": pd.array(["g1", "g1", "g1", None], dtype="string"),
            "ts_ms": pd.array([0, 10 * S, None, 20 * S], dtype="Int64"),
            "util": pd.array([50, None, 10, 3], dtype="Float64"),
        }
    )
    tenures = pd.DataFrame(
        {
            "gpu": ["g1", "g1"],
            "pod_uid": ["p1", "p2"],
            "gang": [None, None],
            "start_ms": pd.array([0, 5 * S], dtype="Int64"),
            "end_ms": pd.array([20 * S, None], dtype="Int64"),
        }
    )

    out = classify(samples, tenures, window=EVERYTHING, thresholds=TH)

    assert as_dict(out.results) == pytest.approx(
        {("g1", "p1", "busy"): 5, ("g1", "p1", "compute_idle"): 5, ("g1", "p1", "unobserved"): 10}
    )


# --- a pod still holding its card where the data ends has no teardown yet -----------------


def _open(tenure: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame([tenure])
    frame["released"] = False
    return frame


def test_still_running_pods_idle_tail_is_no_teardown() -> None:
    # active 60 s, then idle 40 s until the data ends; the pod has not been released
    samples = card("g", [80] * 6 + [0] * 4)
    got = as_dict(
        classify(samples, _open(held("g", "p", 0, 100)), window=EVERYTHING, thresholds=TH).results
    )
    assert ("g", "p", "teardown") not in got
    assert got[("g", "p", "compute_idle")] == pytest.approx(40 + 60 * 0.2)
    closed = as_dict(
        classify(samples, tenure_frame([held("g", "p", 0, 100)]), window=EVERYTHING,
                 thresholds=TH).results
    )  # fmt: skip
    assert closed[("g", "p", "teardown")] == pytest.approx(30)


def test_still_running_pod_never_active_is_in_startup_until_the_cap() -> None:
    samples = card("g", [0] * 10)
    got = as_dict(
        classify(samples, _open(held("g", "p", 0, 100)), window=EVERYTHING, thresholds=TH).results
    )
    assert got == {("g", "p", "startup"): pytest.approx(60),
                   ("g", "p", "reserved_idle"): pytest.approx(40)}  # fmt: skip
