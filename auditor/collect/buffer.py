"""The sampler's bounded on-disk buffer: what was read but not yet stored survives an outage.

A local SQLite file (stdlib `sqlite3`, one writer: the sampler) holds batches in the order
they were read. The sampler appends each pass, and on flush writes the oldest batches to the
store, deleting them only after the store committed (a replay is harmless: writes are
idempotent). When full, the oldest batch is dropped and counted. It also keeps the pod
holdings that could not yet be joined to a pod the watcher recorded, as spans per
(namespace, pod, GPU), until they resolve or grow too old.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path

from auditor.model import GpuRecord, GpuSample


@dataclass(frozen=True, slots=True)
class Holding:
    """A pod seen holding a GPU from `first_ms` to `last_ms` (pod-resources, by name)."""

    namespace: str
    pod: str
    gpu_uuid: str
    first_ms: int
    last_ms: int


@dataclass(frozen=True, slots=True)
class Batch:
    """One sampler pass: the GPUs, their samples, and who held them."""

    gpus: tuple[GpuRecord, ...]
    samples: tuple[GpuSample, ...]
    holdings: tuple[Holding, ...]


def encode_batch(batch: Batch) -> str:
    return json.dumps(
        [
            [astuple(g) for g in batch.gpus],
            [astuple(s) for s in batch.samples],
            [astuple(h) for h in batch.holdings],
        ],
        separators=(",", ":"),
    )


def decode_batch(text: str) -> Batch:
    gpus, samples, holdings = json.loads(text)
    return Batch(
        tuple(GpuRecord(*g) for g in gpus),
        tuple(GpuSample(*s) for s in samples),
        tuple(Holding(*h) for h in holdings),
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS unresolved (
    namespace TEXT NOT NULL, pod TEXT NOT NULL, gpu_uuid TEXT NOT NULL,
    first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, pod, gpu_uuid));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class DiskBuffer:
    """Batches waiting for the store, oldest first, at most `max_batches` of them."""

    def __init__(self, path: Path, *, max_batches: int) -> None:
        if max_batches < 1:
            raise ValueError("max_batches must be at least 1")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_batches = max_batches
        self._lock = threading.RLock()  # the sampling loop appends while the flusher stores
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __len__(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT count(*) FROM batches").fetchone()
        return int(n)

    def counter(self, name: str) -> int:
        with self._lock:
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
        """Batches dropped, oldest first, because the buffer was full (since it was created)."""
        return self.counter("dropped_batches")

    def push(self, batch: Batch) -> int:
        """Append a batch; drop the oldest beyond the bound. Returns how many were dropped."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO batches (body) VALUES (?)", (encode_batch(batch),))
            excess = len(self) - self.max_batches
            if excess > 0:
                self._db.execute(
                    "DELETE FROM batches WHERE seq IN "
                    "(SELECT seq FROM batches ORDER BY seq LIMIT ?)",
                    (excess,),
                )
            self._bump("dropped_batches", max(excess, 0))
        return max(excess, 0)

    def oldest(self, limit: int) -> list[tuple[int, Batch]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, body FROM batches ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [(int(seq), decode_batch(body)) for seq, body in rows]

    def unresolved(self) -> list[Holding]:
        with self._lock:
            rows = self._db.execute(
                "SELECT namespace, pod, gpu_uuid, first_ms, last_ms FROM unresolved"
            ).fetchall()
        return [Holding(*r) for r in rows]

    def stored(self, *, upto_seq: int, unresolved: Iterable[Holding], keep_after_ms: int) -> int:
        """The store committed batches up to `upto_seq`: forget them, and keep the holdings
        still unresolved unless last seen before `keep_after_ms`. Returns holdings dropped."""
        merged = merge_holdings(unresolved)
        kept = [h for h in merged if h.last_ms >= keep_after_ms]
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM batches WHERE seq <= ?", (upto_seq,))
            self._db.execute("DELETE FROM unresolved")
            self._db.executemany(
                "INSERT INTO unresolved VALUES (?, ?, ?, ?, ?)", [astuple(h) for h in kept]
            )
            self._bump("dropped_holdings", len(merged) - len(kept))
        return len(merged) - len(kept)


def merge_holdings(holdings: Iterable[Holding]) -> list[Holding]:
    """One span per (namespace, pod, GPU), widened over every observation."""
    spans: dict[tuple[str, str, str], Holding] = {}
    for h in holdings:
        key = (h.namespace, h.pod, h.gpu_uuid)
        old = spans.get(key)
        spans[key] = (
            h
            if old is None
            else Holding(*key, min(old.first_ms, h.first_ms), max(old.last_ms, h.last_ms))
        )
    return list(spans.values())


def batches_holdings(batches: Sequence[Batch]) -> list[Holding]:
    return [h for b in batches for h in b.holdings]
