"""The retention job: roll raw samples older than the retention age up into 1-minute rows.

Each batch of GPUs is its own transaction, so a first rollup of a long history neither holds
one huge transaction nor loses work when interrupted: a batch is rolled up and pruned
together or not at all, and the next run carries on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from auditor.errors import InputError
from auditor.jobs.common import open_store, raise_store_error
from auditor.settings import Thresholds

DAY_MS = 86_400_000
ROLLUP_MIN_PER_MINUTE = 2.5
"""A GPU is rolled up only where it has this many raw samples per minute (about 20 s apart
or closer): a minute row takes the room of 2.3 raw rows, so rolling up sparser data would
grow the store, not shrink it (SQLite, 8 cards x 2 days, vacuumed: at 60 s 0.79 MB raw and
1.84 MB rolled up, at 30 s 1.44 and 1.86 MB, at 20 s 2.08 and 1.87 MB, at 10 s 4.01 and
1.86 MB). Such a GPU keeps its raw samples, which an audit reads as it always did."""


@dataclass(frozen=True)
class RetentionStats:
    before_ms: int
    """Raw samples stamped before this (a minute boundary) were rolled up."""
    gpus: int
    raw_deleted: int
    minutes_written: int
    seconds: float


def rollup(
    url: str,
    *,
    older_than_days: float,
    thresholds: Thresholds,
    now_ms: int | None = None,
    batch_gpus: int | None = None,
) -> RetentionStats:
    """Roll up and prune the raw samples older than `older_than_days` (SPEC §3 coverage)."""
    from sqlalchemy.exc import DBAPIError

    from auditor.store import rollup as store_rollup

    started = time.perf_counter()
    if older_than_days < 0:
        raise InputError(f"must be >= 0, got {older_than_days!r}", field="--older-than")
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    before_ms = now - round(older_than_days * DAY_MS)
    batch = batch_gpus or store_rollup.BATCH_GPUS
    engine = open_store(url)
    with engine.connect() as conn:
        ids = store_rollup.gpu_ids(conn)
    n_gpus = deleted = written = 0
    cut = store_rollup.floor_minute(before_ms)
    for start in range(0, len(ids), batch):
        try:
            with engine.begin() as conn:
                stats = store_rollup.rollup(
                    conn,
                    before_ms=before_ms,
                    thresholds=thresholds,
                    gpu_ids=ids[start : start + batch],
                    batch_gpus=batch,
                    min_per_minute=ROLLUP_MIN_PER_MINUTE,
                )
        except DBAPIError as e:  # the database went away or stayed locked mid-run
            raise_store_error(url, e)
            raise
        n_gpus += stats.gpus
        deleted += stats.raw_deleted
        written += stats.minutes_written
        cut = stats.before_ms
    return RetentionStats(
        before_ms=cut,
        gpus=n_gpus,
        raw_deleted=deleted,
        minutes_written=written,
        seconds=time.perf_counter() - started,
    )
