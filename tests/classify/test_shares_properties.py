"""Properties of the split of shared cards (SPEC §7) over random tenants.

Random physical cards (random sample spacing with outages and unreadable readings), random
tenants with random shares (some unknown, some adding up to more than the card), random
measured activity for some of them. Whatever the input:
(a) per physical card the categories sum to its capacity seconds in the window, and every
    tenant's time to at most its share of the time it held the card plus what it borrowed
    as busy time (a tenant above its share never adds time);
(b) one tenant with share 1 through the shared path equals the exclusive path.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_classify_properties import TH, close, overlap, reading, spacing, spans

from auditor.classify import classify
from auditor.model import Window

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000_000


def frame(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["gpu", "ts_ms", "util"]).astype(
        {"gpu": object, "ts_ms": np.int64, "util": np.float64}
    )


@st.composite
def shared_cards(
    draw: st.DrawFn,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, tuple[int, int]]:
    sample_rows: list[tuple[str, int, float]] = []
    tenure_rows: list[tuple[str, str, str, int, int, float]] = []
    activity_rows: list[tuple[str, str, int, float]] = []
    pod_no = 0
    for g in range(draw(st.integers(1, 2))):
        gpu = f"gpu-{g}"
        t = T0 + draw(st.integers(0, 20_000))
        times = []
        for _ in range(draw(st.integers(1, 40))):
            times.append(t)
            t += draw(spacing)
        for ts in times:
            sample_rows.append((gpu, ts, draw(reading)))
        for _ in range(draw(st.integers(1, 4))):
            a = draw(st.integers(times[0] - 20_000, times[-1] + 10_000))
            b = draw(st.integers(a + 1, times[-1] + 60_000))
            share = draw(st.one_of(st.floats(0.05, 1.0), st.just(math.nan)))
            pod = f"pod-{pod_no}"
            pod_no += 1
            gang = draw(st.sampled_from([pod, "J1"]))
            tenure_rows.append((gpu, pod, gang, a, b, share))
            if draw(st.booleans()):
                for ts in times:
                    if draw(st.integers(0, 3)):
                        activity_rows.append((gpu, pod, ts, draw(reading)))
    tenures = pd.DataFrame(
        tenure_rows, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms", "share"]
    ).astype({"start_ms": np.int64, "end_ms": np.int64, "share": np.float64})
    activity = pd.DataFrame(activity_rows, columns=["gpu", "pod_uid", "ts_ms", "util"]).astype(
        {"ts_ms": np.int64, "util": np.float64}
    )
    lo, hi = T0 - 30_000, int(frame(sample_rows)["ts_ms"].max()) + 200_000
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    return frame(sample_rows), tenures, activity, (a, b)


def run(
    samples: pd.DataFrame, tenures: pd.DataFrame, activity: pd.DataFrame, window: tuple[int, int]
) -> pd.DataFrame:
    return classify(
        samples, tenures, window=Window(*window), thresholds=TH, activity=activity
    ).results


@SETTINGS
@given(case=shared_cards())
def test_a_physical_card_sums_to_its_capacity(
    case: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, tuple[int, int]],
) -> None:
    samples, tenures, activity, (a, b) = case

    out = run(samples, tenures, activity, (a, b))

    assert (out["seconds"] > 0).all()
    span = spans(samples)
    per_gpu = out.groupby("gpu")["seconds"].sum().to_dict()
    assert set(per_gpu) <= set(span)
    for gpu, (first, last) in span.items():
        assert close(per_gpu.get(gpu, 0.0), overlap(first, last, a, b)), gpu
    per_pod = out.dropna(subset=["pod_uid"]).groupby("pod_uid")["seconds"].sum()
    busy = out[out["category"] == "busy"].dropna(subset=["pod_uid"]).groupby("pod_uid")["seconds"]
    busy_s = busy.sum()
    for gpu, pod, start, end, share in tenures[
        ["gpu", "pod_uid", "start_ms", "end_ms", "share"]
    ].itertuples(index=False):
        first, last = span[str(gpu)]
        held = overlap(max(int(start), first), min(int(end), last), a, b)
        cap = held * (1.0 if math.isnan(share) else share)
        assert per_pod.get(pod, 0.0) <= cap + busy_s.get(pod, 0.0) + 1e-6, pod


@SETTINGS
@given(case=shared_cards())
def test_one_tenant_of_share_1_is_the_exclusive_path(
    case: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, tuple[int, int]],
) -> None:
    samples, tenures, _, (a, b) = case
    one = tenures.drop_duplicates("gpu").assign(share=1.0)

    exclusive = classify(samples, one, window=Window(a, b), thresholds=TH).results
    shared = classify(
        samples, one, window=Window(a, b), thresholds=TH, shared_cards=set(one["gpu"])
    ).results

    assert list(exclusive.columns) == list(shared.columns)
    left = exclusive.set_index(["gpu", "pod_uid", "category"])["seconds"]
    right = shared.set_index(["gpu", "pod_uid", "category"])["seconds"]
    keys = set(left.index) | set(right.index)
    for key in keys:
        x, y = float(left.get(key, 0.0)), float(right.get(key, 0.0))
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6), (key, x, y)
    assert not shared["estimated"].any()


def test_a_piece_cut_where_a_tenure_begins_meets_its_gang_when_its_reading_was_taken() -> None:
    """The shared path cuts a card's samples where a tenure begins: the piece after the cut
    still carries the reading before it, and meets its gang at that reading's instant, as
    the exclusive path does. Here gpu-1 read 40 % at 7 s (tick 1 at a 5 s period) and pod-b
    held it for a second from 8 s (tick 2); its gang mate on gpu-0 read 0 % at tick 1 and
    90 % at tick 2. Met at the cut, half of pod-b's second was `straggler_wait` (waiting for
    a busier rank); met at its reading, as unshared, it is `compute_idle`."""
    util_0 = {0: 0.0, 5_000: 0.0, 10_000: 90.0, 15_000: 90.0, 20_000: 90.0}
    rows = [("gpu-0", T0 + t, u) for t, u in util_0.items()]
    rows += [("gpu-1", T0 + t, 40.0) for t in (2_000, 7_000, 12_000, 17_000)]
    tenures = pd.DataFrame(
        [("gpu-0", "pod-a", "J", T0, T0 + 25_000, 1.0),
         ("gpu-1", "pod-b", "J", T0 + 8_000, T0 + 9_000, 1.0)],
        columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms", "share"],
    )  # fmt: skip
    window = Window(T0, T0 + 25_000)
    exclusive = classify(frame(rows), tenures, window=window, thresholds=TH).results
    shared = classify(
        frame(rows), tenures, window=window, thresholds=TH, shared_cards={"gpu-1"}
    ).results

    def pod_b(results: pd.DataFrame) -> dict[str, float]:
        mine = results[results["pod_uid"] == "pod-b"]
        return dict(zip(mine["category"], mine["seconds"].round(6), strict=True))

    assert pod_b(exclusive) == {"busy": 0.4, "compute_idle": 0.6}
    assert pod_b(shared) == pod_b(exclusive)


def test_a_rolled_up_minute_stays_a_minute_mean_on_a_shared_card() -> None:
    """A rolled-up minute is a mean, so an idle one says the whole minute was idle and can
    be a checkpoint gap of a minute; a point reading cannot (it needs three periods, three
    minutes at a minute's period). One idle minute in ten, three hours of rolled-up minutes:
    checkpoints, through the shared path as through the exclusive one, where the expansion
    had lost which rows were minute means."""
    minutes = np.arange(180)
    samples = pd.DataFrame(
        {
            "gpu": pd.Series("gpu-0", index=minutes, dtype=object),
            "ts_ms": T0 + minutes * 60_000,
            "util": np.where(minutes % 10 == 5, 0.0, 90.0),
            "throttle_reasons": None,
            "cover_ms": 60_000.0,
        }
    )
    tenures = pd.DataFrame(
        [("gpu-0", "pod-a", "J", T0, T0 + 180 * 60_000, 1.0)],
        columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms", "share"],
    )
    window = Window(T0, T0 + 180 * 60_000)
    exclusive = classify(samples, tenures, window=window, thresholds=TH).results
    shared = classify(
        samples, tenures, window=window, thresholds=TH, shared_cards={"gpu-0"}
    ).results

    def seconds(results: pd.DataFrame) -> dict[str, float]:
        return dict(zip(results["category"], results["seconds"].round(6), strict=True))

    assert seconds(exclusive)["checkpoint"] == 18 * 60
    assert seconds(shared) == seconds(exclusive)
