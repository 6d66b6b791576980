"""How long a pod waited and for how many cards, and a gang's half-start (SPEC §10): the
pure rules of `auditor.classify.queue`, table by table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from auditor.classify.queue import cards_asked, clip, demand_of, gang_half_starts, wait_spans


def pod(uid: str, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "uid": uid, "namespace": "ml", "name": uid, "team": "t", "job": "Job/j", "gang": uid,
        "gpu_count": 1, "gpu_share": np.nan, "created_ms": 1_000, "bound_ms": None,
        "finished_ms": None, "deleted_ms": None, "wait_reason": "Unschedulable",
        "wait_message": "0/3 nodes are available", "wanted_model": None, "wait_seen_ms": None,
    }  # fmt: skip
    row.update(kw)
    return row


@pytest.mark.parametrize(
    ("row", "want"),
    [
        (pod("bound", bound_ms=5_000, wait_seen_ms=3_000), (1_000, 5_000)),
        (pod("seen", wait_seen_ms=4_000), (1_000, 4_000)),  # never past what was seen
        (pod("deleted", deleted_ms=2_000, wait_seen_ms=1_500), (1_000, 2_000)),
        (pod("failed", finished_ms=2_500, wait_seen_ms=9_000), (1_000, 2_500)),
        (pod("no-created", created_ms=None, bound_ms=9_000, wait_seen_ms=3_000), (3_000, 9_000)),
        (pod("no-end"), None),  # no end known: no stretch guessed
        (pod("never", wait_reason=None, bound_ms=60_000), None),  # never seen waiting
        (pod("reservation", gpu_count=0, wait_seen_ms=4_000), None),
        (pod("instant", bound_ms=1_000), None),
    ],
)  # fmt: skip
def test_a_wait_lasts_from_creation_to_its_first_known_end(
    row: dict[str, Any], want: tuple[int, int] | None
) -> None:
    got = wait_spans(pd.DataFrame([row]))
    assert (None if got.empty else (got["start_ms"].iloc[0], got["end_ms"].iloc[0])) == want


def test_cards_asked_count_shares_of_cards() -> None:
    got = cards_asked(pd.Series([2, 1, 2, 0]), pd.Series([np.nan, 0.5, 0.25, np.nan]))
    assert got.tolist() == [2.0, 0.5, 0.5, 0.0]


def test_demand_is_the_frame_split_unallocated_takes_clipped_to_a_window() -> None:
    spans = wait_spans(pd.DataFrame([
        pod("a", wanted_model="NVIDIA-H100-80GB-HBM3", gpu_count=8, bound_ms=10_000),
        pod("b", gpu_count=1, gpu_share=0.5, created_ms=4_000, wait_seen_ms=20_000),
    ]))  # fmt: skip
    got = demand_of(clip(spans, start_ms=5_000, end_ms=15_000))
    assert got.dtypes.astype(str).to_dict() == {
        "kind": "object", "start_ms": "int64", "end_ms": "int64", "cards": "float64",
    }  # fmt: skip
    assert list(got.itertuples(index=False, name=None)) == [
        ("NVIDIA-H100-80GB-HBM3", 5_000, 10_000, 8.0),
        (None, 5_000, 15_000, 0.5),
    ]


def gang_pod(uid: str, bound: int, *, end: int | None = None) -> dict[str, Any]:
    job = "ml/PyTorchJob/llm"
    return pod(uid, gang=job, job=job, bound_ms=bound, finished_ms=end, gpu_count=4)


def test_a_gangs_half_start_is_the_cards_its_early_pods_held_until_the_last_was_bound() -> None:
    frame = pd.DataFrame(
        [
            gang_pod("master", 0),
            gang_pod("worker-0", 60_000),
            gang_pod("worker-1", 600_000),  # waited ten minutes for its cards
            gang_pod("old-attempt", -900_000, end=-300_000),  # ended before: not counted
            pod("alone", bound_ms=0),  # its own gang: nothing to wait for
            pod("together-a", gang="g2", bound_ms=5_000),
            pod("together-b", gang="g2", bound_ms=5_000),  # bound together: no half-start
        ]
    )
    got = gang_half_starts(frame)
    assert got.to_dict("records") == [
        {
            "gang": "ml/PyTorchJob/llm", "job": "ml/PyTorchJob/llm", "pods": 3, "early_pods": 2,
            "first_bound_ms": 0, "last_bound_ms": 600_000,
            "gpu_seconds": 4 * 600.0 + 4 * 540.0,
        }
    ]  # fmt: skip
    assert gang_half_starts(frame, min_gap_ms=2_000_000).empty
    assert gang_half_starts(frame.iloc[0:0]).empty
