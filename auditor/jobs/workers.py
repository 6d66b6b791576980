"""Worker processes for the jobs that read and classify a fleet chunk by chunk (the audit,
`whatif`): each worker takes the next chunk as it finishes one, on its own connection.

Reading a card's rows through a database driver builds a Python object per value under the
interpreter lock, and classifying them is numpy and pandas under it too: threads take turns,
only processes use more than one core. A job hands over a plan (`ChunkWork`: what every
chunk needs, small next to the samples) and its chunks; the results come back in chunk
order, so what the job stores or prints is the same whatever the number of workers.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from auditor.errors import AuditorError

if TYPE_CHECKING:
    from sqlalchemy import Engine

Part = tuple[set[str], set[str]]
"""(cards the chunk owns, cards it reads: its own and the rest of their gangs)."""

PARALLEL_MIN_SAMPLES = 400_000
"""Samples a job must plan to read before it uses worker processes: a worker costs a fork
and its own memory, which a smaller job does not win back (measured with
`bench/bench_fleet.py`; README, Scale)."""

R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")


class ChunkWork(Protocol[R_co]):
    """What a worker does with one chunk, and all it needs for any chunk."""

    def run(self, engine: Engine, part: Part) -> R_co: ...


def workers_for(asked: int | None, *, planned: int) -> int:
    """The worker processes a job planning to read `planned` samples uses: `asked`, or on
    Linux one per usable CPU once the job is large enough to win a worker's start back.
    Elsewhere (a laptop's macOS) none unless asked: a fork there may crash in the system's
    libraries, and a spawned worker costs its imports."""
    if asked is not None:
        return max(1, asked)
    if not sys.platform.startswith("linux"):
        return 1
    return usable_cpus() if planned >= PARALLEL_MIN_SAMPLES else 1


def in_workers(
    engine: Engine,
    work: ChunkWork[R],
    parts: Sequence[Part],
    workers: int,
    *,
    costs: Sequence[int] | None = None,
) -> Iterator[R]:
    """`work.run` of each part, in order, by `workers` processes each with an engine of its
    own on the store `engine` is on. A worker holds one chunk at a time.

    With `costs` (each part's expected rows, `parts.planned_cost` summed over the cards it
    reads), the costliest parts are handed out first, so the workers end together: taken
    in order, a large part last left one worker with it while the others sat idle. The
    results still come back in part order.

    Workers are forked where this process runs no other thread (the CLI: a fork shares the
    imports and costs milliseconds), else started by a fork server (a fork of a process
    whose other threads may hold a lock can deadlock); see `start_method`. A worker that
    dies (killed for memory) fails the job with an error."""
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context(start_method())
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([__name__, type(work).__module__])
    url = engine.url.render_as_string(hide_password=False)
    order = sorted(range(len(parts)), key=lambda i: (-costs[i], i)) if costs else range(len(parts))
    with ProcessPoolExecutor(workers, context, initializer=_start, initargs=(url, work)) as pool:
        running: dict[int, Future[R]] = {i: pool.submit(_run, parts[i]) for i in order}
        try:
            for i in range(len(parts)):
                yield running.pop(i).result()
        except BrokenProcessPool as e:
            raise AuditorError(
                "a worker process died (out of memory?): nothing was stored; run it again"
                " with --workers 1, or give it more memory"
            ) from e
        finally:
            for left in running.values():
                left.cancel()


def start_method() -> str:
    """How a worker process starts: forked on Linux while this process runs no other
    thread, from a fork server while it does; spawned elsewhere."""
    if not sys.platform.startswith("linux"):
        return "spawn"
    return "fork" if threading.active_count() == 1 else "forkserver"


def usable_cpus() -> int:
    """The CPUs this process may run on, within a cgroup's CPU quota (a container's limit,
    which `os.cpu_count` does not see)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    quota = _cgroup_quota()
    return cpus if quota is None else min(cpus, max(1, math.ceil(quota)))


def _cgroup_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs a cgroup's quota allows (a container's CPU limit), None where unlimited or
    unknown: cgroup v2's `cpu.max` ("max 100000" or "<quota> <period>"), else v1's
    `cpu.cfs_quota_us` (-1 unlimited) over `cpu.cfs_period_us`."""
    try:
        with open(f"{root}/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(f"{root}/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            us = int(f.read())
        with open(f"{root}/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            per = int(f.read())
        return None if us <= 0 or per <= 0 else us / per
    except (OSError, ValueError):
        return None


_worker: tuple[Engine, ChunkWork[Any]] | None = None
"""In a worker process: its engine on the store and the job's plan."""


def _start(url: str, work: ChunkWork[Any]) -> None:
    from auditor.store.connection import make_engine

    global _worker  # noqa: PLW0603 - one per worker process, set as the pool starts it
    _worker = make_engine(url), work


def _run(part: Part) -> Any:
    assert _worker is not None, "a worker is started with its plan"
    engine, work = _worker
    return work.run(engine, part)
