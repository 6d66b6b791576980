"""Where the watcher's lists and events go: the store, one transaction per batch.

`PodSink` keeps only pods that request GPUs (the API cannot filter on resources), through
the same `pod_record` the kubectl importer uses, so times come from the pods' own status
timestamps and a replay writes identical rows. A relist upserts every listed pod and closes
the tenure of every open pod in the watcher's scope that the list no longer shows: deleted
at the relist time, marked estimated. `NodeSink` keeps each node's latest view.

Each sink stores its watch cursor in the transaction of the writes it covers. Database
failures leave as `StoreError`, which the loop backs off from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from auditor.collect.kube import Event
from auditor.collect.nodes import node_row
from auditor.collect.selectors import matcher
from auditor.collect.workloads import gpu_request, pod_record
from auditor.errors import InputError, StoreError
from auditor.model import PodRecord
from auditor.redact import redact
from auditor.settings import TeamRules

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

log = logging.getLogger("auditor.watch")

CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})
"""Event types that carry an object; any other (BOOKMARK, a future one) moves the cursor only."""


def scope_filter(
    namespace: str | None, selector: str | None
) -> Callable[[str, Mapping[str, str]], bool]:
    """Could a watch of this namespace and label selector have shown a pod?"""
    selects = matcher(selector)
    return lambda ns, labels: (namespace is None or ns == namespace) and selects(labels)


def requests_gpus(pod: Mapping[str, Any]) -> bool:
    """Keep a listed pod for the sink? Yes when it requests GPUs, or cannot be read (the sink
    then says why it skips it)."""
    try:
        spec = pod.get("spec")
        return gpu_request(spec if isinstance(spec, Mapping) else {})[0] > 0
    except InputError:
        return True


class _StoreSink:
    def __init__(self, engine: Engine, *, scope: str) -> None:
        self.engine = engine
        self.scope = scope

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as e:
            cause = getattr(e, "orig", None) or e
            raise StoreError(f"cannot write to the database: {redact(str(cause))}") from e

    def cursor(self) -> str | None:
        from auditor.store.writes import read_cursor

        with self._transaction() as conn:
            return read_cursor(conn, self.scope)

    def _save_cursor(self, conn: Connection, resource_version: str, at_ms: int) -> None:
        from auditor.store.writes import write_cursor

        write_cursor(conn, self.scope, resource_version=resource_version, at_ms=at_ms)


class PodSink(_StoreSink):
    def __init__(
        self,
        engine: Engine,
        *,
        scope: str,
        teams: TeamRules,
        in_scope: Callable[[str, Mapping[str, str]], bool],
    ) -> None:
        super().__init__(engine, scope=scope)
        self.teams = teams
        self.in_scope = in_scope

    def _record(self, obj: Mapping[str, Any], **kwargs: Any) -> PodRecord | None:
        try:
            return pod_record(obj, teams=self.teams, **kwargs)
        except InputError as e:
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            log.warning("skipping pod %s: %s", name, e)
            return None

    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        from auditor.store.writes import close_missing_pods, upsert_pods

        records = [r for r in (self._record(i) for i in items) if r is not None]
        listed = {r.uid for r in records}
        with self._transaction() as conn:
            upsert_pods(conn, records)
            gone = close_missing_pods(conn, listed_uids=listed, at_ms=at_ms, in_scope=self.in_scope)
            self._save_cursor(conn, resource_version, at_ms)
        if gone:
            log.info(
                "closed %d pods gone while unwatched", len(gone), extra={"rv": resource_version}
            )
        return len(records)

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        from auditor.store.writes import upsert_pods

        with self._transaction() as conn:
            known = self._known_deletions(conn, events)
            records: list[PodRecord] = []
            for event in events:
                if event.type not in CHANGES:
                    continue
                deleted = event.type == "DELETED"
                uid = _uid(event.obj)
                rec = self._record(
                    event.obj, deleted=deleted, event_ms=known.get(uid, at_ms) if deleted else None
                )
                if rec is not None:
                    records.append(rec)
            upsert_pods(conn, records)
            self._save_cursor(conn, resource_version, at_ms)
        return len(records)

    @staticmethod
    def _known_deletions(conn: Connection, events: list[Event]) -> dict[str | None, int]:
        """Deletion times already stored for pods a DELETED event removes without a
        `deletionTimestamp`, so a replay keeps the time first seen instead of its own."""
        from sqlalchemy import select

        from auditor.store.schema import pods

        uids = [
            _uid(e.obj)
            for e in events
            if e.type == "DELETED" and not (e.obj.get("metadata") or {}).get("deletionTimestamp")
        ]
        if not uids:
            return {}
        rows = conn.execute(
            select(pods.c.uid, pods.c.deleted_ms).where(
                pods.c.uid.in_(uids), pods.c.deleted_ms.is_not(None)
            )
        )
        return {uid: int(ms) for uid, ms in rows}


class NodeSink(_StoreSink):
    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        return self._write(self._rows(items, at_ms), resource_version, at_ms)

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        rows = self._rows([e.obj for e in events if e.type in CHANGES], at_ms)
        return self._write(rows, resource_version, at_ms)

    @staticmethod
    def _rows(objs: list[dict[str, Any]], at_ms: int) -> list[dict[str, Any]]:
        rows = []
        for obj in objs:
            try:
                rows.append(node_row(obj, at_ms=at_ms))
            except InputError as e:
                log.warning("skipping node: %s", e)
        return rows

    def _write(self, rows: list[dict[str, Any]], resource_version: str, at_ms: int) -> int:
        from auditor.store.writes import upsert_nodes

        with self._transaction() as conn:
            upsert_nodes(conn, rows)
            self._save_cursor(conn, resource_version, at_ms)
        return len(rows)


def _uid(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else None
