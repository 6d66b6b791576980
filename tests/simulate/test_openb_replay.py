"""A few hours of Alibaba's OpenB trace on a few nodes (`bench/openb_day.py` replays a whole
day): the replay's ledger balances, its truth holds exactly what the trace says the pods
held, and the audit of its files matches the trace's fractional share."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from openb_day import DayFigures, replay_and_audit  # noqa: E402 - after the path it lives on


def _realdata() -> Path:
    env = os.environ.get("AUDITOR_REALDATA")
    return Path(env) if env else ROOT.parent / "shared" / "realdata"


OPENB = _realdata() / "alibaba-gpu-v2023-openb"
HOURS = 4.0
pytestmark = pytest.mark.skipif(
    not OPENB.is_dir(), reason=f"{OPENB} absent (set AUDITOR_REALDATA to the realdata folder)"
)


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> DayFigures:
    work = tmp_path_factory.mktemp("openb")
    return replay_and_audit(OPENB.parent, work, hours=HOURS, max_nodes=6)


def test_the_replay_holds_what_the_trace_says(day: DayFigures) -> None:
    assert day.nodes == 6
    assert day.trace_fractional_h > 0
    assert day.trace_held_h > day.trace_fractional_h
    # capacity is physical cards × time; the truth holds Σ share × overlap, exactly
    assert day.truth_capacity_h == pytest.approx(day.cards * HOURS, rel=1e-9)
    assert day.truth_held_h == pytest.approx(day.trace_held_h, rel=1e-9)
    assert day.truth_fractional_h == pytest.approx(day.trace_fractional_h, rel=1e-9)
    assert day.truth_held_h + day.truth_unallocated_h == pytest.approx(day.truth_capacity_h)


def test_the_audit_conserves_physical_capacity(day: DayFigures) -> None:
    assert day.capacity_h == pytest.approx(day.cards * HOURS, rel=1e-6)
    assert day.held_h + day.unallocated_h == pytest.approx(day.capacity_h, rel=1e-6)


def test_the_audit_matches_the_trace_fractional_share(day: DayFigures) -> None:
    assert day.held_h == pytest.approx(day.trace_held_h, rel=0.01)
    assert day.fractional_share == pytest.approx(day.trace_fractional_share, rel=0.01)
