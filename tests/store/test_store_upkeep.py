"""Keeping a store and what it writes in shape: a report written to a full disk is a fault
of the machine (exit 3, as docs/faults.md says); a rollup never grows the store; a file
imported twice at different offsets is said, and an import can be forgotten."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from smalldisk import tmpfs
from test_store_concurrency import WINDOW, seed
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.common import iso
from auditor.settings import Thresholds

runner = CliRunner()


def fill(path: Path) -> None:
    """Write zeros to `path` until its filesystem is full."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def test_a_report_to_a_full_disk_is_a_fault_of_the_machine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    seed(url)
    jobs.audit(url, window=WINDOW, thresholds=Thresholds())
    with tmpfs(tmp_path / "small", "64k") as disk:
        fill(disk / "filler")
        out = disk / "report.json"
        window = ["--start", iso(WINDOW[0]), "--end", iso(WINDOW[1])]
        result = runner.invoke(
            app, ["--db", url, "report", *window, "--format", "json", "--out", str(out)]
        )
        assert result.exit_code == 3, result.output
        line = result.output.strip()
        assert line.startswith("auditor: error: ")
        assert "No space left on device" in line
        assert str(out) in line
        assert not out.exists()
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no temporary left


def _sampled(url: str, period_s: int, *, cards: int = 4, hours: int = 6) -> None:
    """`cards` cards sampled every `period_s` from half a minute past a round hour."""
    from auditor.model import GpuRecord, GpuSample
    from auditor.store import migrate, writes

    migrate.upgrade(url)
    engine = jobs.open_store(url)
    gpus = [GpuRecord(uuid=f"GPU-{i}", node="n1", index=i) for i in range(cards)]
    t0 = WINDOW[0] + 30_000
    n = hours * 3600 // period_s
    with engine.begin() as conn:
        ids = writes.upsert_gpus(conn, gpus)
        writes.insert_samples(
            conn,
            [
                GpuSample(g.uuid, t0 + period_s * 1000 * k, util=k * 7.3 % 100, power_w=301.5)
                for g in gpus
                for k in range(n)
            ],
            ids,
        )
    engine.dispose()


def _footprint(url: str) -> tuple[int, int, int | None]:
    """Raw rows, minute rows, and on SQLite the bytes the tables take once vacuumed."""
    from auditor.store.connection import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        raw = int(conn.exec_driver_sql("SELECT count(*) FROM gpu_samples").scalar_one())
        minutes = int(conn.exec_driver_sql("SELECT count(*) FROM gpu_samples_1m").scalar_one())
        used = None
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("VACUUM")
            used = int(
                conn.exec_driver_sql(
                    "SELECT (SELECT page_count FROM pragma_page_count())"
                    " - (SELECT freelist_count FROM pragma_freelist_count())"
                ).scalar_one()
            )
    engine.dispose()
    return raw, minutes, used


@pytest.mark.parametrize("period_s", [60, 30])
def test_a_rollup_of_data_a_minute_apart_never_grows_the_store(db_url: str, period_s: int) -> None:
    _sampled(db_url, period_s)
    raw, minutes, pages = _footprint(db_url)
    later = WINDOW[0] + 30 * 86_400_000
    stats = jobs.rollup(db_url, older_than_days=1, thresholds=Thresholds(), now_ms=later)
    after = _footprint(db_url)
    assert stats.minutes_written == 0
    assert after[0] + after[1] <= raw + minutes
    if pages is not None:
        assert after[2] is not None
        assert after[2] <= pages


def test_a_rollup_of_dense_data_still_shrinks_it(db_url: str) -> None:
    _sampled(db_url, 10)
    raw, _, pages = _footprint(db_url)
    later = WINDOW[0] + 30 * 86_400_000
    stats = jobs.rollup(db_url, older_than_days=1, thresholds=Thresholds(), now_ms=later)
    after = _footprint(db_url)
    assert stats.raw_deleted == raw
    assert after[0] == 0
    assert after[1] < raw / 5
    if pages is not None:
        assert after[2] is not None
        assert after[2] < pages * 0.75
