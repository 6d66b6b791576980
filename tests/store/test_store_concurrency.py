"""Several auditors on one store at once, and a store the auditor may only read.

- N audits of one window started together (threads through the jobs API, and processes
  through the CLI) all succeed, each with a run id of its own; the store keeps exactly one
  run of the window, the last one's. On SQLite and a real PostgreSQL.
- A report and a finance export read a SQLite file in a read-only directory, as a user who
  really cannot write there (tests run as root, who can write anything: the reader runs in
  a subprocess as `nobody`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from auditor import jobs
from auditor.model import GpuRecord, GpuSample
from auditor.settings import Thresholds
from auditor.store import migrate, reads, writes
from auditor.store.connection import make_engine

H = 3_600_000
T0 = 1_795_000_000_000 // H * H  # a round hour in November 2026
WINDOW = (T0, T0 + H)
N = 4


def seed(url: str) -> None:
    """Two cards of one node, sampled every 10 s for an hour."""
    migrate.upgrade(url)
    engine = jobs.open_store(url)
    cards = [GpuRecord(uuid=f"GPU-{i}", node="n1", index=i, model="NVIDIA H100") for i in (0, 1)]
    with engine.begin() as conn:
        ids = writes.upsert_gpus(conn, cards)
        writes.insert_samples(
            conn,
            [
                GpuSample(c.uuid, T0 + 10_000 * k, util=float(k % 100), memory_used_mib=1.0)
                for c in cards
                for k in range(360)
            ],
            ids,
        )
    engine.dispose()


def runs_of_window(url: str) -> list[int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=None, end_ms=None)
    engine.dispose()
    return [int(i) for i in runs["id"]]


@pytest.mark.parametrize("stored_before", [False, True], ids=["first-run", "replacing"])
def test_audits_of_one_window_at_once_each_get_their_own_run(
    db_url: str, monkeypatch: pytest.MonkeyPatch, stored_before: bool
) -> None:
    seed(db_url)
    if stored_before:  # a run they all replace
        jobs.audit(db_url, window=WINDOW, thresholds=Thresholds())
    # every audit reaches its write at the same moment: the worst interleaving
    barrier = threading.Barrier(N, timeout=60)
    real = writes.replace_audit_run

    def together(*args: Any, **kwargs: Any) -> int:
        barrier.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(writes, "replace_audit_run", together)
    got: list[int] = []
    failed: list[BaseException] = []

    def one() -> None:
        try:
            got.append(jobs.audit(db_url, window=WINDOW, thresholds=Thresholds()).run_id)
        except BaseException as e:  # reported below
            failed.append(e)

    threads = [threading.Thread(target=one) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == []
    assert len(got) == N
    assert len(set(got)) == N, got
    assert runs_of_window(db_url) == [max(got)]


def test_audits_started_together_through_the_cli(db_url: str) -> None:
    seed(db_url)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "auditor", "--db", db_url, "audit"]
    window = ["--start", _iso(WINDOW[0]), "--end", _iso(WINDOW[1])]
    out = subprocess.PIPE
    procs = [
        subprocess.Popen([*cmd, *window], env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        for _ in range(N)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * N, outs
    ids = [int(o.split("audit run ", 1)[1].split(":", 1)[0]) for o in outs]
    assert len(set(ids)) == N, outs
    assert runs_of_window(db_url) == [max(ids)]


def _iso(ms: int) -> str:
    from auditor.jobs.common import iso

    return iso(ms)


WEEK = "2026-W47"
WEEK_WINDOW = (1_795_392_000_000 - 7 * 86_400_000, 1_795_392_000_000)  # Mon 16 - Mon 23 Nov


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3
PR_CAPBSET_DROP = 24


def _without_override() -> None:
    """In the child, before it runs the auditor: give up root's power to write through file
    modes (and to change them), so that a 0444 file in a 0555 directory is read-only to it
    as to any other user. The capabilities leave the bounding set, so the exec drops them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def as_a_reader(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user who cannot write the store: root without its override of file
    modes when the tests run as root, else the tests' own user."""
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_reader(),
    )


def _reader() -> Callable[[], None] | None:
    return _without_override if os.geteuid() == 0 else None


@pytest.fixture(params=["read-only-directory", "read-only-file"])
def read_only_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """A store audited for a whole week, then its file 0444, in a directory 0555 that the
    reader cannot write (and so can make no -wal or -shm file in) or in one it can."""
    where = tmp_path / "store"
    where.mkdir()
    db = where / "auditor.db"
    url = f"sqlite:///{db}"
    # written by a process that has ended, as a CronJob's store is: no -wal or -shm left
    here = Path(__file__).parent
    writer = (
        "import test_store_concurrency as t; from auditor import jobs; "
        "from auditor.settings import Thresholds; "
        f"t.seed({url!r}); jobs.audit({url!r}, window=t.WEEK_WINDOW, thresholds=Thresholds())"
    )
    env = {**os.environ, "PYTHONPATH": f"{here.parent}{os.pathsep}{here}"}
    subprocess.run([sys.executable, "-c", writer], env=env, check=True, timeout=120)
    assert sorted(p.name for p in where.iterdir()) == ["auditor.db"]
    db.chmod(0o444)
    folder = request.param == "read-only-directory"
    if folder:
        where.chmod(0o555)
    # the reader genuinely cannot write there: the file, nor (for a folder) a new one in it
    for target in (db, where / "auditor.db-wal") if folder else (db,):
        code = f"open({str(target)!r}, 'ab')"
        tried = subprocess.run([sys.executable, "-c", code], preexec_fn=_reader(), check=False)
        assert tried.returncode != 0, f"{target} is writable to the reader"
    try:
        yield url, db
    finally:
        where.chmod(0o755)


def test_a_report_and_a_finance_export_read_a_store_they_cannot_write(
    read_only_store: tuple[str, Path],
) -> None:
    url, db = read_only_store
    before = db.read_bytes()
    week = ["--start", _iso(WEEK_WINDOW[0]), "--end", _iso(WEEK_WINDOW[1])]
    report = as_a_reader("--db", url, "report", *week, "--format", "json")
    assert report.returncode == 0, report.stderr
    assert "unallocated_gpu_hours" in report.stdout
    finance = as_a_reader("--db", url, "export", "finance", "--week", WEEK)
    assert finance.returncode == 0, finance.stderr
    assert finance.stdout.startswith("week,"), finance.stdout[:200]
    # a writer is still refused, in one line, and nothing changed
    audit = as_a_reader("--db", url, "audit", *week)
    assert audit.returncode == 3, audit.stderr
    assert "read" in audit.stderr
    assert "Traceback" not in audit.stderr
    assert db.read_bytes() == before


def test_a_reader_opened_read_only_cannot_write(db_url: str) -> None:
    from sqlalchemy import insert

    from auditor.errors import StoreError
    from auditor.store.connection import transaction
    from auditor.store.schema import gpus

    seed(db_url)
    engine = jobs.open_store(db_url, read_only=True)
    with engine.connect() as conn:
        assert len(reads.read_gpus(conn)) == 2
    with pytest.raises(StoreError, match=r"read-only|readonly"), transaction(engine) as conn:
        conn.execute(insert(gpus), {"uuid": "GPU-x", "node": "n1", "gpu_index": 0})
    engine.dispose()
    writer = make_engine(db_url)
    with writer.connect() as conn:
        assert len(reads.read_gpus(conn)) == 2
    writer.dispose()
