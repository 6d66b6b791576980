"""Shared by every job: opening the store at the right schema, batching, small converters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from auditor.errors import AuditorError, InputError, StoreError

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Engine


Progress = Callable[[int], None]
T = TypeVar("T")
BATCH_ROWS = 20_000
"""Rows written per statement batch by the importers."""


@dataclass(frozen=True)
class ImportStats:
    file: str
    rows: int
    """Rows newly stored."""
    gpus: int
    seconds: float
    already: int = 0
    """Rows of the file that were stored already (a re-import, or files that overlap)."""
    shifted_ms: int | None = None
    """Where the store already held the file's first readings this many ms away (the same
    file imported before with another `--tz`); None where it did not."""
    import_id: int | None = None
    """The import's id in the ledger (`auditor import list|undo`)."""


def open_store(url: str, *, read_only: bool = False) -> Engine:
    """An engine at the current schema. A new SQLite file is created and migrated on the spot;
    any other database must have been migrated with `auditor db upgrade`.

    `read_only`, for the commands that only read (report, explain, export, compare): their
    transactions cannot write (`make_engine`). A SQLite file this process cannot write is
    opened read-only either way."""
    from sqlalchemy import inspect

    from auditor.store import migrate
    from auditor.store.connection import is_sqlite, make_engine

    engine = make_engine(url, read_only=read_only)
    try:
        if is_sqlite(engine) and not inspect(engine).get_table_names():
            migrate.create_fresh(engine)
        migrate.ensure_current(engine)
    except AuditorError:
        raise
    except Exception as e:  # connection refused, bad credentials, locked file...
        raise_store_error(url, e)
    return engine


def raise_store_error(url: str, e: Exception) -> None:
    raise store_error(url, e) from e


def store_error(url: str, e: BaseException) -> StoreError:
    """The one-line `StoreError` for a driver's failure on the database at `url`."""
    from auditor.redact import redact

    cause = getattr(e, "orig", None) or e  # the driver's own message, not SQLAlchemy's wrapper
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    return StoreError(f"cannot use {redact(url)}: {redact(first)}")


def environment_failure(url: str, e: BaseException) -> AuditorError | None:
    """The one-line error for a failure of the database or the machine rather than of the
    auditor (disk full, read-only file, a server restarted mid-run, a lost connection,
    permission denied), or None for anything else: a bug, which keeps its traceback."""
    import sqlite3

    import psycopg
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(e, SQLAlchemyError | sqlite3.Error | psycopg.Error):
        return store_error(url, e)
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        return StoreError(f"{e.strerror or type(e).__name__}{where}")
    if isinstance(e, MemoryError):
        return StoreError("out of memory: give the command a smaller window or input")
    return None


def read_ahead(items: Iterator[T], *, depth: int = 2) -> Iterator[T]:
    """`items`, produced by a thread up to `depth` ahead of the consumer: a file is parsed
    while the database stores the block before (numpy and the driver's socket waits release
    the GIL). An exception of `items` is raised here, at its place in the sequence; leaving
    the loop early stops the thread and closes `items`."""
    import queue
    import threading

    done = object()
    handoff: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            put((done, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name="auditor-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, error = handoff.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()


def batched(items: Iterator[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nulls(series: pd.Series) -> list[object]:
    """Values with NaN/NA as None, for writing to the database."""
    import pandas as pd

    return [None if pd.isna(v) else v for v in series.tolist()]


def one_cluster(found: list[str], *, what: str) -> str:
    """The one cluster of `found` (sorted); an InputError naming them, and `--cluster`, where
    `what` (the store, a job) is in several."""
    if len(found) > 1:
        raise InputError(
            f"{what} is in {len(found)} clusters ({', '.join(found)}): name one with --cluster",
            field="--cluster",
        )
    return found[0]
