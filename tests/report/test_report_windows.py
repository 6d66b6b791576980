"""Choosing stored runs for a report window: cover it once, name what is missing."""

from __future__ import annotations

import pandas as pd
import pytest

from auditor.report.windows import choose_runs

H = 3_600_000


def runs(*windows: tuple[int, int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": list(range(1, len(windows) + 1)),
            "window_start_ms": [a * H for a, _ in windows],
            "window_end_ms": [b * H for _, b in windows],
        }
    )


@pytest.mark.parametrize(
    ("stored", "window", "ids", "missing"),
    [
        pytest.param([(0, 24)], (0, 24), [1], [], id="exact window"),
        pytest.param([(0, 24), (24, 48)], (0, 48), [1, 2], [], id="adjacent days add up"),
        pytest.param([(0, 24), (24, 48), (0, 48)], (0, 48), [3], [], id="the longer run wins"),
        pytest.param(
            [(0, 7), (0, 5), (5, 10)], (0, 10), [2, 3], [], id="chain that reaches the end"
        ),
        pytest.param([(0, 24)], (0, 48), [1], [(24, 48)], id="uncovered day is named"),
        pytest.param([(24, 48)], (0, 48), [1], [(0, 24)], id="leading gap"),
        pytest.param([(0, 50)], (0, 48), [], [(0, 48)], id="run wider than window is not cut"),
    ],
)
def test_choose_runs(
    stored: list[tuple[int, int]],
    window: tuple[int, int],
    ids: list[int],
    missing: list[tuple[int, int]],
) -> None:
    choice = choose_runs(runs(*stored), start_ms=window[0] * H, end_ms=window[1] * H)
    assert choice.run_ids == ids
    assert choice.missing == [(a * H, b * H) for a, b in missing]


def test_all_shards_of_a_window_count() -> None:
    stored = pd.DataFrame({"id": [1, 2], "window_start_ms": [0, 0], "window_end_ms": [H, H]})
    assert choose_runs(stored, start_ms=0, end_ms=H).run_ids == [1, 2]
