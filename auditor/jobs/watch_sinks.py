"""Where the watcher's lists and events go: the store, one transaction per batch.

`PodSink` keeps only pods that request GPUs (the API cannot filter on resources), through
the same `pod_record` the kubectl importer uses, so times come from the pods' own status
timestamps and a replay writes identical rows. A relist upserts every listed pod and closes
the tenure of every open pod in the watcher's scope that the list no longer shows: deleted
at the relist time, marked estimated. A pod waiting to be scheduled is seen waiting at each
event or list that shows it, and at most a minute apart while the watch runs
(`WAIT_REFRESH_MS`). `NodeSink` keeps each node's latest view, and the stretches in which
it was cordoned, not Ready or short of cards (`auditor.store.outages`).

Each sink stores its watch cursor in the transaction of the writes it covers. Database
failures leave as `StoreError`, which the loop backs off from.

One object never stops the others. A pod that cannot be read, or whose record the store
would refuse (`auditor.store.bounds`), is logged, counted through `on_skip` and skipped.
Should the database still refuse a batch for its data (a limit nothing checked), the batch
is written again one object per transaction, the refused ones skipped: a poisoned batch is
never retried forever. Only a failure of the database itself (down, locked, full) keeps
the cursor where it was and backs off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from auditor.agents.watch.kube import Event
from auditor.collect.gpu_requests import pod_gpu_ask
from auditor.collect.nodes import node_row
from auditor.collect.pod_records import pod_record
from auditor.collect.selectors import matcher
from auditor.collect.shares import hami_assignments
from auditor.errors import InputError, StoreError, shown
from auditor.model import DEFAULT_CLUSTER, PodRecord
from auditor.settings import Sharing, TeamRules
from auditor.store.bounds import RowError, check_row, is_data_error
from auditor.store.connection import transaction
from auditor.store.pod_writes import known_deletions, pod_row
from auditor.store.schema import nodes, pods

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

log = logging.getLogger("auditor.watch")
T = TypeVar("T")
R = TypeVar("R")
Describe = Callable[[T], str]

WAIT_REFRESH_MS = 60_000
"""How often a watched batch also marks the pods still waiting to be scheduled as seen then
(a wait with no event lasts, and the watch is the proof): at most once a minute."""
CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})
"""Event types that carry an object; any other (BOOKMARK, a future one) moves the cursor only."""


def scope_filter(
    namespace: str | None, selector: str | None
) -> Callable[[str, Mapping[str, str]], bool]:
    """Could a watch of this namespace and label selector have shown a pod?"""
    selects = matcher(selector)
    return lambda ns, labels: (namespace is None or ns == namespace) and selects(labels)


def requests_gpus(pod: Mapping[str, Any], sharing: Sharing | None = None) -> bool:
    """Keep a listed pod for the sink? Yes when it holds GPUs or a share of one (SPEC §7,
    annotations included), is a Run:ai reservation pod, or cannot be read (the sink then
    says why it skips it)."""
    try:
        spec = pod.get("spec")
        meta = _meta(pod)
        annotations = meta.get("annotations")
        namespace = meta.get("namespace")
        ask = pod_gpu_ask(
            spec if isinstance(spec, Mapping) else {},
            namespace=namespace if isinstance(namespace, str) else "",
            annotations={k: v for k, v in (annotations or {}).items() if isinstance(v, str)}
            if isinstance(annotations, Mapping)
            else {},
            sharing=sharing,
        )
        return ask.count > 0 or ask.share_kind is not None
    except InputError:
        return True


Skip = Callable[[str], None]
"""Told the reason each time an object is skipped (`unreadable`, `unstorable`, `refused`)."""


class _StoreSink:
    def __init__(
        self,
        engine: Engine,
        *,
        scope: str,
        on_skip: Skip | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        """The cluster watched: its pods and nodes are written, and only its are closed."""
        self.scope = scope if cluster == DEFAULT_CLUSTER else f"{cluster}:{scope}"
        """The cursor's key: a watcher of another cluster resumes from its own."""
        self.on_skip: Skip = on_skip or (lambda _reason: None)

    def _skip(self, what: str, error: object, *, reason: str) -> None:
        log.warning("skipping %s: %s", what, error, extra={"reason": reason})
        self.on_skip(reason)

    def _commit(
        self,
        items: list[T],
        write: Callable[[Connection, list[T]], object],
        what: Describe[T],
        *,
        resource_version: str,
        at_ms: int,
        then: Callable[[Connection], R] | None = None,
    ) -> tuple[list[T], R | None]:
        """Write `items`, then `then` (if given) and the cursor, in one transaction; returns
        the items written and what `then` returned. A batch the database refuses for its
        data is written again one item per transaction, the refused ones skipped, and then
        the rest: the cursor moves on, a poisoned batch is never retried forever."""
        try:
            with self._transaction() as conn:
                write(conn, items)
                after = then(conn) if then is not None else None
                self._save_cursor(conn, resource_version, at_ms)
            return items, after
        except StoreError as e:
            if not is_data_error(e.__cause__):
                raise
        written = self._write_each(items, write, what)
        with self._transaction() as conn:
            after = then(conn) if then is not None else None
            self._save_cursor(conn, resource_version, at_ms)
        return written, after

    def _write_each(
        self, items: Sequence[T], write: Callable[[Connection, list[T]], object], what: Describe[T]
    ) -> list[T]:
        """Write `items` one per transaction, skipping those the database refuses for their
        data; returns those written. For a batch refused as a whole."""
        written: list[T] = []
        for item in items:
            try:
                with self._transaction() as conn:
                    write(conn, [item])
            except StoreError as e:
                if not is_data_error(e.__cause__):
                    raise
                self._skip(what(item), e, reason="refused")
            else:
                written.append(item)
        return written

    def _transaction(self) -> AbstractContextManager[Connection]:
        return transaction(self.engine)

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
        on_skip: Skip | None = None,
        sharing: Sharing | None = None,
        after: Callable[[], None] | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        super().__init__(engine, scope=scope, on_skip=on_skip, cluster=cluster)
        self.after = after
        """Called after each write (the DRA claims waiting for their pods: `watch_dra`)."""
        self.teams = teams
        self.in_scope = in_scope
        self.sharing = sharing
        self._waits_seen_ms = 0
        """When the waiting pods were last marked seen (`touch_waiting_pods`)."""

    def _record(self, obj: Mapping[str, Any], **kwargs: Any) -> PodRecord | None:
        """The pod's record, or None when it requests no GPU or is skipped (logged, counted)."""
        adjusted: list[str] = []
        try:
            rec = pod_record(
                obj, teams=self.teams, adjusted=adjusted, sharing=self.sharing, **kwargs
            )
            if rec is not None:
                check_row(pods, pod_row(rec), what="pod")
        except RowError as e:
            self._skip(_describe(obj), e, reason="unstorable")
            return None
        except InputError as e:
            self._skip(_describe(obj), e, reason="unreadable")
            return None
        except Exception as e:  # a shape no rule foresaw: this pod, not the watcher, fails
            self._skip(_describe(obj), f"{type(e).__name__}: {e}", reason="unreadable")
            return None
        if adjusted:
            log.warning(
                "pod %s: shortened %s to fit the store", _describe(obj), ", ".join(adjusted)
            )
        return rec

    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        from auditor.store.pod_writes import close_missing_pods

        records = [r for r in (self._record(i, seen_ms=at_ms) for i in items) if r is not None]
        # a listed pod that was skipped still exists: it must not be closed as gone
        listed = {r.uid for r in records} | {u for u in map(_uid, items) if u is not None}
        records, gone = self._commit(
            records,
            self._write_pods,
            _describe_record,
            resource_version=resource_version,
            at_ms=at_ms,
            then=lambda conn: close_missing_pods(
                conn,
                listed_uids=listed,
                at_ms=at_ms,
                in_scope=self.in_scope,
                cluster=self.cluster,
            ),
        )
        self._waits_seen_ms = at_ms
        if self.after is not None:
            self.after()
        if gone:
            log.info(
                "closed %d pods gone while unwatched", len(gone), extra={"rv": resource_version}
            )
        return len(records)

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        with self._transaction() as conn:
            known = self._known_deletions(conn, events)
        records: list[PodRecord] = []
        for event in events:
            if event.type not in CHANGES:
                continue
            deleted = event.type == "DELETED"
            uid = _uid(event.obj)
            rec = self._record(
                event.obj,
                deleted=deleted,
                event_ms=known.get(uid, at_ms) if deleted else None,
                seen_ms=at_ms,
            )
            if rec is not None:
                records.append(rec)
        refresh = at_ms - self._waits_seen_ms >= WAIT_REFRESH_MS
        records, _ = self._commit(
            records,
            self._write_pods,
            _describe_record,
            resource_version=resource_version,
            at_ms=at_ms,
            then=(lambda conn: self._still_waiting(conn, at_ms)) if refresh else None,
        )
        if refresh:
            self._waits_seen_ms = at_ms
        if self.after is not None and records:
            self.after()
        return len(records)

    def _still_waiting(self, conn: Connection, at_ms: int) -> int:
        """A pod the watch says nothing new of is as it was: one still waiting to be
        scheduled is seen waiting at `at_ms` (its wait is known to last until then)."""
        from auditor.store.pod_writes import touch_waiting_pods

        return touch_waiting_pods(conn, at_ms=at_ms, in_scope=self.in_scope, cluster=self.cluster)

    @staticmethod
    def _known_deletions(conn: Connection, events: list[Event]) -> dict[str | None, int]:
        """Deletion times already stored for pods a DELETED event removes without a
        `deletionTimestamp`, so a replay keeps the time first seen instead of its own."""
        uids = [
            _uid(e.obj)
            for e in events
            if e.type == "DELETED" and not _meta(e.obj).get("deletionTimestamp")
        ]
        found = known_deletions(conn, [u for u in uids if u is not None])
        return {uid: ms for uid, ms in found.items()}

    def _write_pods(self, conn: Connection, records: list[PodRecord]) -> None:
        """Pods, and the cards HAMi's annotation names for them (SPEC §7)."""
        from auditor.store.pod_writes import upsert_pods
        from auditor.store.writes import upsert_exact_assignments

        upsert_pods(conn, records, cluster=self.cluster)
        upsert_exact_assignments(
            conn, hami_assignments(records), source="hami", cluster=self.cluster
        )


class NodeSink(_StoreSink):
    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        return self._write(self._rows(items, at_ms), resource_version, at_ms)

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        rows = self._rows([e.obj for e in events if e.type in CHANGES], at_ms)
        return self._write(rows, resource_version, at_ms)

    def _rows(self, objs: list[dict[str, Any]], at_ms: int) -> list[dict[str, Any]]:
        rows = []
        for obj in objs:
            try:
                row = node_row(obj, at_ms=at_ms)
                check_row(nodes, row, what="node")
            except RowError as e:
                self._skip(_describe(obj, kind="node"), e, reason="unstorable")
            except InputError as e:
                self._skip(_describe(obj, kind="node"), e, reason="unreadable")
            except Exception as e:  # a shape no rule foresaw
                self._skip(
                    _describe(obj, kind="node"), f"{type(e).__name__}: {e}", reason="unreadable"
                )
            else:
                rows.append(row)
        return rows

    def _write(self, rows: list[dict[str, Any]], resource_version: str, at_ms: int) -> int:
        rows, _ = self._commit(
            rows,
            self._write_nodes,
            lambda r: f"node {shown(r.get('name'), 80)}",
            resource_version=resource_version,
            at_ms=at_ms,
        )
        return len(rows)

    def _write_nodes(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Nodes' latest views, and the outages each observation shows (SPEC §10)."""
        from auditor.store.outages import record_node_states
        from auditor.store.writes import upsert_nodes

        upsert_nodes(conn, rows, cluster=self.cluster)
        record_node_states(conn, [r["state"] for r in rows if "state" in r], cluster=self.cluster)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _describe(obj: Mapping[str, Any], *, kind: str = "pod") -> str:
    """`pod NS/NAME` for a log line, whatever the object holds (names cut, escaped)."""
    meta = _meta(obj)
    parts = [meta.get("namespace"), meta.get("name")]
    name = "/".join(p if isinstance(p, str) else "?" for p in parts if p is not None) or "?"
    return f"{kind} {shown(name, 80)}"


def _describe_record(rec: PodRecord) -> str:
    return f"pod {shown(f'{rec.namespace}/{rec.name}', 80)}"


def _uid(obj: Mapping[str, Any]) -> str | None:
    uid = _meta(obj).get("uid")
    return uid if isinstance(uid, str) else None
