"""Migrations on SQLite and a real PostgreSQL: round trip, no drift, version checks."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from auditor.errors import InputError, StoreError
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.schema import metadata

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_TABLES = set(metadata.tables)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade_round_trip(engine: Engine) -> None:
    assert tables(engine) == set()

    migrate.upgrade(engine)
    assert tables(engine) == SCHEMA_TABLES
    assert migrate.current(engine) == migrate.head()

    migrate.downgrade(engine, "base")
    assert tables(engine) == set()
    assert migrate.current(engine) is None

    migrate.upgrade(engine, "head")
    assert tables(engine) == SCHEMA_TABLES
    assert migrate.current(engine) == migrate.head()


def test_migrated_database_matches_the_schema(engine: Engine) -> None:
    migrate.upgrade(engine)

    assert migrate.check_drift(engine) == []


def test_drift_check_sees_a_missing_index(engine: Engine) -> None:
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_pods_node_bound"))

    drift = migrate.check_drift(engine)

    assert len(drift) == 1
    assert "ix_pods_node_bound" in drift[0]


def test_constraint_names_follow_the_naming_convention(engine: Engine) -> None:
    migrate.upgrade(engine)
    insp = inspect(engine)

    assert {fk["name"] for fk in insp.get_foreign_keys("gpu_assignments")} == {
        "fk_gpu_assignments_pod_uid_pods",
        "fk_gpu_assignments_gpu_id_gpus",
    }
    assert [uq["name"] for uq in insp.get_unique_constraints("gpus")] == ["uq_gpus_uuid"]


def test_upgrade_takes_a_url_and_creates_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"

    migrate.upgrade(url)

    assert migrate.current(url) == migrate.head()
    migrate.ensure_current(url)


def test_ensure_current_refuses_an_empty_database(engine: Engine) -> None:
    with pytest.raises(StoreError, match=r"auditor db upgrade") as raised:
        migrate.ensure_current(engine)

    assert migrate.head() in str(raised.value)
    assert raised.value.exit_code == 3


def test_ensure_current_accepts_a_migrated_database(engine: Engine) -> None:
    migrate.upgrade(engine)

    migrate.ensure_current(engine)


def test_ensure_current_refuses_a_database_from_a_newer_auditor(engine: Engine) -> None:
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))

    with pytest.raises(StoreError, match=r"newer than this auditor"):
        migrate.ensure_current(engine)


def test_the_alembic_command_line_runs_the_same_scripts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    ini = ROOT / "migrations" / "alembic.ini"
    alembic = Path(sys.executable).parent / "alembic"

    done = subprocess.run(
        [str(alembic), "-c", str(ini), "-x", f"url={url}", "upgrade", "head"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert migrate.current(url) == migrate.head()


def test_the_wheel_ships_every_migration_file() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["auditor"]
    package = ROOT / "auditor"
    files = [
        p.relative_to(package)
        for p in (package / "migrations").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]

    assert files
    unshipped = [str(f) for f in files if not any(f.match(g) for g in globs)]
    assert unshipped == []


def test_concurrent_upgrades_in_one_process_take_turns(db_url: str) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(migrate.upgrade, db_url) for _ in range(4)]:
            future.result()

    assert migrate.current(db_url) == migrate.head()


def test_concurrent_upgrades_from_many_processes_take_turns(db_url: str) -> None:
    """The pods of a sharded audit may all run `auditor db upgrade` at the same moment."""
    script = "import sys; from auditor.store import migrate; migrate.upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, db_url],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    failures = []
    for proc in procs:
        _out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            failures.append(err)

    assert not failures, "\n".join(failures)
    assert migrate.current(db_url) == migrate.head()
    assert migrate.check_drift(db_url) == []


def test_a_fresh_sqlite_file_is_created_as_the_migrations_make_it(tmp_path: Path) -> None:
    """`open_store` creates a new SQLite file from the schema and stamps head: the same
    tables, columns, indexes and revision as running every migration."""
    import sqlite3

    from auditor.jobs import open_store

    migrated, created = tmp_path / "migrated.db", tmp_path / "created.db"
    migrate.upgrade(f"sqlite:///{migrated}")
    open_store(f"sqlite:///{created}").dispose()

    def shape(path: Path) -> list[tuple[str, str, object]]:
        with sqlite3.connect(path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            out: list[tuple[str, str, object]] = []
            for table in sorted(tables):
                out += [
                    (table, "column", tuple(c)) for c in db.execute(f"PRAGMA table_info('{table}')")
                ]
                for index in db.execute(f"PRAGMA index_list('{table}')"):
                    cols = tuple(c[2] for c in db.execute(f"PRAGMA index_info('{index[1]}')"))
                    out.append((table, f"index {index[1]} unique={index[2]}", cols))
                for fk in db.execute(f"PRAGMA foreign_key_list('{table}')"):
                    out.append((table, "foreign key", tuple(fk[2:5]) + tuple(fk[5:7])))
                wr = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
                out.append((table, "without rowid", "WITHOUT ROWID" in wr[0].upper()))
            return sorted(out, key=repr)  # indexes in any order; columns keep their cid

    assert shape(created) == shape(migrated)
    assert migrate.current(f"sqlite:///{created}") == migrate.head()
    assert migrate.check_drift(f"sqlite:///{created}") == []


def test_db_current_and_upgrade_report_the_revision_before_and_after(
    db_url: str, tmp_path: Path
) -> None:
    """`db current` says an empty database is empty and what the auditor needs; `db upgrade`
    brings it there and says so; a database that cannot be opened is one line, no traceback."""
    from typer.testing import CliRunner

    from auditor.cli import app

    runner = CliRunner()
    head = migrate.head()

    before = runner.invoke(app, ["--db", db_url, "db", "current"])
    upgraded = runner.invoke(app, ["--db", db_url, "db", "upgrade"])
    after = runner.invoke(app, ["--db", db_url, "db", "current"])

    assert (before.exit_code, before.output.splitlines()) == (
        0,
        ["current: (empty)", f"head:    {head}"],
    )
    assert (upgraded.exit_code, upgraded.output) == (0, f"database at revision {head}\n")
    assert after.output.splitlines() == [f"current: {head}", f"head:    {head}"]

    missing = f"sqlite:///{tmp_path / 'no-such-dir' / 'auditor.db'}"
    for command in (["db", "current"], ["db", "upgrade"]):
        failed = runner.invoke(app, ["--db", missing, *command])
        assert failed.exit_code != 0
        assert isinstance(failed.exception, SystemExit), failed.exception
        lines = failed.output.strip().splitlines()
        assert len(lines) == 1, failed.output
        assert lines[0].startswith("auditor: error: "), failed.output


def test_0010_tags_new_samples_and_leaves_older_ones_untagged_both_ways(engine: Engine) -> None:
    """Up: samples stored before keep their values and read `import_id` NULL, the ledger
    starts empty; down: the column and the ledger go, the samples stay; on SQLite the table
    stays clustered on its key (`WITHOUT ROWID`, 0004) either way."""
    row = "INSERT INTO gpu_samples (gpu_id, ts_ms, util) VALUES (1, 1000, 50.0)"

    def clustered() -> bool:
        if engine.dialect.name != "sqlite":
            return True
        with engine.connect() as conn:
            sql = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE name = 'gpu_samples'")
            ).scalar_one()
        return "WITHOUT ROWID" in sql.upper()

    migrate.upgrade(engine, "0009")
    with engine.begin() as conn:
        conn.execute(text(row))
    migrate.upgrade(engine, "0010")
    assert "imports" in tables(engine)
    assert clustered()
    with engine.begin() as conn:
        assert conn.execute(text("SELECT util, import_id FROM gpu_samples")).all() == [(50.0, None)]
        conn.execute(
            text(
                "INSERT INTO gpu_samples (gpu_id, ts_ms, util, import_id) VALUES (1, 2000, 60.0, 7)"
            )
        )
    migrate.downgrade(engine, "0009")
    assert "imports" not in tables(engine)
    assert clustered()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT ts_ms, util FROM gpu_samples ORDER BY ts_ms")).all() == [
            (1000, 50.0),
            (2000, 60.0),
        ]
        columns = {c["name"] for c in inspect(conn).get_columns("gpu_samples")}
    assert "import_id" not in columns


def test_results_stored_before_0011_stay_one_bucket_of_their_run(engine: Engine) -> None:
    """Migration 0011 (SPEC §11): rows of a run stored before results were kept per hour get
    the run's start as their bucket, so a read of the whole run is what it was, and a
    window cutting the run asks for it to be audited again. Downgrading sums each run's
    hours back into one row per key."""
    from auditor.jobs.reports import covering_runs
    from auditor.store import reads
    from auditor.store.signals import read_causes
    from auditor.store.work_done import read_sm

    day, hour = 86_400_000, 3_600_000
    start = 1_795_392_000_000
    migrate.upgrade(engine, "0009")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO gpus (id, uuid, node) VALUES (1, 'GPU-old', 'n1')"))
        conn.execute(
            text(
                "INSERT INTO audit_runs (id, window_start_ms, window_end_ms, shard, created_ms,"
                " thresholds, version) VALUES (1, :a, :b, 'all', :b, '{}', '0.1')"
            ),
            {"a": start, "b": start + day},
        )
        conn.execute(
            text(
                "INSERT INTO audit_results (run_id, gpu_id, pod_uid, category, seconds,"
                " inferred) VALUES (1, 1, NULL, 'unallocated', 50000.0, false),"
                " (1, 1, NULL, 'busy', 36400.0, false)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO audit_causes (run_id, gpu_id, pod_uid, category, cause, seconds,"
                " signalled_seconds) VALUES (1, 1, NULL, 'unallocated', 'no_demand', 50000.0,"
                " 0.0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO audit_sm (run_id, gpu_id, pod_uid, sm_active_seconds,"
                " sm_busy_seconds) VALUES (1, 1, NULL, 10.0, 20.0)"
            )
        )
    migrate.upgrade(engine)
    assert migrate.check_drift(engine) == []
    with engine.connect() as conn:
        hours = {
            t: {int(h) for (h,) in conn.execute(text(f"SELECT hour_ms FROM {t}"))}
            for t in ("audit_results", "audit_causes", "audit_sm")
        }
        runs = reads.runs_in_window(conn, start_ms=start, end_ms=start + day)
        assert not bool(runs["hourly"].iloc[0])
        parts = covering_runs(runs, start_ms=start, end_ms=start + day, what="the window")
        results = reads.read_results(conn, parts)
        assert read_causes(conn, parts)["seconds"].sum() == 50000.0
        assert read_sm(conn, parts)["sm_busy_seconds"].sum() == 20.0
        with pytest.raises(InputError, match="stored before results were kept per hour"):
            covering_runs(runs, start_ms=start + hour, end_ms=start + 2 * hour, what="it")
    assert hours == {t: {start} for t in hours}
    assert sorted(results["seconds"]) == [36400.0, 50000.0]

    # a run stored per hour, summed back into one row per key on the way down
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audit_results (run_id, gpu_id, pod_uid, category, seconds,"
                " inferred, estimated, hour_ms) VALUES (1, 1, NULL, 'busy', 100.0, false,"
                " false, :h)"
            ),
            {"h": start + hour},
        )
    migrate.downgrade(engine, "0009")
    with engine.connect() as conn:
        busy = conn.execute(text("SELECT seconds FROM audit_results WHERE category = 'busy'")).all()
    assert [float(s) for (s,) in busy] == [36500.0]
    migrate.upgrade(engine)


@pytest.mark.parametrize("revision", ["0003", "0005", "0006"])
def test_downgrades_that_rebuild_a_table_keep_the_stored_results(
    engine: Engine, revision: str
) -> None:
    """These downgrades drop a column of `audit_runs` or `gpus`; done on SQLite as a copy of
    the table, the drop of the old one cascaded (foreign keys on) to every stored result."""
    migrate.upgrade(engine, revision)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO gpus (id, uuid, node) VALUES (1, 'GPU-a', 'n1')"))
        conn.execute(
            text(
                "INSERT INTO audit_runs (id, window_start_ms, window_end_ms, shard, created_ms,"
                " thresholds, version) VALUES (1, 0, 3600000, 'all', 1, '{}', '0.1')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO audit_results (run_id, gpu_id, pod_uid, category, seconds,"
                " inferred) VALUES (1, 1, NULL, 'busy', 3600.0, false)"
            )
        )
    migrate.downgrade(engine, f"{int(revision) - 1:04d}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT run_id, seconds FROM audit_results")).all() == [
            (1, 3600.0)
        ]
        assert conn.execute(text("SELECT uuid FROM gpus")).all() == [("GPU-a",)]
    migrate.upgrade(engine)
    with engine.connect() as conn, pytest.raises(IntegrityError):  # foreign keys on again
        conn.execute(
            text(
                "INSERT INTO audit_results (run_id, gpu_id, category, seconds, inferred,"
                " hour_ms) VALUES (1, 99, 'busy', 1.0, false, 0)"
            )
        )
