"""Kernel time is `busy` whoever ran it: nvidia-smi logs imported without (all) their pods.

A fleet whose pods were not imported, or whose snapshot missed some, is not free capacity:
the kernel time of a card no known pod held is `busy` of no pod (the platform's row), only
its idle rest `unallocated`; the report says that kernels ran on cards no pod held, and
which nodes had no pod at all. Through the CLI, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_store import pod as cli_import_pod
from sqlalchemy import Engine
from typer.testing import CliRunner

from auditor.cli import app

runner = CliRunner()
WINDOW = ["--start", "2026-11-23T08:00:00", "--end", "2026-11-23T08:10:00"]


@pytest.fixture
def db(db_url: str, engine: Engine) -> str:
    """A migrated store (SQLite, then PostgreSQL)."""
    return db_url


def cli(db: str, *args: str) -> str:
    result = runner.invoke(app, ["--db", db, *args])
    assert result.exit_code == 0, result.output
    return result.output


def two_nodes(tmp_path: Path, db: str) -> None:
    """Two nodes of two cards, each card 60 % busy, sampled every 5 s for 10 minutes."""
    for node in ("node-a", "node-b"):
        lines = ["timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]"]
        for i in range(120):
            minute, second = divmod(5 * i, 60)
            for gpu in (0, 1):
                stamp = f"2026/11/23 08:{minute:02d}:{second:02d}.000"
                lines.append(f"{stamp}, {gpu}, GPU-{node}-{gpu}, 60 %, 900 MiB")
        csv = tmp_path / f"{node}.csv"
        csv.write_text("\n".join(lines) + "\n")
        cli(db, "import", "nvidia-smi", str(csv), "--node", node)


def platform(db: str) -> dict[str, float]:
    rows = json.loads(cli(db, "report", "--by", "team", "--format", "json"))
    (row,) = [r for r in rows if r["team"] == "(platform)"]
    return row


def test_without_pods_the_kernel_time_is_busy_of_the_platform(tmp_path: Path, db: str) -> None:
    two_nodes(tmp_path, db)
    audited = cli(db, "audit", *WINDOW)
    assert "no pod held any of these cards in the window: were the pods imported" in audited

    row = platform(db)
    # 4 cards x 10 min: 60 % of it busy, 40 % free capacity
    assert row["busy_gpu_hours"] == pytest.approx(4 * 10 / 60 * 0.6, abs=1e-6)
    assert row["unallocated_gpu_hours"] == pytest.approx(4 * 10 / 60 * 0.4, abs=1e-6)
    table = cli(db, "report")
    assert "No pod held any card in this window: were the pods imported" in table
    assert "Kernels ran on cards no known pod held: 24.0 GPU-minutes of busy time" in table


def test_a_node_whose_pods_are_missing_is_named(tmp_path: Path, db: str) -> None:
    two_nodes(tmp_path, db)
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(cli_import_pod("u1")))  # one card of node-a, team nlp
    cli(db, "import", "pods", str(pods))
    cli(db, "audit", *WINDOW)

    row = platform(db)
    assert row["busy_gpu_hours"] == pytest.approx(3 * 10 / 60 * 0.6, abs=1e-6)
    table = cli(db, "report")
    assert "No pod held a card on 1 of 2 nodes (node-b): were their pods imported?" in table
    assert "Kernels ran on cards no known pod held: 18.0 GPU-minutes" in table
    # the held share is of held time only: the team's own card, 60 % busy
    assert "Of held time: busy 60%" in table
    nlp = next(r for r in json.loads(cli(db, "report", "--format", "json"))
               if r["team"] == "nlp")  # fmt: skip
    assert nlp["busy_share"] == pytest.approx(0.6)


def test_by_gpu_shows_each_cards_own_utilisation(tmp_path: Path, db: str) -> None:
    """One card has no spread of holders' utilisation: `--by gpu` shows the card's own."""
    two_nodes(tmp_path, db)
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(cli_import_pod("u1")))
    cli(db, "import", "pods", str(pods))
    cli(db, "audit", *WINDOW)
    rows = json.loads(cli(db, "report", "--by", "gpu", "--format", "json"))
    held = [r for r in rows if r["allocated_gpu_hours"] > 0]
    assert [r["util_pct"] for r in held] == [pytest.approx(60.0)]
    assert all(r["util_p10"] is None and r["util_p90"] is None for r in rows)
    table = cli(db, "report", "--by", "gpu")
    assert "p10/50/90" not in table
