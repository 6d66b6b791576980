"""The run-length factorisation the timelines, causes and explain use on grouped pieces: the
same codes, names and membership as pandas gives for any order of values, runs or not."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.classify.arrays import ascending, order_by, run_factorize, run_isin

NAMES = st.sampled_from(["GPU-a", "GPU-b", "pod-1", "pod-2", "", None])
MISSING = st.sampled_from([None, float("nan"), pd.NA])
DTYPES = st.sampled_from([object, "str", "string"])


@settings(max_examples=200, deadline=None)
@given(values=st.lists(NAMES, max_size=40), sort=st.booleans(), missing=MISSING, dtype=DTYPES)
def test_run_factorize_is_pandas_factorize(
    values: list[str | None], sort: bool, missing: object, dtype: object
) -> None:
    """Whatever a column's dtype and however its missing values are spelt (a CSV's NaN, a
    store's None, a nullable string's NA, which compares to NA rather than to a bool)."""
    series = pd.Series([missing if v is None else v for v in values], dtype=dtype)
    codes, names = run_factorize(series, sort=sort)
    want_codes, want_names = pd.factorize(series.to_numpy(dtype=object), sort=sort)
    assert codes.tolist() == want_codes.tolist()
    assert list(names) == list(want_names)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(NAMES, max_size=40), wanted=st.sets(NAMES.filter(bool), max_size=3))
def test_run_isin_is_pandas_isin(values: list[str | None], wanted: set[str]) -> None:
    series = pd.Series(values, dtype=object)
    assert run_isin(series, wanted).tolist() == series.isin(list(wanted)).tolist()


def test_a_column_grouped_in_runs_keeps_its_runs_and_sorted_names() -> None:
    cards = pd.Series(np.repeat(np.array(["GPU-b", "GPU-a", "GPU-b"], dtype=object), 1000))
    codes, names = run_factorize(cards, sort=True)
    assert list(names) == ["GPU-a", "GPU-b"]
    assert codes[:1000].tolist() == [1] * 1000
    assert codes[1000:2000].tolist() == [0] * 1000
    assert codes[2000:].tolist() == [1] * 1000


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), max_size=30))
def test_ascending_is_whether_order_by_leaves_every_row_in_place(
    rows: list[tuple[int, int, int]],
) -> None:
    keys = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    in_place = bool((order_by(*keys) == np.arange(len(rows))).all()) if rows else True
    assert ascending(*keys) == in_place
