"""The sampler's bounded on-disk buffer: what was read but not yet stored survives an outage.

A local SQLite file (stdlib `sqlite3`, one writer: the sampler) holds batches in the order
they were read. The sampler appends each pass, and on flush writes the oldest batches to the
store, deleting them only after the store committed (a replay is harmless: writes are
idempotent). The buffer is bounded by the bytes of its batches; beyond the bound, or when
the disk is full, the oldest batches are dropped and counted. It also keeps the pod
holdings that could not yet be joined to a pod the watcher recorded, as spans per
(namespace, pod, GPU), until they resolve or grow too old.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import astuple
from pathlib import Path

from auditor.errors import AuditorError
from auditor.model import (
    Batch,
    CardSignal,
    GpuRecord,
    GpuSample,
    Holding,
    PodSignal,
    TenantSample,
    merge_holdings,
)
from auditor.settings import BUFFER_MAX_MIB

log = logging.getLogger(__name__)


def encode_batch(batch: Batch) -> str:
    return json.dumps(
        [
            [astuple(g) for g in batch.gpus],
            [astuple(s) for s in batch.samples],
            [astuple(h) for h in batch.holdings],
            [astuple(t) for t in batch.tenants],
            [astuple(p) for p in batch.pod_signals],
            [astuple(c) for c in batch.card_signals],
        ],
        separators=(",", ":"),
    )


def decode_batch(text: str) -> Batch:
    """A batch as `encode_batch` wrote it, or as an earlier version did (no tenants or
    signals, records with fewer fields): a buffer kept over an upgrade is still written."""
    gpus, samples, holdings, *rest = json.loads(text)
    tenants, pod_signals, card_signals = [*rest, [], [], []][:3]
    return Batch(
        tuple(GpuRecord(*g) for g in gpus),
        tuple(GpuSample(*s) for s in samples),
        tuple(Holding(*h) for h in holdings),
        tuple(TenantSample(*t) for t in tenants),
        tuple(PodSignal(*p) for p in pod_signals),
        tuple(CardSignal(*c) for c in card_signals),
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS unresolved (
    namespace TEXT NOT NULL, pod TEXT NOT NULL, gpu_uuid TEXT NOT NULL,
    first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL, replicas INTEGER,
    PRIMARY KEY (namespace, pod, gpu_uuid));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

MIB = 2**20
DEFAULT_MAX_BYTES = int(BUFFER_MAX_MIB * MIB)
"""Batch bodies kept at most: the file stays within 1.2 times this (bodies fill whole
pages; measured in tests/agents/test_buffer.py), so 256 MiB of disk holds it."""
MEMORY_MAX_BYTES = 16 * MIB
"""The bound when no file can be used (full disk at start): the sampler's memory limit is
256 MiB."""


class BufferStorageError(AuditorError):
    """The buffer's file could not be read or written (the flush is retried later)."""


def _code(e: sqlite3.Error) -> int:
    return int(getattr(e, "sqlite_errorcode", -1)) & 0xFF


def _full(e: sqlite3.Error) -> bool:
    """A full disk: SQLITE_FULL, or an I/O error writing the journal on one."""
    return _code(e) in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR) or "is full" in str(e)


_JOURNAL = "TRUNCATE"
"""A rollback journal, not a WAL: an append journals a page or two, where a WAL holds every
new page until a checkpoint, which on a full disk cannot run (the data then lives in a WAL
that cannot be folded back: deadlock). One connection, so a WAL buys no concurrency."""

_BROKEN = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)
"""A file that is not (or no longer) a buffer: moved aside for a post-mortem."""


def _connect(target: str) -> tuple[sqlite3.Connection, int, int]:
    """An open buffer and its (batches, body bytes); raises for a file that is not one."""
    db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes on a new file only
        db.execute(f"PRAGMA journal_mode={_JOURNAL}")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(unresolved)")}
        if "replicas" not in columns:  # a buffer file of an earlier version
            db.execute("ALTER TABLE unresolved ADD COLUMN replicas INTEGER")
        count, size = db.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0) FROM batches"
        ).fetchone()
    except BaseException:
        db.close()
        raise
    return db, int(count), int(size)


class DiskBuffer:
    """Batches waiting for the store, oldest first, at most `max_bytes` of batch bodies
    (and `max_batches` batches, if set). The newest batch is always kept.

    It never raises for its own storage on `push`: a full disk drops the oldest batches
    (counted) until the new one fits, or the new one when even an empty buffer cannot take
    it. A file that is not a buffer is moved aside (`.corrupt-<time>`) and a fresh one made;
    a file that cannot be opened at all (a full disk at start) leaves the sampler with an
    in-memory buffer of at most `MEMORY_MAX_BYTES` until it restarts (`in_memory`).
    """

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_batches: int | None = None
    ) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if max_batches is not None and max_batches < 1:
            raise ValueError("max_batches must be at least 1")
        self.path = path
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        self.in_memory = False
        self._lock = threading.RLock()  # the sampling loop appends while the flusher stores
        self._unsaved_drops = 0  # dropped while even the counter could not be written
        self._ceiling: int | None = None  # body bytes that fit when the disk was last full
        self._refusing = False  # the disk takes no batch at all: logged once
        self._db, self._count, self._bytes = self._open()

    def _open(self, *, broken: sqlite3.Error | None = None) -> tuple[sqlite3.Connection, int, int]:
        problem: Exception
        if broken is not None:
            problem = broken
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                return _connect(str(self.path))
            except (sqlite3.Error, OSError) as e:
                problem = e
        if not self.in_memory and isinstance(problem, sqlite3.Error) and _code(problem) in _BROKEN:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            try:
                for suffix in ("-journal", "-wal", "-shm", ""):
                    part = Path(f"{self.path}{suffix}")
                    if part.exists():
                        part.rename(f"{aside}{suffix}")
                log.warning(
                    "buffer %s unreadable (%s): moved aside to %s", self.path, problem, aside
                )
                return _connect(str(self.path))
            except (sqlite3.Error, OSError) as e:
                problem = e
        self.in_memory = True
        self.max_bytes = min(self.max_bytes, MEMORY_MAX_BYTES)
        log.warning(
            "no on-disk buffer at %s (%s): buffering at most %d MiB in memory until restart",
            self.path,
            problem,
            self.max_bytes // MIB,
        )
        return _connect(":memory:")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __len__(self) -> int:
        return self._count

    @property
    def body_bytes(self) -> int:
        """The bytes of the batches held (what `max_bytes` bounds)."""
        return self._bytes

    def counter(self, name: str) -> int:
        with self._lock, self._storage("read"):
            row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _bump(self, name: str, by: int) -> None:
        if by:
            self._db.execute(
                "INSERT INTO counters VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, by),
            )

    @property
    def dropped(self) -> int:
        """Batches dropped, oldest first (or the new one, on a disk that takes none), because
        the buffer or its disk was full (since the file was created)."""
        return self.counter("dropped_batches") + self._unsaved_drops

    def push(self, batch: Batch) -> int:
        """Append a batch; drop the oldest beyond the bounds or while the disk is full.
        Returns how many were dropped, the new batch included if no room could be made."""
        body = encode_batch(batch)
        dropped = failures = 0
        made_room = False
        with self._lock:
            while True:
                try:
                    dropped += self._append(body)
                except sqlite3.Error as e:
                    self._rollback()
                    if _code(e) in _BROKEN and failures == 0:
                        failures += 1
                        self._db.close()  # broken under us: start afresh, once
                        self._db, self._count, self._bytes = self._open(broken=e)
                        continue
                    if not _full(e) or self._count == 0 or failures >= 2:
                        return dropped + self._refuse(e)
                    try:
                        dropped += self._make_room(len(body), in_place=failures > 0)
                        made_room = True
                    except sqlite3.Error:
                        self._rollback()
                        failures += 1
                    continue
                if made_room:
                    self._ceiling = self._bytes  # what the disk held: keep below it
                self._refusing = False
                return dropped

    def _limit(self) -> int:
        return self.max_bytes if self._ceiling is None else min(self.max_bytes, self._ceiling)

    def _append(self, body: str) -> int:
        """One transaction: drop the oldest so that `body` fits the bounds, then insert it."""
        size = len(body)  # ASCII: json.dumps escapes the rest
        over_bytes = self._bytes + size - self._limit()
        over_rows = 0 if self.max_batches is None else self._count + 1 - self.max_batches
        self._db.execute("BEGIN IMMEDIATE")
        upto, n, freed = self._oldest_covering(bytes_=over_bytes, rows=over_rows)
        if n:
            self._db.execute("DELETE FROM batches WHERE seq <= ?", (upto,))
        self._db.execute("INSERT INTO batches (body) VALUES (?)", (body,))
        self._bump("dropped_batches", n + self._unsaved_drops)
        self._db.execute("COMMIT")
        self._unsaved_drops = 0
        self._count += 1 - n
        self._bytes += size - freed
        return n

    def _oldest_covering(self, *, bytes_: int, rows: int) -> tuple[int, int, int]:
        """(last seq, batches, body bytes) of the fewest oldest batches that are at least
        `rows` batches and `bytes_` bytes; all of them at most."""
        upto = n = freed = 0
        if bytes_ <= 0 and rows <= 0:
            return 0, 0, 0
        for seq, size in self._db.execute("SELECT seq, length(body) FROM batches ORDER BY seq"):
            upto, n, freed = int(seq), n + 1, freed + int(size)
            if freed >= bytes_ and n >= rows:
                break
        return upto, n, freed

    def _make_room(self, size: int, *, in_place: bool) -> int:
        """The disk is full: drop the oldest batches (at least twice `size` bytes, or an
        eighth of the buffer) and give their pages back to the disk.

        `in_place`: the delete itself found no room for its journal, so it runs with the
        journal in memory (a crash right then may leave the file broken: it is then moved
        aside at start)."""
        if in_place:
            self._db.execute("PRAGMA journal_mode=MEMORY")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            upto, n, freed = self._oldest_covering(bytes_=max(2 * size, self._bytes // 8), rows=1)
            self._db.execute("DELETE FROM batches WHERE seq <= ?", (upto,))
            self._db.execute("COMMIT")
            self._count -= n
            self._bytes -= freed
            self._unsaved_drops += n  # counted with the next batch that is written
            self._db.execute("PRAGMA incremental_vacuum").fetchall()
        finally:
            if in_place:
                with suppress(sqlite3.Error):
                    self._db.execute(f"PRAGMA journal_mode={_JOURNAL}")
        return n

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with suppress(sqlite3.Error):  # SQLite already rolled it back
                self._db.execute("ROLLBACK")

    def _refuse(self, e: sqlite3.Error) -> int:
        """Not even an empty buffer takes the batch: drop it (counted), go on."""
        self._unsaved_drops += 1
        if not self._refusing:
            log.warning(
                "buffer %s takes no batch (%s): dropping each pass until it does", self.path, e
            )
            self._refusing = True
        return 1

    @contextmanager
    def _storage(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            self._rollback()
            raise BufferStorageError(f"buffer {self.path}: cannot {what}: {e}") from e

    def oldest(self, limit: int) -> list[tuple[int, Batch]]:
        with self._lock, self._storage("read"):
            rows = self._db.execute(
                "SELECT seq, body FROM batches ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [(int(seq), decode_batch(body)) for seq, body in rows]

    def unresolved(self) -> list[Holding]:
        with self._lock, self._storage("read"):
            rows = self._db.execute(
                "SELECT namespace, pod, gpu_uuid, first_ms, last_ms, replicas FROM unresolved"
            ).fetchall()
        return [Holding(*r) for r in rows]

    def _forget(self, upto_seq: int, kept: list[Holding], *, dropped_holdings: int) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        n, freed = self._db.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0) FROM batches WHERE seq <= ?",
            (upto_seq,),
        ).fetchone()
        self._db.execute("DELETE FROM batches WHERE seq <= ?", (upto_seq,))
        self._db.execute("DELETE FROM unresolved")
        self._db.executemany(
            "INSERT INTO unresolved (namespace, pod, gpu_uuid, first_ms, last_ms, replicas)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [astuple(h) for h in kept],
        )
        self._bump("dropped_holdings", dropped_holdings)
        self._db.execute("COMMIT")
        self._count -= int(n)
        self._bytes -= int(freed)
        if self._count == 0:
            self._ceiling = None  # drained: the disk may hold more again

    def stored(self, *, upto_seq: int, unresolved: Iterable[Holding], keep_after_ms: int) -> int:
        """The store committed batches up to `upto_seq`: forget them, and keep the holdings
        still unresolved unless last seen before `keep_after_ms`. Returns holdings dropped.
        Raises `BufferStorageError` if the file cannot be written (the batches are then
        stored again on the next flush: harmless)."""
        merged = merge_holdings(unresolved)
        kept = [h for h in merged if h.last_ms >= keep_after_ms]
        with self._lock, self._storage("forget stored batches"):
            try:
                self._forget(upto_seq, kept, dropped_holdings=len(merged) - len(kept))
            except sqlite3.Error as e:
                self._rollback()
                if not _full(e):
                    raise
                self._db.execute("PRAGMA journal_mode=MEMORY")  # no room for a journal
                try:
                    self._forget(upto_seq, kept, dropped_holdings=len(merged) - len(kept))
                finally:
                    with suppress(sqlite3.Error):
                        self._db.execute(f"PRAGMA journal_mode={_JOURNAL}")
        return len(merged) - len(kept)


def batches_holdings(batches: Sequence[Batch]) -> list[Holding]:
    return [h for b in batches for h in b.holdings]
