"""A GPU UUID is one physical card: no write moves it to another node or changes its model.

What users rely on: an import naming a stored card under another node (a wrong `--node`),
or as another model, is refused with one line naming the file, the line, the card and both
values, and leaves the database as it was; a file in which one card shows two models or two
indexes is refused at the line of the second; unknown fields are still filled in. The
sampler skips (warns once, counts) a conflicting card and goes on with the others.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from cli_store import GOOD_CSV, counts, invoke
from fake_nvml.build import fake_nvml_library
from sqlalchemy import Engine, select
from test_sampler import Rig, script, store, stored

from auditor.model import GpuConflict, GpuRecord
from auditor.store.schema import gpus
from auditor.store.writes import gpu_conflicts, upsert_gpus

__all__ = ["fake_nvml_library", "script", "store"]

HEADER = GOOD_CSV.splitlines(keepends=True)[0]
ROW = "2026/11/23 08:00:{s:02d}.000, {i}, GPU-{u}, {name}, 50 %, 1 MiB, 81559 MiB\n"
H100 = "NVIDIA H100 80GB HBM3"


def rows(*cards: tuple[int, str, str], start_s: int = 0) -> str:
    """One data line per (index, uuid suffix, name), 5 s apart."""
    return "".join(
        ROW.format(s=start_s + 5 * n, i=i, u=u, name=name) for n, (i, u, name) in enumerate(cards)
    )


@pytest.fixture
def db(db_url: str) -> str:
    code, out = invoke(db_url, "db", "upgrade")
    assert code == 0, out
    return db_url


def stored_gpus(db: str) -> dict[str, tuple[str, int | None, str | None]]:
    from auditor.store.connection import make_engine

    engine = make_engine(db)
    with engine.connect() as conn:
        got = {
            u: (n, i, m)
            for u, n, i, m in conn.execute(
                select(gpus.c.uuid, gpus.c.node, gpus.c.gpu_index, gpus.c.model)
            )
        }
    engine.dispose()
    return got


def test_a_stored_card_under_another_node_is_refused_and_nothing_moves(
    db: str, tmp_path: Path
) -> None:
    (tmp_path / "a.csv").write_text(GOOD_CSV)
    assert invoke(db, "import", "nvidia-smi", str(tmp_path / "a.csv"), "--node", "node-a")[0] == 0
    before, cards = counts(db), stored_gpus(db)
    # the same log with another card first, imported under the wrong node
    wrong = tmp_path / "b.csv"
    wrong.write_text(HEADER + rows((2, "cccc", H100), (0, "aaaa", H100), start_s=20))
    code, out = invoke(db, "import", "nvidia-smi", str(wrong), "--node", "node-b")
    assert code == 2
    message = out.strip()
    assert "\n" not in message
    assert "Traceback" not in out
    assert message.startswith(f"auditor: error: {wrong}:3: GPU GPU-aaaa ")
    assert "'node-a'" in message
    assert "'node-b'" in message
    assert "--node" in message
    assert counts(db) == before  # GPU-cccc and every sample of the file rolled back
    assert stored_gpus(db) == cards


def test_a_stored_card_with_another_model_is_refused(db: str, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(GOOD_CSV)
    assert invoke(db, "import", "nvidia-smi", str(tmp_path / "a.csv"), "--node", "node-a")[0] == 0
    before = counts(db)
    other = tmp_path / "later.csv"
    other.write_text(HEADER + rows((1, "bbbb", H100), (0, "aaaa", "NVIDIA A100-SXM4-40GB")))
    code, out = invoke(db, "import", "nvidia-smi", str(other), "--node", "node-a")
    assert code == 2
    assert out.startswith(f"auditor: error: {other}:3: GPU GPU-aaaa ")
    assert f"{H100!r}" in out
    assert "'NVIDIA A100-SXM4-40GB'" in out
    assert counts(db) == before


def test_unknown_fields_are_still_filled_in(db: str, tmp_path: Path) -> None:
    bare = tmp_path / "bare.csv"  # no uuid, no name: the card is node-a/0, model unknown
    bare.write_text("2026/11/23 08:00:00.000, 0, 10 %, 1 MiB\n")
    assert invoke(db, "import", "nvidia-smi", str(bare), "--node", "node-a")[0] == 0
    named = tmp_path / "named.csv"
    named.write_text(
        "timestamp, index, name, utilization.gpu [%], memory.used [MiB]\n"
        f"2026/11/23 08:00:05.000, 0, {H100}, 20 %, 1 MiB\n"
    )
    code, out = invoke(db, "import", "nvidia-smi", str(named), "--node", "node-a")
    assert code == 0, out
    assert stored_gpus(db) == {"node-a/0": ("node-a", 0, H100)}
    assert counts(db)["gpu_samples"] == 2


@pytest.mark.parametrize(
    ("second", "field", "says"),
    [
        ((1, "aaaa", H100), "index", "index 1 here, index 0 on line 2"),
        (
            (0, "aaaa", "NVIDIA A100"),
            "name",
            "'NVIDIA A100' here, 'NVIDIA H100 80GB HBM3' on line 2",
        ),
    ],
)
def test_one_card_with_two_indexes_or_models_in_one_file_is_refused_at_the_second(
    db: str, tmp_path: Path, second: tuple[int, str, str], field: str, says: str
) -> None:
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(HEADER + rows((0, "aaaa", H100), (1, "bbbb", H100), second))
    code, out = invoke(db, "import", "nvidia-smi", str(mixed), "--node", "node-a")
    assert code == 2
    assert out.strip().startswith(f"auditor: error: {mixed}:4: field {field!r}: ")
    assert "GPU GPU-aaaa" in out
    assert says in out
    assert counts(db)["gpus"] == 0


def test_the_store_check_sees_conflicts_within_one_write_and_against_the_store(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0, None)])
    with engine.begin() as conn:
        found = gpu_conflicts(
            conn,
            [
                GpuRecord("GPU-a", "n1", 0, "H100"),  # fills in the unknown model: fine
                GpuRecord("GPU-b", "n1", 1, "H100"),
                GpuRecord("GPU-b", "n2", 1, "H100"),  # the same write says another node
                GpuRecord("GPU-c", "n1", 2, None),
                GpuRecord("GPU-c", "n1", 2, "A100"),
                GpuRecord("GPU-c", "n1", 2, "H100"),  # a second known model
            ],
        )
        assert found == [
            GpuConflict("GPU-b", "node", "n1", "n2"),
            GpuConflict("GPU-c", "model", "A100", "H100"),
        ]
        assert gpu_conflicts(conn, [GpuRecord("GPU-a", "n2", 0, None)]) == [
            GpuConflict("GPU-a", "node", "n1", "n2")
        ]
        # a model unknown, then learned, within one write: no conflict
        assert (
            gpu_conflicts(
                conn, [GpuRecord("GPU-a", "n1", 0, None), GpuRecord("GPU-a", "n1", 0, "A100")]
            )
            == []
        )


def test_the_sampler_skips_a_conflicting_card_and_keeps_the_others(
    store: str, script: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from auditor.jobs import open_store

    with open_store(store).begin() as conn:  # GPU-aaaa was imported under another node
        upsert_gpus(conn, [GpuRecord("GPU-aaaa", "node-z", 0, "NVIDIA H100")])
    rig = Rig(store, tmp=tmp_path, socket=None)
    with caplog.at_level(logging.WARNING, logger="auditor.agents.sample.sampler"):
        rig.passes(3)
        assert rig.sampler.flush()
        rig.passes(2)
        assert rig.sampler.flush()
    assert {uuid for uuid, _, _ in stored(store)} == {"GPU-bbbb"}
    assert len(stored(store)) == 5
    assert len(rig.buffer) == 0  # skipped, not kept for ever
    assert rig.metric("gpu_conflict_samples_total") == 5
    assert rig.metric("conflicting_gpus") == 1
    warned = [r.getMessage() for r in caplog.records if "GPU-aaaa" in r.getMessage()]
    assert len(warned) == 1
    assert "'node-z'" in warned[0]
    assert "'node-a'" in warned[0]
    assert stored_gpus(store)["GPU-aaaa"] == ("node-z", 0, "NVIDIA H100")
