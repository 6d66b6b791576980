"""Where the sampler's batches go: the auditor's store, in one idempotent transaction.

Pod-resources names a pod by namespace/name, while the store keys pods by UID (recorded by
the watcher or `import pods`). A holding is joined to the pod of that name whose tenure
(bound, or created, until finished or deleted, give or take `slack_ms`) overlaps it, the
latest such pod where a name was reused. A holding whose pod is not stored yet is handed
back, to be tried again on the next flush.

A GPU the store already has on another node (or as another model) is not written: moving it
would move its past samples. Its samples and holdings are skipped and reported back, and
the other cards of the batch are written as usual.

Pods' cgroup signals go to `pod_signals` (source `cgroup`), cards' PCIe and NVLink traffic
to `card_signals` (SPEC §10), replacing a replayed pass's rows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select

from auditor.errors import shown
from auditor.model import (
    DEFAULT_CLUSTER,
    Batch,
    CardSignal,
    GpuRecord,
    Holding,
    PodSignal,
    Written,
    merge_holdings,
)
from auditor.store.bounds import RowError, check_row, is_data_error
from auditor.store.schema import gpus, pods
from auditor.store.signals import write_card_signals, write_pod_signals
from auditor.store.writes import (
    ShareSeen,
    gpu_conflicts,
    gpu_row,
    insert_samples,
    insert_tenant_samples,
    upsert_assignments,
    upsert_gpus,
)

SOURCE = "pod-resources"
log = logging.getLogger(__name__)


class StoreSink:
    """Writes batches to the auditor's database, connecting on first use (and again after a
    failed connection), so a sampler starts while the database is down."""

    def __init__(
        self,
        connect: Callable[[], Engine],
        *,
        slack_ms: int = 60_000,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self._connect = connect
        self._engine: Engine | None = None
        self.slack_ms = slack_ms
        self.cluster = cluster
        """The cluster of the node sampled: its cards', and the pods its holdings name."""

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self._connect()
        return self._engine

    def write(self, batches: Sequence[Batch], *, pending: Sequence[Holding]) -> Written:
        with self.engine.begin() as conn:
            conflicts = gpu_conflicts(
                conn, [g for b in batches for g in b.gpus], cluster=self.cluster
            )
            refused = {c.uuid for c in conflicts} | _unstorable(g for b in batches for g in b.gpus)
            latest = {g.uuid: g for b in batches for g in b.gpus if g.uuid not in refused}
            ids = upsert_gpus(conn, latest.values(), cluster=self.cluster)
            samples = [s for b in batches for s in b.samples if s.gpu_uuid not in refused]
            skipped = sum(len(b.samples) for b in batches) - len(samples)
            holdings = merge_holdings(
                h
                for h in [*pending, *(h for b in batches for h in b.holdings)]
                if h.gpu_uuid not in refused
            )
            missing = {h.gpu_uuid for h in holdings} - set(ids)
            if missing:  # holdings of GPUs seen in an earlier flush
                known = conn.execute(select(gpus.c.uuid, gpus.c.id).where(gpus.c.uuid.in_(missing)))
                ids.update({u: i for u, i in known})
            insert_samples(conn, samples, ids)
            insert_tenant_samples(
                conn, [t for b in batches for t in b.tenants if t.gpu_uuid not in refused], ids
            )
            pod_rows = {(p.pod_uid, p.ts_ms): p for b in batches for p in b.pod_signals}
            write_pod_signals(conn, [{"source": "cgroup", **_fields(p)} for p in pod_rows.values()])
            card_rows = {
                (c.gpu_uuid, c.ts_ms): c
                for b in batches
                for c in b.card_signals
                if c.gpu_uuid in ids
            }
            write_card_signals(
                conn, [{**_fields(c), "gpu_id": ids[c.gpu_uuid]} for c in card_rows.values()]
            )
            shares: dict[tuple[str, int], ShareSeen] = {}
            seen, unresolved = resolve_holdings(
                conn, holdings, ids, slack_ms=self.slack_ms, shares=shares, cluster=self.cluster
            )
            upsert_assignments(conn, seen, source=SOURCE, shares=shares)
        return Written(unresolved, tuple(conflicts), skipped)

    def is_refusal(self, error: BaseException) -> bool:
        """Did the database refuse a write for its data, rather than fail itself?"""
        return is_data_error(error)


def _fields(row: PodSignal | CardSignal) -> dict[str, Any]:
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


def _unstorable(records: Iterable[GpuRecord]) -> set[str]:
    """GPUs whose record the store cannot hold (a UUID or model name longer than its column):
    logged and left out, so one odd card does not fail every flush."""
    bad: set[str] = set()
    for rec in records:
        try:
            check_row(gpus, gpu_row(rec), what=f"GPU {shown(rec.uuid)}")
        except RowError as e:
            if rec.uuid not in bad:
                log.warning("skipping %s", e)
            bad.add(rec.uuid)
    return bad


Tenure = tuple[str, int, int | None]
"""A stored pod's (uid, start, end): bound (else created) to finished/deleted, end None if
still running."""


def resolve_holdings(
    conn: Connection,
    holdings: Sequence[Holding],
    gpu_ids: Mapping[str, int],
    *,
    slack_ms: int,
    shares: dict[tuple[str, int], ShareSeen] | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> tuple[list[tuple[str, int, int]], list[Holding]]:
    """Holdings joined to stored pods of `cluster` by namespace/name and time (a name is
    unique only inside a cluster), as (pod_uid, gpu_id, ts)
    observations for `upsert_assignments`; and the holdings whose pod is not stored.
    `shares`, when given, is filled with the time-slicing replicas of each joined holding
    that has them."""
    names = {(h.namespace, h.pod) for h in holdings}
    tenures: dict[tuple[str, str], list[Tenure]] = {}
    if names:
        rows = conn.execute(
            select(
                pods.c.namespace,
                pods.c.name,
                pods.c.uid,
                pods.c.bound_ms,
                pods.c.created_ms,
                pods.c.finished_ms,
                pods.c.deleted_ms,
            ).where(
                pods.c.cluster == cluster,
                pods.c.namespace.in_({n for n, _ in names}),
                pods.c.name.in_({p for _, p in names}),
            )
        )
        for ns, name, uid, bound, created, finished, deleted in rows:
            start = bound if bound is not None else created
            ends = [t for t in (finished, deleted) if t is not None]
            tenures.setdefault((ns, name), []).append(
                (uid, start if start is not None else 0, min(ends) if ends else None)
            )
    seen: list[tuple[str, int, int]] = []
    unresolved: list[Holding] = []
    for h in holdings:
        uid = _pod_uid(tenures.get((h.namespace, h.pod), []), h, slack_ms)
        gpu_id = gpu_ids.get(h.gpu_uuid)
        if uid is None or gpu_id is None:
            unresolved.append(h)
            continue
        seen += [(uid, gpu_id, h.first_ms), (uid, gpu_id, h.last_ms)]
        if shares is not None and h.replicas is not None:
            shares[(uid, gpu_id)] = (h.replicas, None)
    return seen, unresolved


def _pod_uid(candidates: list[Tenure], h: Holding, slack_ms: int) -> str | None:
    """The latest-started pod of that name whose tenure overlaps the holding."""
    fitting = [
        (start, uid)
        for uid, start, end in candidates
        if start <= h.last_ms + slack_ms and (end is None or end >= h.first_ms - slack_ms)
    ]
    return max(fitting)[1] if fitting else None
