"""Properties of the classifier over random clusters (SPEC §3 "Conservation").

Random GPUs with random sample spacing (regular, jittered, with outages), unreadable
readings, random non-overlapping tenures per GPU, some gangs spanning several cards, and
checkpoint markers. Whatever the input:
(a) per GPU the categories sum to its capacity seconds in the window;
(b) per pod they sum to its held seconds within capacity;
(c) the order of input rows changes nothing;
(d) the results of two adjacent windows add up to those of their union.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.classify import classify
from auditor.model import CATEGORIES, Window
from auditor.settings import Thresholds

TH = Thresholds(
    startup_cap_s=60,
    teardown_cap_s=30,
    reserved_after_s=90,
    checkpoint_min_gap_s=5,
    checkpoint_max_gap_s=60,
)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Cluster:
    samples: pd.DataFrame
    tenures: pd.DataFrame
    markers: pd.DataFrame
    lo: int
    hi: int


spacing = st.one_of(
    st.just(5_000),
    st.integers(4_000, 6_000),
    st.integers(1, 3_000),
    st.integers(16_000, 120_000),
)
reading = st.one_of(
    st.floats(0, 100),
    st.sampled_from([0.0, 0.0, 2.0, 100.0, 50.0]),
    st.just(math.nan),
)


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    n_gpus = draw(st.integers(1, 4))
    sample_rows: list[tuple[str, int, float]] = []
    tenure_rows: list[tuple[str, str, str, int, int]] = []
    lo, hi = 10**15, -(10**15)
    pod_no = 0
    for g in range(n_gpus):
        gpu = f"gpu-{g}"
        t = draw(st.integers(1_700_000_000_000, 1_700_000_050_000))
        n = draw(st.integers(0, 40))
        times = []
        for _ in range(n):
            times.append(t)
            t += draw(spacing)
        for ts in times:
            sample_rows.append((gpu, ts, draw(reading)))
        if times:
            lo, hi = min(lo, times[0]), max(hi, times[-1])
        # Non-overlapping tenures on this GPU: sorted cut points paired up, often on a
        # sample time or where the span ends.
        start = (times[0] if times else 1_700_000_000_000) - 30_000
        end = (times[-1] if times else start) + 60_000
        edges = [*times, t, *(times[-1:] * 2)] if times else [start]
        point = st.one_of(st.integers(start, end), st.sampled_from(edges))
        cuts = sorted(set(draw(st.lists(point, max_size=8))))
        for a, b in zip(cuts[::2], cuts[1::2], strict=False):
            gang = draw(st.sampled_from(["own", "J1", "J2"]))
            pod = f"pod-{pod_no}"
            pod_no += 1
            tenure_rows.append((gpu, pod, pod if gang == "own" else gang, a, b))
    if lo > hi:
        lo, hi = 1_700_000_000_000, 1_700_000_100_000
    marker_rows = [
        ("J1", m, m + draw(st.integers(0, 20_000)))
        for m in draw(st.lists(st.integers(lo, hi), max_size=3))
    ]
    return Cluster(
        samples=pd.DataFrame(sample_rows, columns=["gpu", "ts_ms", "util"]).astype(
            {"gpu": object, "ts_ms": np.int64, "util": np.float64}
        ),
        tenures=pd.DataFrame(
            tenure_rows, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"]
        ).astype({"start_ms": np.int64, "end_ms": np.int64}),
        markers=pd.DataFrame(marker_rows, columns=["gang", "start_ms", "end_ms"]),
        lo=lo - 40_000,
        hi=hi + 100_000,
    )


@st.composite
def windows(draw: st.DrawFn, cluster: Cluster) -> tuple[int, int, int]:
    a = draw(st.integers(cluster.lo, cluster.hi))
    c = draw(st.integers(a, cluster.hi))
    b = draw(st.integers(c, cluster.hi))
    return a, c, b


def spans(samples: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """Each GPU's observed span, computed independently from SPEC's wording."""
    out: dict[str, tuple[int, int]] = {}
    for gpu, group in samples.groupby("gpu"):
        ts = np.unique(group["ts_ms"].to_numpy())
        period = (
            math.floor(float(np.median(np.diff(ts))) + 0.5)
            if ts.size > 1
            else round(TH.default_period_s * 1000)
        )
        out[str(gpu)] = (int(ts[0]), int(ts[-1]) + max(period, 1))
    return out


def overlap(a: int, b: int, c: int, d: int) -> float:
    return max(0, min(b, d) - max(a, c)) / 1000


def run(cluster: Cluster, a: int, b: int) -> pd.DataFrame:
    return classify(
        cluster.samples,
        cluster.tenures,
        window=Window(a, b),
        thresholds=TH,
        markers=cluster.markers,
    ).results


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6)


@SETTINGS
@given(data=st.data())
def test_categories_sum_to_capacity_per_gpu_and_to_held_time_per_pod(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    a, _, b = data.draw(windows(cluster))

    out = run(cluster, a, b)

    assert (out["seconds"] > 0).all()
    assert set(out["category"]) <= {str(c) for c in CATEGORIES}
    assert not out.duplicated(["gpu", "pod_uid", "category"]).any()
    span = spans(cluster.samples)
    per_gpu = out.groupby("gpu")["seconds"].sum().to_dict()
    for gpu, (first, last) in span.items():
        assert close(per_gpu.get(gpu, 0.0), overlap(first, last, a, b)), gpu
    held: dict[str, float] = defaultdict(float)
    for gpu, pod, start, end in cluster.tenures[["gpu", "pod_uid", "start_ms", "end_ms"]].values:
        # a card no sample names: the pod still held it, its time unobserved (`unsampled`)
        first, last = span.get(str(gpu), (int(start), int(end)))
        held[str(pod)] += overlap(max(int(start), first), min(int(end), last), a, b)
    per_pod = out.dropna(subset=["pod_uid"]).groupby("pod_uid")["seconds"].sum().to_dict()
    for pod, seconds in held.items():
        assert close(per_pod.get(pod, 0.0), seconds), pod
    assert set(per_pod) <= set(held)


@SETTINGS
@given(data=st.data())
def test_row_order_changes_nothing(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    a, _, b = data.draw(windows(cluster))
    seed = data.draw(st.integers(0, 2**32 - 1))
    shuffled = Cluster(
        samples=cluster.samples.sample(frac=1, random_state=seed).reset_index(drop=True),
        tenures=cluster.tenures.sample(frac=1, random_state=seed).reset_index(drop=True),
        markers=cluster.markers.sample(frac=1, random_state=seed).reset_index(drop=True),
        lo=cluster.lo,
        hi=cluster.hi,
    )

    one = classify(
        cluster.samples, cluster.tenures, window=Window(a, b), thresholds=TH,
        markers=cluster.markers,
    )  # fmt: skip
    two = classify(
        shuffled.samples, shuffled.tenures, window=Window(a, b), thresholds=TH,
        markers=shuffled.markers,
    )  # fmt: skip

    pd.testing.assert_frame_equal(one.results, two.results)
    pd.testing.assert_frame_equal(one.findings, two.findings)


@SETTINGS
@given(data=st.data())
def test_adjacent_windows_add_up_to_their_union(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    a, c, b = data.draw(windows(cluster))

    def totals(frame: pd.DataFrame) -> dict[tuple[str, str, str], float]:
        keyed = frame.fillna({"pod_uid": "-"})
        return {
            (g, p, k): s
            for g, p, k, s in keyed[["gpu", "pod_uid", "category", "seconds"]].itertuples(
                index=False
            )
        }

    left, right, union = (
        totals(run(cluster, a, c)),
        totals(run(cluster, c, b)),
        totals(run(cluster, a, b)),
    )

    assert set(left) | set(right) == set(union)
    for key, seconds in union.items():
        assert close(left.get(key, 0.0) + right.get(key, 0.0), seconds), key
