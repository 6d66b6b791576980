"""The views against the audit they read, and `explain` against reading its samples.

On one database (default: the `large` preset, 64 GPUs over a day, built with `auditor demo
--scenario large --keep`), in turn, `--rounds` times: the audit of the whole window, the
HTML report, one `whatif` policy, `explain` of the job with the most cards, and the floor
of that explain, reading its cards' samples as the audit does. The medians and their ratios
are printed from the same run.

Each step is timed in a process of its own, forked from this one with the modules it uses
imported, as each command runs in a process of its own (imports aside). Timed one after
another in one process, a step paid for the one before it: a step after the audit's or
`whatif`'s worker processes were forked wrote to heap pages they had shared, a page fault
each (22-25 thousand more in `explain` right after `whatif` than in the next `explain`),
while `explain`'s floor, timed after `explain`, ran on a warm heap.

    .venv/bin/python bench/bench_views.py [--db sqlite:///PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar

from auditor import jobs
from auditor.allocator import keep_freed_memory
from auditor.classify.policy import parse_policy
from auditor.jobs.audit_chunks import NEIGHBOUR_SAMPLES
from auditor.report.summary import GroupBy
from auditor.settings import Thresholds
from auditor.store import reads
from auditor.store.placement import held_tenures

T = TypeVar("T")


def build(root: Path) -> str:
    subprocess.run(
        [sys.executable, "-m", "auditor", "demo", "--scenario", "large", "--keep", str(root)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return f"sqlite:///{root / 'auditor.db'}"


def widest_job(url: str) -> tuple[str, Callable[[], object]]:
    """The job holding the most cards, and the read of its cards' samples over its span."""
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        span = reads.sample_span(conn)
        assert span is not None
        pods, gpus, tenures = held_tenures(conn, now_ms=span[1], window=span)
    jobs_of = pods.set_index("uid")[["namespace", "job"]]
    held = tenures.join(jobs_of, on="pod_uid")
    cards = held.groupby(["namespace", "job"])["gpu"].nunique().sort_values(kind="stable")
    (ns, job) = cards.index[-1]
    mine = held[(held["namespace"] == ns) & (held["job"] == job)]
    lo, hi = int(mine["start_ms"].min()), int(mine["end_ms"].max())
    ids = {str(u): int(i) for u, i in zip(gpus["uuid"], gpus["id"], strict=True)}
    wanted = [(ids[g], lo, hi) for g in sorted(set(mine["gpu"]))]
    uuids = {i: u for u, i in ids.items()}

    engine.dispose()

    def read() -> object:  # on an engine of its own, as explain opens one
        mine = jobs.open_store(url)
        try:
            with mine.connect() as conn:
                return reads.read_card_samples(conn, wanted, uuids, neighbours=NEIGHBOUR_SAMPLES)
        finally:
            mine.dispose()

    return f"{ns}/{job}", read


def preload(steps: Iterable[Callable[[], object]]) -> None:
    """Import here what the steps import: each runs once, untimed, in a process of its own,
    which names the modules it imported. So no timed step pays an import, and none runs
    beside modules it does not use (their objects are the heap a step's collector walks)."""
    for step in steps:
        for name in _run_alone(_imported_by, step):
            if not name.endswith("__main__"):  # which would run a program
                with contextlib.suppress(ImportError):
                    importlib.import_module(name)


def _imported_by(step: Callable[[], object]) -> list[str]:
    before = set(sys.modules)
    step()
    return sorted(set(sys.modules) - before)


def alone(step: Callable[[], object]) -> float:
    """Seconds `step` takes in a process of its own, forked from this one."""
    return float(_run_alone(_timed, step))


def _timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def _run_alone(run: Callable[[Callable[[], object]], T], step: Callable[[], object]) -> T:
    """`run(step)` in a child forked from this process."""
    fork = multiprocessing.get_context("fork")
    ours, theirs = fork.Pipe(duplex=False)
    child = fork.Process(target=_send, args=(run, step, theirs))
    child.start()
    theirs.close()
    try:
        got: T = ours.recv()
    except EOFError:
        child.join()
        raise SystemExit(f"a step died in its process (exit code {child.exitcode})") from None
    child.join()
    return got


def _send(
    run: Callable[[Callable[[], object]], object], step: Callable[[], object], out: Connection
) -> None:
    out.send(run(step))
    out.close()


def main() -> int:
    keep_freed_memory()  # this process asks glibc for memory as `auditor`'s commands do
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="store URL (default: build the large preset)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or build(Path(tmp) / "large")
        thresholds = Thresholds()
        target, read = widest_job(url)
        policy = [parse_policy("idle>=1h")]
        steps: dict[str, Callable[[], object]] = {
            "audit": lambda: jobs.audit(url, window=None, thresholds=thresholds),
            "report --format html": lambda: jobs.build_report_html(
                url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None, thresholds=thresholds
            ),
            "whatif idle>=1h": lambda: jobs.whatif(
                url, policies=policy, window=None, thresholds=thresholds
            ),
            f"explain {target}": lambda: jobs.explain(url, target, thresholds=thresholds),
            "read its samples": read,
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        preload(steps.values())
        for _ in range(args.rounds):
            for name, step in steps.items():
                times[name].append(alone(step))
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"{name:<40} median {med[name]:6.2f} s  ({', '.join(f'{x:.2f}' for x in t)})")
        names = list(steps)
        audit = med["audit"]
        print(f"html / audit   = {med[names[1]] / audit:.2f}x")
        print(f"whatif / audit = {med[names[2]] / audit:.2f}x")
        print(f"explain / read its samples = {med[names[3]] / med[names[4]]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
