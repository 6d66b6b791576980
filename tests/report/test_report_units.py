"""A short window reads in GPU-minutes, not a table of 0.0; JSON stays exact in GPU-hours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_store import pod as cli_import_pod
from typer.testing import CliRunner

from auditor.cli import app
from auditor.report.render import _num, table_unit

runner = CliRunner()


def test_small_figures_are_never_printed_as_zero() -> None:
    assert _num(0.0) == "0.0"
    assert _num(0.04) == "<0.1"
    assert _num(0.05) == "0.1"
    assert _num(1234.56) == "1,234.6"
    assert table_unit(9.99) == ("GPU-minutes", 60.0)
    assert table_unit(10.0) == ("GPU-hours", 1.0)


@pytest.fixture
def ten_minutes(tmp_path: Path) -> str:
    """Two cards sampled every 5 s for 10 minutes; one pod holds card 0 throughout."""
    db = f"sqlite:///{tmp_path / 'auditor.db'}"
    lines = ["timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]"]
    for i in range(120):
        minute, second = divmod(5 * i, 60)
        for gpu in (0, 1):
            util = 60 if gpu == 0 else 0
            lines.append(
                f"2026/11/23 08:{minute:02d}:{second:02d}.000, {gpu}, GPU-{gpu}, {util} %, 1 MiB"
            )
    csv = tmp_path / "node-a.csv"
    csv.write_text("\n".join(lines) + "\n")
    pod = cli_import_pod("u1")  # ns ml, team nlp, on node-a, running since before 08:00
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(pod))
    for args in (
        ["import", "nvidia-smi", str(csv), "--node", "node-a"],
        ["import", "pods", str(pods)],
        ["audit", "--start", "2026-11-23T08:00:00", "--end", "2026-11-23T08:10:00"],
    ):
        result = runner.invoke(app, ["--db", db, *args])
        assert result.exit_code == 0, result.output
    return db


def test_a_ten_minute_window_is_reported_in_gpu_minutes(ten_minutes: str) -> None:
    table = runner.invoke(app, ["--db", ten_minutes, "report", "--by", "team"]).output
    assert "20.0 GPU-minutes of capacity, 10.0 held by pods" in table
    assert "GPU-minutes by team" in table
    nlp = next(line for line in table.splitlines() if "nlp" in line)
    assert "10.0" in nlp  # held
    assert "6.0" in nlp  # busy: 60 % of 10 minutes

    rows = json.loads(
        runner.invoke(app, ["--db", ten_minutes, "report", "--format", "json"]).output
    )
    team = next(r for r in rows if r["team"] == "nlp")
    assert team["allocated_gpu_hours"] == pytest.approx(10 / 60, abs=1e-6)
    assert team["busy_gpu_hours"] == pytest.approx(6 / 60, abs=1e-6)
