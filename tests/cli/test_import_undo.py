"""Taking an import back (`auditor import list|undo`), on SQLite and PostgreSQL: exactly the
samples it wrote, the cards it added, the audit runs that counted them; all or nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_store import invoke, pod
from sqlalchemy import Engine, select

from auditor.store.schema import audit_runs, gpu_samples, gpus, imports


def log(path: Path, *, seconds: int = 20) -> Path:
    lines = ["timestamp, uuid, utilization.gpu [%], memory.used [MiB]"]
    for i in range(seconds // 2):
        for card in ("GPU-a", "GPU-b"):
            lines.append(f"2026/11/23 08:00:{i * 2:02d}.000, {card}, {(i * 37) % 100} %, 900 MiB")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def db(db_url: str, engine: Engine) -> str:
    return db_url


def samples(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(gpu_samples).order_by("gpu_id", "ts_ms"))]


def table(engine: Engine, t: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(t).order_by(t.c.id))]


def test_undo_of_a_reimport_with_another_zone_leaves_the_first_import_exactly(
    tmp_path: Path, db: str, engine: Engine
) -> None:
    path = log(tmp_path / "node-a.csv")
    code, out = invoke(db, "import", "nvidia-smi", str(path))
    assert (code, out.splitlines()[0].endswith(", import 1")) == (0, True), out
    after_a, cards_a = samples(engine), table(engine, gpus)
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--tz", "+02:00")
    assert code == 0, out
    assert "`auditor import undo 2` takes this one back" in out
    assert len(samples(engine)) == 2 * len(after_a)

    code, out = invoke(db, "import", "undo", "2")
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"took back import 2, nvidia-smi {path.absolute()}")
    assert "tz=UTC+02:00" in out
    assert f": {len(after_a)} samples" in out
    assert samples(engine) == after_a
    assert table(engine, gpus) == cards_a

    code, out = invoke(db, "import", "list")
    assert code == 0
    rows = [line.split("\t") for line in out.splitlines()]
    assert rows[0][:3] == ["id", "imported", "kind"]
    assert [r[0] for r in rows[1:]] == ["1", "2"]
    assert rows[1][2:5] == ["nvidia-smi", str(len(after_a)), "2"]
    assert rows[1][5] == "2026-11-23T08:00:00Z..2026-11-23T08:00:18Z"
    assert rows[1][6] == "node=node-a tz=UTC"
    assert rows[2][-1].startswith("(taken back ")

    code, out = invoke(db, "import", "undo", "2")
    assert (code, out.strip()) == (2, "auditor: error: field 'ID': import 2 was taken back already")


def test_undo_of_a_repeat_import_removes_nothing(tmp_path: Path, db: str, engine: Engine) -> None:
    path = log(tmp_path / "node-a.csv")
    assert invoke(db, "import", "nvidia-smi", str(path))[0] == 0
    before = samples(engine)
    code, out = invoke(db, "import", "nvidia-smi", str(path))
    assert code == 0
    assert f"({len(before)} already stored), import 2" in out
    code, out = invoke(db, "import", "undo", "2")
    assert code == 0, out
    assert ": 0 samples" in out
    assert samples(engine) == before
    # the samples still name the import that wrote them: it can be taken back
    assert {r[-1] for r in before} == {1}
    assert invoke(db, "import", "undo", "1")[0] == 0
    assert samples(engine) == []
    assert table(engine, gpus) == []


@pytest.mark.parametrize("given", ["7", "0", "-1"])
def test_undo_of_an_unknown_id_fails_in_one_line_and_changes_nothing(
    tmp_path: Path, db: str, engine: Engine, given: str
) -> None:
    assert invoke(db, "import", "nvidia-smi", str(log(tmp_path / "node-a.csv")))[0] == 0
    before = (samples(engine), table(engine, gpus), table(engine, imports))
    code, out = invoke(db, "import", "undo", "--", given)
    assert code == 2
    assert out.splitlines() == [
        f"auditor: error: field 'ID': no import {given} in this database "
        "(auditor import list shows them)"
    ]
    assert (samples(engine), table(engine, gpus), table(engine, imports)) == before


def test_undo_of_an_import_with_the_wrong_node_frees_its_cards_for_the_right_one(
    tmp_path: Path, db: str, engine: Engine
) -> None:
    path = log(tmp_path / "gpu.csv")
    assert invoke(db, "import", "nvidia-smi", str(path), "--node", "node-x")[0] == 0
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--node", "node-a")
    assert code == 2
    assert "already recorded on node 'node-x'" in out
    code, out = invoke(db, "import", "undo", "1")
    assert code == 0, out
    assert "and 2 cards it had added" in out
    assert table(engine, gpus) == []
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--node", "node-a")
    assert code == 0, out
    assert not out.splitlines()[0].endswith(", import 1")  # the id taken back is not reused
    with engine.connect() as conn:
        assert set(conn.execute(select(gpus.c.node)).scalars()) == {"node-a"}


def test_undo_names_and_deletes_the_audit_runs_that_counted_the_samples(
    tmp_path: Path, db: str, engine: Engine
) -> None:
    """A run made before the import never saw its samples and stays; one made after it
    counted them: deleted, its window named to audit again."""
    window = ["--start", "2026-11-23T08:00:00Z", "--end", "2026-11-23T09:00:00Z"]
    early = ["--start", "2026-11-23T07:00:00Z", "--end", "2026-11-23T08:00:10Z"]
    first = log(tmp_path / "node-a.csv")
    assert invoke(db, "import", "nvidia-smi", str(first))[0] == 0
    assert invoke(db, "audit", *early)[0] == 0
    second = tmp_path / "node-b.csv"
    second.write_text(first.read_text().replace("GPU-", "GPU-b-"))
    assert invoke(db, "import", "nvidia-smi", str(second), "--node", "node-b")[0] == 0
    assert invoke(db, "audit", *window)[0] == 0
    with engine.connect() as conn:
        runs = {r.window_start_ms: r.id for r in conn.execute(select(audit_runs))}
    assert len(runs) == 2
    code, out = invoke(db, "import", "undo", "2", "--dry-run")
    assert code == 0, out
    assert "nothing was changed (--dry-run)" in out
    assert len(table(engine, audit_runs)) == 2
    code, out = invoke(db, "import", "undo", "2")
    assert code == 0, out
    late = max(runs)
    assert f"audit runs {runs[late]} counted these samples and were deleted" in out
    assert "  auditor audit --start 2026-11-23T08:00:00Z --end 2026-11-23T09:00:00Z" in out
    assert [r[0] for r in table(engine, audit_runs)] == [runs[min(runs)]]


def test_undo_of_samples_rolled_up_already_is_refused_whole(
    tmp_path: Path, db: str, engine: Engine
) -> None:
    assert invoke(db, "import", "nvidia-smi", str(log(tmp_path / "node-a.csv")))[0] == 0
    assert invoke(db, "rollup", "--older-than", "0")[0] == 0
    before = (samples(engine), table(engine, gpus), table(engine, imports))
    code, out = invoke(db, "import", "undo", "1")
    assert code == 2
    assert len(out.splitlines()) == 1
    assert "import 1 wrote 20 samples and 0 of them are stored raw" in out
    assert "nothing was changed" in out
    assert (samples(engine), table(engine, gpus), table(engine, imports)) == before


def test_a_pods_import_is_listed_and_its_undo_refused(
    tmp_path: Path, db: str, engine: Engine
) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"kind": "List", "items": [pod("u1")]}))
    code, out = invoke(db, "import", "pods", str(pods))
    assert code == 0, out
    assert out.splitlines()[0].endswith(", import 1")
    assert invoke(db, "import", "list")[1].splitlines()[1].split("\t")[2:4] == ["pods", "1"]
    code, out = invoke(db, "import", "undo", "1")
    assert code == 2
    assert out.splitlines() == [
        "auditor: error: field 'ID': import 1 is a pods import: its records were merged with "
        "what other sources said, so it cannot be taken back exactly; nothing was changed "
        "(only nvidia-smi and prometheus imports can)"
    ]
