"""The watcher's Dynamic Resource Allocation: ResourceClaims and ResourceSlices into the store.

Two reflectors (claims, slices) feed one `WatchedDra`, which holds what they have seen in
memory (`auditor.collect.dra.DraState`) and writes, in the transaction of each batch, the
slices' cards and the exact assignments (source `dra`) of the claims it can resolve
(`auditor.jobs.dra`). A claim whose pod the store does not hold yet, or whose device no
slice seen publishes yet, is pending: it is tried again after every later batch of claims,
slices or pods (`retry`), so the order the three loops run in does not matter.

Neither sink stores a watch cursor: what they hold is in memory, so each start of the
watcher lists claims and slices again (cheap: one slice per node and driver, one claim per
DRA pod) and the assignments, written idempotently, come out the same. A deleted claim is
forgotten once its holds are written. One object that cannot be read, or a card the store
has on another node, is logged, counted through `on_skip` and skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from auditor.agents.watch.kube import Event
from auditor.collect.dra import DraDevice, DraState, read_claim, read_slice
from auditor.errors import InputError
from auditor.jobs.dra import write_cards, write_holds
from auditor.jobs.watch_sinks import CHANGES, Skip, _describe, _StoreSink
from auditor.model import DEFAULT_CLUSTER

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

log = logging.getLogger("auditor.watch")


class WatchedDra:
    """What the claim and slice loops have seen, shared by them and the pod sink."""

    def __init__(self, engine: Engine, *, cluster: str = DEFAULT_CLUSTER) -> None:
        self.engine = engine
        self.cluster = cluster
        """The cluster watched: the cards its slices name are its."""
        self.state = DraState()
        self.pending: set[str] = set()
        self.gone: set[str] = set()
        """Claims deleted, kept until their holds are written."""
        self.lock = threading.Lock()

    def write(self, conn: Connection, claim_uids: Iterable[str] = ()) -> int:
        """Write the holds of `claim_uids` and of the pending claims; returns the pairs."""
        with self.lock:
            uids = {*claim_uids, *self.pending}
            if not uids:
                return 0
            done = write_holds(conn, self.state, uids)
            self.pending = set(done.pending)
            for uid in self.gone - self.pending:
                self.state.forget(uid)
            self.gone &= self.pending
            return done.assignments

    def retry(self) -> None:
        """Try the pending claims again (after pods were written). Whether any are pending is
        asked under the lock: a claim loop inside `write` holds it, so a pod written while
        that write read the pods is retried once the claim is marked pending, and not missed
        (it read too early for the pod, and this retry would have seen no claim pending)."""
        with self.lock:
            if not self.pending:
                return
        from auditor.store.connection import transaction

        with transaction(self.engine) as conn:
            self.write(conn)


class DraSink(_StoreSink):
    """The sink of one kind, `resourceclaims` or `resourceslices`."""

    def __init__(
        self, shared: WatchedDra, *, kind: str, scope: str, on_skip: Skip | None = None
    ) -> None:
        super().__init__(shared.engine, scope=scope, on_skip=on_skip)
        self.shared = shared
        self.kind = kind

    def cursor(self) -> str | None:
        return None  # held in memory: list again at each start

    def _save_cursor(self, conn: Connection, resource_version: str, at_ms: int) -> None:
        pass

    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        return self._take([(o, False) for o in items])

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        return self._take([(e.obj, e.type == "DELETED") for e in events if e.type in CHANGES])

    def _take(self, objs: list[tuple[Mapping[str, Any], bool]]) -> int:
        from auditor.store.connection import transaction

        what = "claim" if self.kind == "resourceclaims" else "slice"
        changed: list[str] = []
        devices: list[tuple[Mapping[str, Any], list[DraDevice]]] = []
        for obj, deleted in objs:
            try:
                if what == "claim":
                    claim = read_claim(obj)
                    with self.shared.lock:
                        self.shared.state.add_claim(claim)
                        if deleted:
                            self.shared.gone.add(claim.uid)
                    changed.append(claim.uid)
                else:
                    devices.append((obj, read_slice(obj)))
            except InputError as e:
                self._skip(_describe(obj, kind=what), e, reason="unreadable")
            except Exception as e:  # a shape no rule foresaw: this object, not the loop
                self._skip(
                    _describe(obj, kind=what), f"{type(e).__name__}: {e}", reason="unreadable"
                )
        written = 0
        for obj, found in devices:  # each slice on its own: a refused card is that slice's
            try:
                with transaction(self.engine) as conn:
                    write_cards(conn, found, cluster=self.shared.cluster)
            except InputError as e:
                self._skip(_describe(obj, kind=what), e, reason="unstorable")
                continue
            with self.shared.lock:
                self.shared.state.add_slice(found)
            written += 1
        with transaction(self.engine) as conn:
            self.shared.write(conn, changed)
        return written + len(changed)
