"""An audit whose chunks are read and classified by worker processes stores what one process
stores, whichever way the workers start; a worker that dies fails the audit, storing
nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from test_shards import cause_rows, load_waiting, stored

from auditor import jobs
from auditor.jobs import workers
from auditor.settings import Thresholds


def test_workers_store_what_one_process_stores(db_url: str, tmp_path: Path) -> None:
    """The demo day (gangs across nodes, pods that waited while cards sat free, a cordoned
    node) a node per chunk: chunks interleave between the workers, a gang's cards are read
    in several, and free time is split once every worker's chunks are in."""
    window = load_waiting(db_url, tmp_path)
    one = jobs.audit(db_url, window=window, thresholds=Thresholds(), workers=1)
    expected = stored(db_url, [one.run_id]), cause_rows(db_url, [one.run_id])
    assert expected[1].query("cause == 'blocked'")["seconds"].sum() > 0
    assert one.workers == 1

    two = jobs.audit(db_url, window=window, thresholds=Thresholds(), workers=2, chunk_samples=1)
    assert two.workers == 2
    _same(db_url, two, one, expected)

    # beside another thread (a service's), workers come from a fork server, never a fork
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        served = jobs.audit(
            db_url, window=window, thresholds=Thresholds(), workers=2, chunk_samples=1
        )
    finally:
        stop.set()
        other.join()
    assert served.workers == 2
    _same(db_url, served, one, expected)


def _same(
    url: str,
    got: jobs.AuditStats,
    one: jobs.AuditStats,
    expected: tuple[tuple[pd.DataFrame, pd.DataFrame], pd.DataFrame],
) -> None:
    (results, findings), causes = expected
    got_results, got_findings = stored(url, [got.run_id])
    pd.testing.assert_frame_equal(got_results, results, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(got_findings, findings, check_dtype=False)
    pd.testing.assert_frame_equal(
        cause_rows(url, [got.run_id]), causes, check_exact=False, rtol=1e-9
    )
    assert (got.samples, got.gpus, got.tenures) == (one.samples, one.gpus, one.tenures)


# The CLI in a process of its own (one thread: its workers are forked, and so run the
# module as patched here). What a chunk is given is noted; with KILL set, every worker
# ends itself as the kernel's OOM killer ends one: no exception, no goodbye.
CLI = """
import os, sys
from auditor.cli import main
from auditor.jobs import audit_chunks, workers

classify = audit_chunks.classify_chunk

def noted(*args, **kwargs):
    if os.environ.get("KILL"):
        os._exit(9)
    with open(os.environ["NOTES"], "a") as f:
        print(os.getpid(), file=f)
    return classify(*args, **kwargs)

audit_chunks.classify_chunk = noted
sys.argv = ["auditor", *sys.argv[1:]]
main()
"""


def test_the_cli_audits_in_workers_and_a_worker_that_dies_stores_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    load_waiting(url, tmp_path)
    notes = tmp_path / "notes"
    args = [sys.executable, "-c", CLI, "--db", url, "audit", "--workers", "2"]
    env = {**os.environ, "NOTES": str(notes)}
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "(2 worker processes)" in done.stdout
    ran_in = set(notes.read_text().split())
    assert len(ran_in) == 2, "two processes, neither the CLI's (it would be one), classified them"
    runs = _runs(url)

    died = subprocess.run(
        args, env={**env, "KILL": "1"}, capture_output=True, text=True, check=False
    )
    assert died.returncode != 0
    assert died.stderr.startswith("auditor: error: a worker process died (out of memory?)")
    assert len(died.stderr.strip().splitlines()) == 1, "one line, no traceback"
    assert _runs(url) == runs, "the run before it stands, and no other was stored"


@dataclass(frozen=True)
class _Stamp:
    """A chunk's work that says when it ran (a worker process's clock, one worker)."""

    def run(self, engine: object, part: workers.Part) -> tuple[str, int]:
        return min(part[0]), time.monotonic_ns()


def test_the_costliest_chunks_go_first_and_results_come_back_in_order(tmp_path: Path) -> None:
    """Parts taken in order can leave one worker alone with a large last part; handed out
    costliest first, the workers end together. What the job gets is in part order still."""
    parts = [({name}, {name}) for name in ("a", "b", "c", "d")]
    engine = jobs.open_store(f"sqlite:///{tmp_path / 'w.db'}")
    got = list(workers.in_workers(engine, _Stamp(), parts, 1, costs=[5, 40, 5, 20]))
    assert [name for name, _ in got] == ["a", "b", "c", "d"]
    ran = [name for name, _ in sorted(got, key=lambda r: r[1])]
    assert ran == ["b", "d", "a", "c"], "costliest first, ties in part order"
    plain = list(workers.in_workers(engine, _Stamp(), parts, 1))
    assert [name for name, _ in sorted(plain, key=lambda r: r[1])] == ["a", "b", "c", "d"]


def _runs(url: str) -> list[int]:
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        runs = conn.exec_driver_sql("SELECT id FROM audit_runs").scalars().all()
    engine.dispose()
    assert runs
    return list(runs)


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({}, None),
        ({"cpu.max": "garbage"}, None),
    ],
)
def test_a_containers_cpu_limit_is_read_from_its_cgroup(
    tmp_path: Path, files: dict[str, str], cpus: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert workers._cgroup_quota(str(tmp_path)) == cpus


@pytest.mark.parametrize(
    ("platform", "asked", "planned", "threads", "expected"),
    [
        ("linux", None, 10**9, 1, (2, "fork")),
        ("linux", None, 1_000, 1, (1, "fork")),  # too small to win a worker's start back
        ("linux", 3, 1_000, 2, (3, "forkserver")),  # asked for; another thread is running
        ("darwin", None, 10**9, 1, (1, "spawn")),  # a laptop: none unless asked
        ("darwin", 2, 10**9, 1, (2, "spawn")),
    ],
)
def test_how_many_workers_and_how_they_start(
    monkeypatch: pytest.MonkeyPatch,
    platform: str,
    asked: int | None,
    planned: int,
    threads: int,
    expected: tuple[int, str],
) -> None:
    monkeypatch.setattr(workers.sys, "platform", platform)
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    monkeypatch.setattr(workers.threading, "active_count", lambda: threads)
    assert (workers.workers_for(asked, planned=planned), workers.start_method()) == expected
