"""`auditor report` on a demo database: every grouping and format, and the numbers agree."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.model import CATEGORIES, PLATFORM_TEAM
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate

runner = CliRunner()
BY = ["team", "namespace", "job", "pod", "node", "gpu"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("report")
    url = f"sqlite:///{tmp / 'auditor.db'}"
    sim = simulate(tmp / "c", scenario=SCENARIOS["small"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    return url


def report(db: str, *args: str) -> str:
    result = runner.invoke(app, ["--db", db, "report", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("by", BY)
def test_every_grouping_sums_to_the_same_capacity(db: str, by: str) -> None:
    rows = json.loads(report(db, "--by", by, "--format", "json"))
    capacity = sum(r[f"{c.value}_gpu_hours"] for r in rows for c in CATEGORIES)
    team_rows = json.loads(report(db, "--format", "json"))
    expected = sum(r[f"{c.value}_gpu_hours"] for r in team_rows for c in CATEGORIES)
    # JSON carries 6 decimals per cell
    assert capacity == pytest.approx(expected, abs=len(rows) * len(CATEGORIES) * 1e-6)
    assert all(by in r for r in rows)


def test_json_rows_are_keyed_and_carry_the_platform(db: str) -> None:
    rows = json.loads(report(db, "--format", "json"))
    teams = [r["team"] for r in rows]
    assert teams[-1] == PLATFORM_TEAM
    platform = rows[-1]
    assert platform["allocated_gpu_hours"] == 0
    assert platform["unallocated_gpu_hours"] > 0
    for r in rows[:-1]:
        held = sum(r[f"{c.value}_gpu_hours"] for c in CATEGORIES)
        assert r["allocated_gpu_hours"] == pytest.approx(held, rel=1e-6)


def test_job_rows_name_their_straggler_or_null(db: str) -> None:
    rows = json.loads(report(db, "--by", "job", "--format", "json"))
    for r in rows:
        assert {"straggler_pod", "straggler_rank", "straggler_node", "straggler_gpu"} <= set(r)
        if r["straggler_wait_gpu_hours"] > 0 and r["team"] != PLATFORM_TEAM:
            assert r["straggler_pod"] is not None
        else:
            assert r["straggler_pod"] is None


def test_csv_matches_json(db: str) -> None:
    rows = json.loads(report(db, "--format", "json"))
    table = list(csv.DictReader(io.StringIO(report(db, "--format", "csv"))))
    assert [r["team"] for r in table] == [r["team"] for r in rows]
    for a, b in zip(table, rows, strict=True):
        assert float(a["busy_gpu_hours"]) == pytest.approx(b["busy_gpu_hours"], abs=1e-6)


def test_team_filter_and_unknown_team(db: str) -> None:
    rows = json.loads(report(db, "--by", "job", "--team", "nlp", "--format", "json"))
    assert rows
    assert {r["team"] for r in rows} == {"nlp"}
    result = runner.invoke(app, ["--db", db, "report", "--team", "nobody"])
    assert result.exit_code == 2
    assert "nobody" in result.output


def test_prometheus_exposition(db: str, tmp_path: Path) -> None:
    out = tmp_path / "auditor.prom"
    report(db, "--format", "prometheus", "--out", str(out))
    text = out.read_text()
    assert "# TYPE gpu_waste_hours gauge" in text
    assert 'gpu_waste_hours{category="busy",team="nlp"}' in text
    assert "gpu_waste_window_end_timestamp_seconds" in text


def test_finance_export_reconciles_with_the_report_of_the_week(tmp_path: Path, db: str) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text('currency = "EUR"\n[prices]\ndefault = 3.0\n[cost_centres]\nnlp = "CC-7"\n')
    week = ["--start", "2026-11-23T00:00:00Z", "--end", "2026-11-30T00:00:00Z"]
    not_yet = runner.invoke(app, ["--db", db, "export", "finance", "--week", "2026-W48"])
    assert not_yet.exit_code == 2
    assert "not fully audited" in not_yet.output
    assert runner.invoke(app, ["--db", db, "audit", *week]).exit_code == 0
    out = tmp_path / "finance-{week}.csv"
    args = ["--db", db, "--config", str(config), "export", "finance", "--week", "2026-W48"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = tmp_path / "finance-2026-W48.csv"
    first = written.read_bytes()
    rows = list(csv.DictReader(io.StringIO(first.decode())))
    totals = json.loads(report(db, *week, "--format", "json"))
    for cat in CATEGORIES:
        col = f"{cat.value}_gpu_hours"
        exported = sum(float(r[col]) for r in rows)
        assert exported == pytest.approx(sum(t[col] for t in totals), abs=1e-4)
    capacity = sum(t[f"{c.value}_gpu_hours"] for t in totals for c in CATEGORIES)
    assert sum(float(r["allocated_cost"]) for r in rows) == pytest.approx(capacity * 3.0, abs=0.01)
    assert {r["cost_centre"] for r in rows if r["team"] == "nlp"} == {"CC-7"}
    assert rows[-1]["team"] == PLATFORM_TEAM
    # re-exporting the week gives the same bytes
    assert runner.invoke(app, [*args, "--out", str(out)]).exit_code == 0
    assert written.read_bytes() == first
