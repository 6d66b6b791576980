"""A MIG card whose layout changes while it is observed (SPEC §7), through the classifier.

A physical card has one card-second of capacity per second however it is divided, and the
division is a function of time read from the data: where the card reports as a whole card
(dcgm-exporter's `DCGM_FI_DEV_GPU_UTIL` on the card's UUID, no instance reporting) it weighs
1; where instances report (`DCGM_FI_PROF_GR_ENGINE_ACTIVE` on `UUID/gi<ID>`), each weighs its
profile's slices / 7 and the slices not carved into instances are `unallocated` of the
platform. Each case is one H100 sampled every 30 s through stretches of half an hour with
the layout of each stretch, and the GPU-hours each pod and the platform must get, by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.classify import classify
from auditor.model import Window
from auditor.settings import Thresholds

H = 3_600_000
HALF = H // 2
PERIOD = 30_000
TH = Thresholds()
MODEL = "NVIDIA H100 80GB HBM3"

Layout = str | dict[str, str] | None
"""A stretch's layout: "whole" (the card reports its utilisation), "silent-whole" (MIG on,
no instance, the card reports power and temperature but no utilisation: util NULL), None
(nothing reports), or instance id -> profile (the card itself silent)."""


@dataclass
class Story:
    layouts: list[Layout]
    """One per half hour from 0."""
    util: dict[str, float] = field(default_factory=dict)
    """Percent per card key ("P" the card, "gi1"... its instances), while it reports."""
    holders: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Card key -> (pod, start, end) of the pod holding it."""

    @property
    def end(self) -> int:
        return HALF * len(self.layouts)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        rows: list[tuple[str, int, float]] = []
        instances: dict[str, str] = {}
        for i, layout in enumerate(self.layouts):
            ts = range(i * HALF, (i + 1) * HALF, PERIOD)
            if layout == "whole":
                rows += [("P", t, self.util.get("P", 0.0)) for t in ts]
            elif layout == "silent-whole":
                rows += [("P", t, float("nan")) for t in ts]
            elif isinstance(layout, dict):
                for gi, profile in layout.items():
                    instances[gi] = profile
                    rows += [(f"P/{gi}", t, self.util.get(gi, 0.0)) for t in ts]
        samples = pd.DataFrame(rows, columns=["gpu", "ts_ms", "util"])
        cards = pd.DataFrame(
            [{"uuid": "P", "parent_uuid": None, "mig_profile": None, "model": MODEL}]
            + [
                {"uuid": f"P/{gi}", "parent_uuid": "P", "mig_profile": p, "model": MODEL}
                for gi, p in instances.items()
            ]
        )
        tenures = pd.DataFrame(
            [
                {
                    "gpu": "P" if key == "P" else f"P/{key}",
                    "pod_uid": pod,
                    "gang": pod,
                    "start_ms": a,
                    "end_ms": b,
                    "released": True,
                    "share": 1.0,
                }
                for key, (pod, a, b) in self.holders.items()
            ],
            columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms", "released", "share"],
        )
        return samples, tenures, cards

    def hours(self) -> tuple[dict[tuple[str | None, str], float], dict[str, float]]:
        """(pod or None, category) -> GPU-hours; physical card -> its capacity GPU-hours."""
        samples, tenures, cards = self.frames()
        out = classify(
            samples, tenures, window=Window(0, self.end), thresholds=TH, cards=cards
        ).results
        got: dict[tuple[str | None, str], float] = {}
        for pod, cat, sec in out[["pod_uid", "category", "seconds"]].itertuples(index=False):
            got[(pod, cat)] = got.get((pod, cat), 0.0) + sec / 3600
        physical = out["gpu"].map(lambda g: str(g).split("/")[0])
        capacity = (out["seconds"].groupby(physical).sum() / 3600).to_dict()
        return {k: v for k, v in got.items() if v > 1e-12}, capacity


ONE = {"gi1": "1g.10gb"}
THREE = {"gi1": "1g.10gb", "gi2": "1g.10gb", "gi3": "2g.20gb"}

CASES: dict[str, tuple[Story, dict[tuple[str | None, str], float]]] = {
    # MIG is enabled after half an hour of a whole card: w held it at 60 %, weight 1 (not
    # the slices the later instance leaves). The empty card then reports no utilisation:
    # nobody holds it, no slice is carved, all of it unallocated.
    "whole card -> MIG on, empty": (
        Story(
            ["whole", "silent-whole", ONE],
            util={"P": 60.0, "gi1": 0.0},
            holders={"P": ("w", 0, HALF)},
        ),
        {
            ("w", "busy"): 0.3,
            ("w", "compute_idle"): 0.2,
            (None, "unallocated"): 0.5 + 0.5,  # the empty card; then gi1 unheld and 6 slices
        },
    ),
    # An instance is carved on the empty card: x holds 1g (1/7) at 50 % of the instance;
    # the 6 slices not carved are unallocated, in the stretch before it too (the whole card).
    "MIG on, empty -> one 1g": (
        Story(["silent-whole", ONE], util={"gi1": 50.0}, holders={"gi1": ("x", HALF, H)}),
        {
            ("x", "busy"): 0.5 / 7 * 0.5,
            ("x", "compute_idle"): 0.5 / 7 * 0.5,
            (None, "unallocated"): 0.5 + 0.5 * 6 / 7,
        },
    ),
    # Two more instances join: 1g + 1g + 2g = 4 slices; gi2 is carved but held by nobody.
    # y holds gi3 (2/7) fully busy. Uncarved: 6/7, then 3/7.
    "one 1g -> 1g + 1g + 2g": (
        Story(
            [ONE, THREE],
            util={"gi1": 50.0, "gi2": 0.0, "gi3": 100.0},
            holders={"gi1": ("x", 0, H), "gi3": ("y", HALF, H)},
        ),
        {
            ("x", "busy"): 0.5 / 7 * 1.0,
            ("x", "compute_idle"): 0.5 / 7 * 1.0,
            ("y", "busy"): 2 / 7 * 0.5,
            (None, "unallocated"): 6 / 7 * 0.5 + (1 / 7 + 3 / 7) * 0.5,
        },
    ),
    # MIG is disabled again: the instances stop, the card reports as a whole card (weight 1)
    # and z holds it.
    "1g + 1g + 2g -> whole card": (
        Story(
            [THREE, "whole"],
            util={"gi1": 0.0, "gi2": 0.0, "gi3": 0.0, "P": 40.0},
            holders={"P": ("z", HALF, H)},
        ),
        {
            ("z", "busy"): 0.5 * 0.4,
            ("z", "compute_idle"): 0.5 * 0.6,
            (None, "unallocated"): 0.5,
        },
    ),
    # MIG off for half an hour between two lives of an instance with the same GPU_I_ID: the
    # instance's gap is no slice of it (the card reports as a whole card), z gets all of it.
    "1g -> whole card -> the same 1g again": (
        Story(
            [ONE, "whole", ONE],
            util={"gi1": 0.0, "P": 100.0},
            holders={"P": ("z", HALF, H)},
        ),
        {
            ("z", "busy"): 0.5,
            (None, "unallocated"): 1.0,
        },
    ),
    # The card says nothing while MIG is on and empty (no series at all): that half hour is
    # unobserved, never a slice of anyone's.
    "whole card -> nothing reports -> one 1g": (
        Story(["whole", None, ONE], util={"P": 100.0, "gi1": 0.0}),
        {
            (None, "busy"): 0.5,  # kernels of no known pod
            (None, "unobserved"): 0.5,
            (None, "unallocated"): 0.5,
        },
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_layout_transition(name: str) -> None:
    story, expected = CASES[name]
    got, capacity = story.hours()
    assert got == pytest.approx(expected, abs=1e-9)
    assert capacity == pytest.approx({"P": story.end / H}, abs=1e-9)


def test_the_whole_story_capacity_is_its_wall_time() -> None:
    """Off -> on, empty -> one 1g -> 1g + 1g + 2g, 2.5 h: 2.5 GPU-hours of one card."""
    story = Story(
        ["whole", "whole", "silent-whole", ONE, THREE],
        util={"P": 80.0, "gi1": 50.0, "gi2": 0.0, "gi3": 100.0},
        holders={"P": ("w", 0, H), "gi1": ("x", 3 * HALF, 5 * HALF), "gi3": ("y", 2 * H, 5 * HALF)},
    )
    got, capacity = story.hours()
    assert capacity == pytest.approx({"P": 2.5}, abs=1e-9)
    assert got[(None, "unallocated")] == pytest.approx(0.5 + 0.5 * 6 / 7 + 0.5 * 4 / 7)
    assert got[("w", "busy")] == pytest.approx(0.8)


@st.composite
def stories(draw: st.DrawFn) -> Story:
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "bad"]
    layouts: list[Layout] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["whole", "silent-whole", "none", "mig"]))
        if kind == "mig":
            ids = draw(st.lists(st.sampled_from(["gi1", "gi2", "gi3", "gi4"]), unique=True))
            layouts.append({gi: draw(st.sampled_from(profiles)) for gi in ids} or None)
        else:
            layouts.append(None if kind == "none" else kind)
    if all(x is None for x in layouts):
        layouts[0] = "whole"
    keys = ["P", "gi1", "gi2", "gi3", "gi4"]
    util = {k: draw(st.sampled_from([0.0, 3.0, 50.0, 100.0])) for k in keys}
    holders = {}
    for k in draw(st.lists(st.sampled_from(keys), unique=True, max_size=3)):
        a = draw(st.integers(0, len(layouts) * 2)) * HALF // 2
        holders[k] = (f"pod-{k}", a, a + draw(st.integers(1, 4)) * HALF // 2)
    return Story(layouts, util=util, holders=holders)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(story=stories())
def test_a_physical_card_has_its_observed_span_of_capacity_whatever_the_layout(
    story: Story,
) -> None:
    """SPEC §7: per physical card the categories sum to its observed span (first sample to
    the end of the last one's coverage), never more, never less, however it was carved."""
    samples, _, _ = story.frames()
    ts = samples["ts_ms"].to_numpy()
    span = (int(ts.max()) + PERIOD - int(ts.min())) / H
    got, capacity = story.hours()
    assert capacity == pytest.approx({"P": span}, abs=1e-9)
    assert all(v >= -1e-12 for v in got.values())
    assert np.isfinite(list(got.values())).all()
