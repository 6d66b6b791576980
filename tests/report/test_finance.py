"""The finance CSV: exact columns, reconciliation to the cent, stable bytes, no formulas."""

from __future__ import annotations

import csv
import io

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from auditor.errors import InputError
from auditor.model import CATEGORIES, PLATFORM_TEAM
from auditor.report.finance import (
    COLUMNS,
    finance_rows,
    parse_week,
    render_finance_csv,
    round_column,
    unpriced_note,
)
from auditor.report.summary import totals
from auditor.report.text import csv_cell, neutralise
from auditor.settings import Prices

WEEK = parse_week("2026-W48")
PRICES = Prices(default=2.0, by_model={"NVIDIA H100 80GB HBM3": 4.25}, currency="EUR")


def results(rows: list[tuple[str | None, str | None, str | None, str, float]]) -> pd.DataFrame:
    """(pod_uid, team, gpu_model, category, seconds) rows shaped like the store's read."""
    return pd.DataFrame(
        {
            "gpu": [f"GPU-{i % 3}" for i in range(len(rows))],
            "pod_uid": [r[0] for r in rows],
            "team": [r[1] for r in rows],
            "gpu_model": [r[2] for r in rows],
            "category": [r[3] for r in rows],
            "seconds": [r[4] for r in rows],
            "inferred": [False] * len(rows),
            "namespace": [r[1] for r in rows],
            "job": ["Pod/x" if r[0] else None for r in rows],
            "pod": [r[0] for r in rows],
            "node": ["n1"] * len(rows),
            "workload": ["training"] * len(rows),
        }
    )


H100 = "NVIDIA H100 80GB HBM3"
SAMPLE = results(
    [
        ("p1", "nlp", H100, "busy", 7000.0),
        ("p1", "nlp", H100, "startup", 400.0),
        ("p1", "nlp", H100, "compute_idle", 1000.0 / 3),
        ("p2", "vision", "NVIDIA L40S", "reserved_idle", 3600.0),
        ("p2", "vision", "NVIDIA L40S", "unobserved", 20.0),
        (None, None, H100, "unallocated", 5000.0),
        (None, None, H100, "unobserved", 100.0),
    ]
)


def test_parse_week() -> None:
    assert (WEEK.start_iso, WEEK.end_iso) == ("2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z")
    assert parse_week("2020-W53").start_iso == "2020-12-28T00:00:00Z"
    for bad in ("2026-48", "2026-W54", "W48", "2021-W53"):
        with pytest.raises(InputError):
            parse_week(bad)


def test_rows_columns_and_order() -> None:
    rows = finance_rows(SAMPLE, week=WEEK, prices=PRICES, cost_centres={"nlp": "CC-1"})
    assert list(rows.columns) == COLUMNS
    assert list(zip(rows["team"], rows["gpu_model"], strict=True)) == [
        ("nlp", H100), ("vision", "NVIDIA L40S"), (PLATFORM_TEAM, H100),
    ]  # fmt: skip
    nlp, vision, platform = rows.to_dict("records")
    assert nlp["cost_centre"] == "CC-1"
    assert vision["cost_centre"] == ""
    assert nlp["price_per_gpu_hour"] == 4.25
    assert vision["price_per_gpu_hour"] == 2.0
    assert nlp["allocated_gpu_hours"] == pytest.approx((7400 + 1000 / 3) / 3600, abs=1e-4)
    assert nlp["scheduling_waste_gpu_hours"] == nlp["startup_gpu_hours"]
    assert vision["allocated_gpu_hours"] == 1.0056  # held time includes its unobserved
    assert platform["unallocated_gpu_hours"] == pytest.approx(5000 / 3600, abs=1e-4)
    assert platform["allocated_gpu_hours"] == pytest.approx(5100 / 3600, abs=1e-4)
    assert nlp["compute_idle_cost"] == pytest.approx(1000 / 3 / 3600 * 4.25, abs=0.005)
    assert {r["currency"] for r in rows.to_dict("records")} == {"EUR"}


def test_columns_reconcile_with_report_totals_and_capacity_cost() -> None:
    rows = finance_rows(SAMPLE, week=WEEK, prices=PRICES, cost_centres={})
    expected = totals(SAMPLE)
    for cat in CATEGORIES:
        col = f"{cat.value}_gpu_hours"
        assert rows[col].sum() == pytest.approx(round(expected[col], 4), abs=1e-9)
    capacity_cost = sum(
        SAMPLE.loc[SAMPLE["gpu_model"] == m, "seconds"].sum() / 3600 * PRICES.for_model(m)
        for m in SAMPLE["gpu_model"].unique()
    )
    assert rows["allocated_cost"].sum() == pytest.approx(round(capacity_cost, 2), abs=1e-9)


def test_reexport_is_byte_identical_and_independent_of_row_order() -> None:
    first = render_finance_csv(finance_rows(SAMPLE, week=WEEK, prices=PRICES, cost_centres={}))
    shuffled = SAMPLE.sample(frac=1.0, random_state=7).reset_index(drop=True)
    again = render_finance_csv(finance_rows(shuffled, week=WEEK, prices=PRICES, cost_centres={}))
    assert first == again
    header, line = first.split("\r\n")[:2]
    assert header == ",".join(COLUMNS)
    assert line.startswith("2026-W48,2026-11-23T00:00:00Z,2026-11-30T00:00:00Z,nlp,,NVIDIA H100")


@example(values=[0.015], decimals=2)  # a total that is a tie: 1.5 cents rounds to 2
@given(
    values=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40),
    decimals=st.sampled_from([2, 4]),
)
def test_rounded_column_sums_to_rounded_total(values: list[float], decimals: int) -> None:
    arr = np.array(values)
    rounded = round_column(arr, decimals)
    assert round(rounded.sum(), decimals) == round(
        round(arr.sum() * 10**decimals) / 10**decimals, decimals
    )
    assert np.all(np.abs(rounded - arr) < 10.0**-decimals + 1e-9)


@settings(max_examples=200)
@given(team=st.text(min_size=1, max_size=20), centre=st.text(max_size=12))
def test_text_cells_round_trip_through_csv_reader_without_formulas(team: str, centre: str) -> None:
    data = results([("p", team, H100, "busy", 3600.0)])
    text = render_finance_csv(
        finance_rows(data, week=WEEK, prices=PRICES, cost_centres={team: centre})
    )
    (header, row) = list(csv.reader(io.StringIO(text, newline="")))
    cells = dict(zip(header, row, strict=True))
    for col in ("team", "cost_centre"):
        assert not cells[col].startswith(("=", "+", "-", "@", "\t", "\r"))
    assert cells["team"] == csv_cell(team)
    assert cells["cost_centre"] == csv_cell(centre)


@pytest.mark.parametrize("cell", ["=1+2", "+SUM(A1)", "-2", "@cmd", "\tx", "\rx"])
def test_formula_starts_are_neutralised(cell: str) -> None:
    assert neutralise(cell) == "'" + cell
    assert neutralise("nlp") == "nlp"


def test_models_without_a_price_are_named_in_a_warning() -> None:
    """Without a config every cost is 0.00: the export says which models have no price."""
    rows = finance_rows(SAMPLE, week=WEEK, prices=Prices(), cost_centres={})
    note = unpriced_note(rows, prices=Prices())
    assert note is not None
    assert "'NVIDIA H100 80GB HBM3', 'NVIDIA L40S'" in note
    assert "[prices]" in note
    priced = Prices(by_model={H100: 4.0})
    assert "'NVIDIA L40S'" in str(unpriced_note(rows, prices=priced))
    assert H100 not in str(unpriced_note(rows, prices=priced))
    assert unpriced_note(rows, prices=PRICES) is None  # a default prices every model
