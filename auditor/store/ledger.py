"""The imports ledger: what each import wrote, and taking one back exactly.

Every import opens its ledger row first (`begin`), in its own transaction, and closes it with
what it wrote (`finish`); a refused import rolls its row back with the rest. A sample
import tags every sample it stores with the row's id (`gpu_samples.import_id`); a sample it
offered that was stored already keeps the id of the import that stored it.

`undo` of a sample import (`SAMPLE_KINDS`), in one transaction, all or nothing:

- deletes the samples tagged with its id (a range read per card, within the first and last
  time it offered; no index on the tag), and refuses, changing nothing, when fewer are
  stored raw than it wrote: `auditor rollup` has folded some into 1-minute rows mixed with
  other samples, which no delete can separate;
- deletes the audit runs created after the import whose window overlaps its samples: they
  counted them, so they are wrong now; they are named, for the caller to say re-audit;
- deletes the cards the import added to `gpus` that nothing else refers to any more (no
  sample, minute row or audit row of theirs left, no GPU -> pod mapping another source
  recorded), with the dcgm-exporter mappings and the PCIe/NVLink rows of them: an import with
  the wrong `--node` leaves no card behind on the wrong node;
- keeps its row, marked undone, so an id is never given twice.

It does not take back the attributes an import filled in on cards that were there before
(index, memory total, utilisation source), nor a Prometheus import's GPU -> pod mappings and
signal rows of cards it did not add: those are merged with what other sources said. Pods
and outputs imports merge into what other sources said (later observations win, intervals
are replaced) and keep no record of what was there before, so they are listed and refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    RowMapping,
    and_,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)

from auditor import limits
from auditor.errors import InputError
from auditor.store.schema import (
    audit_causes,
    audit_findings,
    audit_free_shares,
    audit_results,
    audit_runs,
    audit_sm,
    card_signals,
    gpu_assignments,
    gpu_samples,
    gpu_samples_1m,
    gpu_tenant_util,
    gpus,
    imports,
)

SAMPLE_KINDS = ("nvidia-smi", "prometheus")
"""The imports `undo` can take back: every row they store carries their id."""
OWN_ASSIGNMENTS: Mapping[str, tuple[str, ...]] = {"prometheus": ("dcgm-exporter",)}
"""The GPU -> pod mapping sources an import kind writes (deleted with a card it added)."""


@dataclass(frozen=True)
class Entry:
    """One ledger row, as `auditor import list` shows it."""

    id: int
    kind: str
    source: str
    options: Mapping[str, Any]
    created_ms: int
    rows_written: int
    cards: int
    first_ms: int | None
    last_ms: int | None
    undone_ms: int | None


@dataclass(frozen=True)
class StaleRun:
    """An audit run that counted samples an undo removed."""

    id: int
    start_ms: int
    end_ms: int
    shard: str


@dataclass(frozen=True)
class Undone:
    entry: Entry
    samples: int
    """Samples deleted: the import's `rows_written`."""
    runs: tuple[StaleRun, ...]
    """Audit runs deleted: re-audit their windows."""
    gpus: tuple[str, ...]
    """UUIDs of the cards the import had added and nothing else refers to, deleted."""


def begin(
    conn: Connection, *, kind: str, source: str, options: Mapping[str, Any], now_ms: int
) -> int:
    """Open the ledger row of an import in its transaction; its id tags what it writes."""
    row = {
        "kind": kind,
        "source": limits.fit_text(source, limits.SOURCE_MAX),
        "options": dict(options),
        "created_ms": now_ms,
        "rows_written": 0,
        "gpu_ids": [],
        "gpus_created": [],
    }
    return int(conn.execute(insert(imports).returning(imports.c.id), row).scalar_one())


def last_gpu_id(conn: Connection) -> int:
    """The highest `gpus` id now: the ids above it an import returns are cards it added."""
    return int(conn.execute(select(func.max(gpus.c.id))).scalar() or 0)


def finish(
    conn: Connection,
    import_id: int,
    *,
    rows_written: int,
    gpu_ids: Iterable[int] = (),
    gpus_created: Iterable[int] = (),
    span: tuple[int, int] | None = None,
) -> None:
    """Close an import's ledger row: rows it stored, the cards it offered samples of, those
    it added to `gpus`, and the first and last sample time it offered (`span`)."""
    conn.execute(
        update(imports)
        .where(imports.c.id == import_id)
        .values(
            rows_written=rows_written,
            gpu_ids=sorted(set(gpu_ids)),
            gpus_created=sorted(set(gpus_created)),
            first_ms=None if span is None else span[0],
            last_ms=None if span is None else span[1],
        )
    )


def entries(conn: Connection) -> list[Entry]:
    """Every import, oldest first."""
    rows = conn.execute(select(imports).order_by(imports.c.id)).mappings()
    return [_entry(r) for r in rows]


def _entry(r: RowMapping) -> Entry:
    return Entry(
        id=int(r["id"]),
        kind=str(r["kind"]),
        source=str(r["source"]),
        options=dict(r["options"] or {}),
        created_ms=int(r["created_ms"]),
        rows_written=int(r["rows_written"]),
        cards=len(r["gpu_ids"] or []),
        first_ms=r["first_ms"],
        last_ms=r["last_ms"],
        undone_ms=r["undone_ms"],
    )


def undo(conn: Connection, import_id: int, *, now_ms: int) -> Undone:
    """Take import `import_id` back in the caller's transaction (the module says what that
    removes); a one-line `InputError`, nothing changed, for an id that names no import, one
    taken back already, one that is not a sample import, or one partly rolled up."""
    row = (
        conn.execute(select(imports).where(imports.c.id == import_id).with_for_update())
        .mappings()
        .first()
    )
    if row is None:
        raise InputError(
            f"no import {import_id} in this database (auditor import list shows them)",
            field="ID",
        )
    entry = _entry(row)
    if entry.undone_ms is not None:
        raise InputError(f"import {import_id} was taken back already", field="ID")
    if entry.kind not in SAMPLE_KINDS:
        raise InputError(
            f"import {import_id} is a {entry.kind} import: its records were merged with what "
            "other sources said, so it cannot be taken back exactly; nothing was changed "
            f"(only {' and '.join(SAMPLE_KINDS)} imports can)",
            field="ID",
        )
    ids = [int(i) for i in row["gpu_ids"] or []]
    samples = 0
    if entry.rows_written:
        assert entry.first_ms is not None
        assert entry.last_ms is not None
        mine = and_(
            gpu_samples.c.gpu_id.in_(ids),
            gpu_samples.c.ts_ms.between(entry.first_ms, entry.last_ms),
            gpu_samples.c.import_id == import_id,
        )
        stored = int(conn.execute(select(func.count()).where(mine)).scalar_one())
        if stored < entry.rows_written:
            raise InputError(
                f"import {import_id} wrote {entry.rows_written} samples and {stored} of them "
                "are stored raw: the others were rolled up into 1-minute rows with other "
                "samples (auditor rollup), which cannot be taken apart; nothing was changed",
                field="ID",
            )
        samples = conn.execute(delete(gpu_samples).where(mine)).rowcount
    runs = _stale_runs(conn, entry) if samples else []
    _delete_runs(conn, [r.id for r in runs])
    created = [int(i) for i in row["gpus_created"] or []]
    gone = _delete_orphans(conn, created, own=OWN_ASSIGNMENTS.get(entry.kind, ()))
    conn.execute(update(imports).where(imports.c.id == import_id).values(undone_ms=now_ms))
    return Undone(entry, int(samples), tuple(runs), tuple(gone))


def _stale_runs(conn: Connection, entry: Entry) -> list[StaleRun]:
    """Audit runs made after the import whose window overlaps the samples it offered."""
    assert entry.first_ms is not None
    assert entry.last_ms is not None
    rows = conn.execute(
        select(
            audit_runs.c.id, audit_runs.c.window_start_ms, audit_runs.c.window_end_ms,
            audit_runs.c.shard,
        )
        .where(
            audit_runs.c.created_ms >= entry.created_ms,
            audit_runs.c.window_start_ms <= entry.last_ms,
            audit_runs.c.window_end_ms > entry.first_ms,
        )
        .order_by(audit_runs.c.window_start_ms, audit_runs.c.shard)
    )  # fmt: skip
    return [StaleRun(int(i), int(a), int(b), str(s)) for i, a, b, s in rows]


def _delete_runs(conn: Connection, run_ids: Sequence[int]) -> None:
    if not run_ids:
        return
    for table in (audit_results, audit_findings, audit_sm, audit_causes, audit_free_shares):
        conn.execute(delete(table).where(table.c.run_id.in_(run_ids)))
    conn.execute(delete(audit_runs).where(audit_runs.c.id.in_(run_ids)))


def _delete_orphans(conn: Connection, created: Sequence[int], *, own: Sequence[str]) -> list[str]:
    """Delete the cards of `created` nothing refers to any more (a MIG instance before its
    card); the UUIDs deleted."""
    if not created:
        return []
    rows = conn.execute(
        select(gpus.c.id, gpus.c.uuid, gpus.c.parent_uuid).where(gpus.c.id.in_(created))
    )
    cards = sorted(rows, key=lambda r: r[2] is None)  # instances first, then their cards
    gone: list[str] = []
    for gpu_id, uuid, _ in cards:
        if _referred(conn, gpu_id, uuid, own=own):
            continue
        conn.execute(delete(gpu_assignments).where(gpu_assignments.c.gpu_id == gpu_id))
        conn.execute(delete(card_signals).where(card_signals.c.gpu_id == gpu_id))
        conn.execute(delete(gpus).where(gpus.c.id == gpu_id))
        gone.append(str(uuid))
    return gone


def _referred(conn: Connection, gpu_id: int, uuid: str, *, own: Sequence[str]) -> bool:
    """Whether anything but this import's kind of rows still refers to the card."""
    checks = [
        exists().where(t.c.gpu_id == gpu_id)
        for t in (
            gpu_samples,
            gpu_samples_1m,
            gpu_tenant_util,
            audit_results,
            audit_findings,
            audit_sm,
            audit_causes,
            audit_free_shares,
        )
    ]
    checks.append(
        exists().where(gpu_assignments.c.gpu_id == gpu_id, gpu_assignments.c.source.not_in(own))
    )
    checks.append(exists().where(gpus.c.parent_uuid == uuid))
    return bool(conn.execute(select(or_(*checks))).scalar())
