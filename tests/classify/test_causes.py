"""Causes inside `compute_idle` and `unallocated` (SPEC §10) as decision tables, and the
properties that make them parts of their categories: they sum to them exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from auditor.classify import classify
from auditor.classify.causes import IdleCause, split_compute_idle
from auditor.classify.free_time import FreeCause, free_shares, split_free, split_unallocated
from auditor.model import Window
from auditor.settings import CauseThresholds, Thresholds

T = CauseThresholds()
NAN = math.nan


def piece(
    gpu: str = "g1", pod: str | None = "p1", start_s: int = 0, seconds: float = 10.0,
    category: str = "compute_idle", length_s: int = 10,
) -> dict[str, Any]:  # fmt: skip
    end_ms = (start_s + length_s) * 1000
    return {"gpu": gpu, "pod_uid": pod, "start_ms": start_s * 1000, "end_ms": end_ms,
            "category": category, "seconds": seconds}  # fmt: skip


@dataclass(frozen=True)
class Idle:
    pod: dict[str, float] = field(default_factory=dict)
    card: dict[str, float] = field(default_factory=dict)
    gang: bool = False
    at_s: int = 0
    """When the signal row was taken (the piece is [0, 10 s), its midpoint 5 s)."""


IDLE_CASES: dict[str, tuple[Idle, IdleCause, str]] = {
    "no signal at all": (Idle(), IdleCause.UNEXPLAINED, ""),
    "signals that hold nothing": (
        Idle({"cpu_limit_ratio": 0.5, "throttled_ratio": 0.0, "cpu_pressure": 0.01}),
        IdleCause.UNEXPLAINED, "",
    ),
    "CPU at its limit": (Idle({"cpu_limit_ratio": 0.95}), IdleCause.INPUT_BOUND, "cpu_limit"),
    "throttled in a quarter of periods": (
        Idle({"throttled_ratio": 0.25}), IdleCause.INPUT_BOUND, "cpu_throttled"
    ),
    "CPU pressure": (Idle({"cpu_pressure": 0.3}), IdleCause.INPUT_BOUND, "cpu_pressure"),
    "I/O pressure": (Idle({"io_pressure": 0.2}), IdleCause.INPUT_BOUND, "io_pressure"),
    "PCIe at 30 % of an unknown link (8 GB/s)": (
        Idle(card={"pcie_bytes_s": 2.4e9}), IdleCause.HOST_TRANSFER, "pcie"
    ),
    "PCIe below 30 % of a known fast link": (
        Idle(card={"pcie_bytes_s": 2.4e9, "pcie_link_bytes_s": 32e9}), IdleCause.UNEXPLAINED, ""
    ),
    "NVLink traffic of a gang card": (
        Idle(card={"nvlink_bytes_s": 5e9}, gang=True), IdleCause.COMMUNICATION, "nvlink"
    ),
    "NVLink traffic of a single-card pod is not communication": (
        Idle(card={"nvlink_bytes_s": 5e9}), IdleCause.UNEXPLAINED, ""
    ),
    "network traffic of a gang pod": (
        Idle({"net_bytes_s": 2e9}, gang=True), IdleCause.COMMUNICATION, "network"
    ),
    "a serving pod with requests waiting": (
        Idle({"requests_running": 0, "requests_waiting": 3}), IdleCause.BATCHING, "serving_queue"
    ),
    "a serving pod with requests running": (
        Idle({"requests_running": 2}), IdleCause.BATCHING, "serving_queue"
    ),
    "a serving pod with nothing to do": (
        Idle({"requests_running": 0, "requests_waiting": 0}), IdleCause.LOW_DEMAND, "serving_idle"
    ),
    "input before transfer": (
        Idle({"throttled_ratio": 0.5}, {"pcie_bytes_s": 7e9}),
        IdleCause.INPUT_BOUND, "cpu_throttled",
    ),
    "transfer before communication": (
        Idle(card={"pcie_bytes_s": 7e9, "nvlink_bytes_s": 9e9}, gang=True),
        IdleCause.HOST_TRANSFER, "pcie",
    ),
    "communication before serving": (
        Idle({"net_bytes_s": 2e9, "requests_running": 0}, gang=True),
        IdleCause.COMMUNICATION, "network",
    ),
    "a signal older than signal_stale_s holds nothing": (
        Idle({"cpu_limit_ratio": 1.0}, at_s=-200), IdleCause.UNEXPLAINED, ""
    ),
    "a signal after the instant is not read": (
        Idle({"cpu_limit_ratio": 1.0}, at_s=8), IdleCause.UNEXPLAINED, ""
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(IDLE_CASES))
def test_compute_idle_decision_table(case: str) -> None:
    idle, cause, deciding = IDLE_CASES[case]
    pod = pd.DataFrame([{"pod_uid": "p1", "ts_ms": idle.at_s * 1000, **idle.pod}])
    card = pd.DataFrame([{"gpu": "g1", "ts_ms": idle.at_s * 1000, **idle.card}])
    out = split_compute_idle(
        pd.DataFrame([piece()]),
        pod_signals=pod if idle.pod else None,
        card_signals=card if idle.card else None,
        multi_card_pods={"p1"} if idle.gang else set(),
        thresholds=T,
    )
    assert out[["cause", "deciding", "seconds"]].to_dict("records") == [
        {"cause": cause.value, "deciding": deciding, "seconds": 10.0}
    ]
    recent = bool(idle.pod or idle.card) and -180 <= idle.at_s <= 5
    assert out["signalled"].tolist() == [recent]


def test_only_compute_idle_of_a_pod_is_split() -> None:
    frame = pd.DataFrame(
        [piece(category="busy"), piece(category="straggler_wait"),
         piece(pod=None, category="unallocated")]
    )  # fmt: skip
    out = split_compute_idle(
        frame, pod_signals=None, card_signals=None, multi_card_pods=(), thresholds=T
    )
    assert out.empty


def test_thresholds_are_the_configured_ones() -> None:
    pod = pd.DataFrame([{"pod_uid": "p1", "ts_ms": 0, "cpu_limit_ratio": 0.8}])
    low = CauseThresholds(cpu_limit_ratio=0.75)
    for thresholds, cause in ((T, "unexplained"), (low, "input_bound")):
        out = split_compute_idle(
            pd.DataFrame([piece()]), pod_signals=pod, card_signals=None,
            multi_card_pods=(), thresholds=thresholds,
        )  # fmt: skip
        assert out["cause"].tolist() == [cause]


# ------------------------------------------------------------------ unallocated


def free(gpu: str, start_s: int, length_s: int, share: float = 1.0) -> dict[str, Any]:
    return piece(gpu, None, start_s, length_s * share, "unallocated", length_s)


NODES = {"a1": "node-a", "a2": "node-a", "b1": "node-b"}
KINDS = {"a1": "H100", "a2": "H100", "b1": "A100"}


def causes_of(frame: pd.DataFrame) -> dict[tuple[str, str], float]:
    return {(g, c): round(s, 6) for g, c, s in frame.itertuples(index=False)}


def test_a_cordoned_node_makes_its_free_cards_unavailable_for_the_overlap() -> None:
    pieces = pd.DataFrame([free("a1", 0, 100), free("b1", 0, 100)])
    cordon = pd.DataFrame([{"node": "node-a", "start_ms": 40_000, "end_ms": 1_000_000}])
    out = split_unallocated(
        pieces, card_node=NODES, card_kind=KINDS, unavailable=cordon, demand=None
    )
    assert causes_of(out) == {
        ("a1", "no_demand"): 40.0, ("a1", "unavailable"): 60.0, ("b1", "no_demand"): 100.0
    }  # fmt: skip


def test_demand_blocks_at_most_the_cards_asked_for_of_its_kind() -> None:
    # two free H100s and a free A100 for 100 s; one H100 asked for during [0, 50 s)
    pieces = pd.DataFrame([free("a1", 0, 100), free("a2", 0, 100), free("b1", 0, 100)])
    demand = pd.DataFrame([{"kind": "H100", "start_ms": 0, "end_ms": 50_000, "cards": 1}])
    out = split_unallocated(
        pieces, card_node=NODES, card_kind=KINDS, unavailable=None, demand=demand
    )
    got = causes_of(out)
    assert got[("a1", "blocked")] + got[("a2", "blocked")] == pytest.approx(50.0)
    assert got[("a1", "blocked")] == pytest.approx(25.0)  # shared by their free share
    assert ("b1", "blocked") not in got


def test_demand_for_any_card_is_shared_among_kinds_and_never_exceeds_the_free_cards() -> None:
    pieces = pd.DataFrame([free("a1", 0, 100), free("b1", 0, 100, share=0.5)])
    demand = pd.DataFrame([{"kind": None, "start_ms": 0, "end_ms": 100_000, "cards": 5}])
    out = split_unallocated(
        pieces, card_node=NODES, card_kind=KINDS, unavailable=None, demand=demand
    )
    # more asked than free: every free card-second is blocked
    assert causes_of(out) == {("a1", "blocked"): 100.0, ("b1", "blocked"): 50.0}


def test_an_unavailable_card_is_not_blocked_too() -> None:
    pieces = pd.DataFrame([free("a1", 0, 100)])
    cordon = pd.DataFrame([{"node": "node-a", "start_ms": 0, "end_ms": 100_000}])
    demand = pd.DataFrame([{"kind": "H100", "start_ms": 0, "end_ms": 100_000, "cards": 1}])
    out = split_unallocated(
        pieces, card_node=NODES, card_kind=KINDS, unavailable=cordon, demand=demand
    )
    assert causes_of(out) == {("a1", "unavailable"): 100.0}


# ------------------------------------------------------------------ properties

signal = st.one_of(st.just(NAN), st.floats(0, 1.5))


@settings(max_examples=40, deadline=None)
@given(
    utils=st.lists(st.sampled_from([0.0, 3.0, 40.0, 100.0]), min_size=4, max_size=30),
    pod_rows=st.lists(st.tuples(st.integers(0, 300), signal, signal), max_size=8),
    held=st.tuples(st.integers(0, 100), st.integers(50, 400)),
)
def test_causes_sum_to_compute_idle_per_card_and_pod(
    utils: list[float], pod_rows: list[tuple[int, float, float]], held: tuple[int, int]
) -> None:
    """Through the real classifier: the causes of each (card, pod)'s compute_idle add up to
    it exactly, whatever signals there are."""
    n = len(utils)
    samples = pd.DataFrame(
        {"gpu": "g1", "ts_ms": np.arange(n, dtype=np.int64) * 10_000, "util": utils}
    )
    start, length = held
    tenures = pd.DataFrame(
        [{"gpu": "g1", "pod_uid": "p1", "gang": "p1", "start_ms": start * 1000,
          "end_ms": (start + length) * 1000}]
    )  # fmt: skip
    got = classify(
        samples, tenures, window=Window(0, n * 10_000), thresholds=Thresholds(), keep_pieces=True
    )
    assert got.pieces is not None
    signals = pd.DataFrame(
        [{"pod_uid": "p1", "ts_ms": t * 1000, "cpu_limit_ratio": a, "requests_running": b}
         for t, a, b in pod_rows],
        columns=["pod_uid", "ts_ms", "cpu_limit_ratio", "requests_running"],
    )  # fmt: skip
    out = split_compute_idle(
        got.pieces, pod_signals=signals, card_signals=None, multi_card_pods=(), thresholds=T
    )
    res = got.results
    expected = res.loc[res["category"] == "compute_idle", "seconds"].sum()
    assert out["seconds"].sum() == pytest.approx(expected, abs=1e-9)
    assert set(out["cause"]) <= {c.value for c in IdleCause}


@settings(max_examples=40, deadline=None)
@given(
    frees=st.lists(
        st.tuples(st.sampled_from(["a1", "a2", "b1"]), st.integers(0, 200), st.integers(1, 60),
                  st.sampled_from([1.0, 0.5, 0.25])),
        min_size=1, max_size=12,
    ),
    cordons=st.lists(st.tuples(st.sampled_from(["node-a", "node-b"]), st.integers(0, 250),
                               st.integers(1, 100)), max_size=3),
    asks=st.lists(st.tuples(st.sampled_from(["H100", "A100", None]), st.integers(0, 250),
                            st.integers(1, 100), st.integers(1, 3)), max_size=4),
)  # fmt: skip
def test_causes_sum_to_unallocated_and_blocked_never_exceeds_demand(
    frees: list[tuple[str, int, int, float]],
    cordons: list[tuple[str, int, int]],
    asks: list[tuple[str | None, int, int, int]],
) -> None:
    pieces = pd.DataFrame([free(g, s, n, share) for g, s, n, share in frees])
    unavailable = pd.DataFrame(
        [{"node": n, "start_ms": s * 1000, "end_ms": (s + d) * 1000} for n, s, d in cordons],
        columns=["node", "start_ms", "end_ms"],
    )
    demand = pd.DataFrame(
        [{"kind": k, "start_ms": s * 1000, "end_ms": (s + d) * 1000, "cards": c}
         for k, s, d, c in asks],
        columns=["kind", "start_ms", "end_ms", "cards"],
    )  # fmt: skip
    out = split_unallocated(
        pieces, card_node=NODES, card_kind=KINDS, unavailable=unavailable, demand=demand
    )
    per_gpu = out.groupby("gpu")["seconds"].sum()
    want = pieces.groupby("gpu")["seconds"].sum()
    assert per_gpu.reindex(want.index).fillna(0.0).to_numpy() == pytest.approx(want.to_numpy())
    blocked = out.loc[out["cause"] == FreeCause.BLOCKED.value, "seconds"].sum()
    assert blocked <= sum(c * d for _, _, d, c in asks) + 1e-6
    assert (out["seconds"] > 0).all()


@settings(max_examples=40, deadline=None)
@given(
    frees=st.lists(
        st.tuples(st.sampled_from(["a1", "a2", "b1"]), st.integers(0, 200), st.integers(1, 60),
                  st.sampled_from([1.0, 0.5])),
        min_size=1, max_size=12,
    ),
    asks=st.lists(st.tuples(st.sampled_from(["H100", "A100", None]), st.integers(0, 250),
                            st.integers(1, 100), st.integers(1, 3)), max_size=4),
    chunk=st.sets(st.sampled_from(["a1", "a2", "b1"])),
)  # fmt: skip
@example(  # pieces that meet: merged at one share, apart at two; the cordon cuts b1's
    frees=[("a1", 0, 10, 1.0), ("a1", 10, 10, 1.0), ("a1", 20, 10, 0.5), ("b1", 20, 20, 1.0),
           ("b1", 40, 20, 1.0), ("a2", 0, 60, 1.0)],
    asks=[("H100", 5, 30, 1), (None, 25, 30, 2)], chunk={"a1"},
)  # fmt: skip
def test_free_time_split_in_chunks_of_cards_equals_one_split(
    frees: list[tuple[str, int, int, float]],
    asks: list[tuple[str | None, int, int, int]],
    chunk: set[str],
) -> None:
    """An audit splits free time in chunks of cards: each chunk's shares folded (those no
    wait overlaps summed per card and hour, those it overlaps merged where they meet), all
    split at once, give what one split of every piece gives, card by card and hour by
    hour."""
    pieces = pd.DataFrame([free(g, s, n, share) for g, s, n, share in frees])
    pieces["hour_ms"] = pieces["start_ms"] // 50_000 * 50_000
    cordon = pd.DataFrame([{"node": "node-b", "start_ms": 30_000, "end_ms": 90_000}])
    demand = pd.DataFrame(
        [{"kind": k, "start_ms": s * 1000, "end_ms": (s + d) * 1000, "cards": c}
         for k, s, d, c in asks],
        columns=["kind", "start_ms", "end_ms", "cards"],
    )  # fmt: skip
    maps = {"card_node": NODES, "card_kind": KINDS, "unavailable": cordon}
    unfolded = free_shares(pieces, **maps, demand=demand, fold=False)
    assert len(unfolded) == len(pieces)
    whole = split_free(unfolded, demand=demand)
    parts = [pieces[pieces["gpu"].isin(chunk)], pieces[~pieces["gpu"].isin(chunk)]]
    shares = [free_shares(part, **maps, demand=demand) for part in parts]
    chunked = split_free(pd.concat(shares, ignore_index=True), demand=demand)
    pd.testing.assert_frame_equal(chunked, whole, check_exact=False, rtol=1e-9, atol=1e-9)


def test_one_sources_row_never_hides_anothers() -> None:
    """The sampler's cgroup row and a server's gauges at other instants: both are read."""
    pod = pd.DataFrame(
        [
            {"pod_uid": "p1", "source": "cgroup", "ts_ms": 0, "throttled_ratio": 0.1},
            {"pod_uid": "p1", "source": "serving", "ts_ms": 4000, "requests_running": 0,
             "requests_waiting": 0},
        ]
    )  # fmt: skip
    out = split_compute_idle(
        pd.DataFrame([piece()]), pod_signals=pod, card_signals=None, multi_card_pods=(),
        thresholds=T,
    )  # fmt: skip
    assert out["cause"].tolist() == ["low_demand"]
    throttled = pod.assign(throttled_ratio=[0.5, np.nan])
    out = split_compute_idle(
        pd.DataFrame([piece()]), pod_signals=throttled, card_signals=None, multi_card_pods=(),
        thresholds=T,
    )  # fmt: skip
    assert out["cause"].tolist() == ["input_bound"]


@settings(max_examples=60, deadline=None)
@example(mids=[("g1", 5)], rows=[("g1", 2, 5e9)])  # exactly signal_stale_s old: it holds
@example(mids=[("g1", 5)], rows=[("g1", 4, 5e9), ("g1", 4, 1e9)])  # the last given wins
@example(mids=[("g1", 5)], rows=[("g1", 4, 1e9), ("g1", 4, NAN)])  # even one without value
@example(mids=[("g1", 5)], rows=[("g2", 5, 5e9)])  # another card's row never counts
@given(
    mids=st.lists(st.tuples(st.sampled_from(["g1", "g2"]), st.integers(-2, 20)), min_size=1,
                  max_size=12),
    rows=st.lists(st.tuples(st.sampled_from(["g1", "g2", "g3"]), st.integers(0, 16),
                            st.one_of(st.just(NAN), st.sampled_from([1e9, 2.4e9, 5e9]))),
                  max_size=16),
)  # fmt: skip
def test_each_piece_is_judged_by_its_cards_last_row_at_or_before_its_midpoint(
    mids: list[tuple[str, int]], rows: list[tuple[str, int, float]]
) -> None:
    """On a 60 s grid, so that rows share instants and lie exactly `signal_stale_s` (180 s)
    before a midpoint: the row that decides is the card's last at or before the midpoint
    (of two at one instant, the one given last) if it is at most 180 s older; its PCIe
    reading then holds (2.4 GB/s is 30 % of the unknown link) or not, and a row whose
    reading is missing still counts as a signal looked at only if it holds a value."""
    pieces = pd.DataFrame(
        [{"gpu": g, "pod_uid": "p1", "start_ms": m * 60_000 - 5_000,
          "end_ms": m * 60_000 + 5_000, "category": "compute_idle", "seconds": 10.0}
         for g, m in mids]
    )  # fmt: skip
    card = pd.DataFrame(
        [{"gpu": g, "ts_ms": t * 60_000, "pcie_bytes_s": v} for g, t, v in rows],
        columns=["gpu", "ts_ms", "pcie_bytes_s"],
    )
    out = split_compute_idle(
        pieces, pod_signals=None, card_signals=card, multi_card_pods=(), thresholds=T
    )
    for (g, m), cause, signalled in zip(mids, out["cause"], out["signalled"], strict=True):
        before = [(t, i) for i, (rg, t, _) in enumerate(rows) if rg == g and t <= m]
        latest = max(before, default=None)  # the latest instant; of equal ones, the last row
        value = rows[latest[1]][2] if latest is not None and m - latest[0] <= 3 else NAN
        assert signalled == (not math.isnan(value))
        assert cause == ("host_transfer" if value >= 2.4e9 else "unexplained")
