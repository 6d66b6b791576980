"""Dynamic Resource Allocation into the store: the cards of slices, the holds of claims.

`auditor.collect.dra` resolves claims to the cards they give each pod; this writes them, in
the caller's transaction, as the `gpus` the slices publish (node, index, model, memory, MIG
parent and profile) and as exact assignments of source `dra` (`gpu_assignments`) for the
pods the store holds. A hold whose pod the store does not hold yet (the watcher's pod loop
is behind, or the pod is outside its scope) waits: its claim stays pending, and is tried
again at the next write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection

from auditor.collect.dra import DraDevice, DraState
from auditor.model import DEFAULT_CLUSTER, ExactAssignment, GpuRecord

SOURCE = "dra"


@dataclass(frozen=True, slots=True)
class DraWrite:
    assignments: int
    """(pod, card) pairs written."""
    pending: frozenset[str]
    """Claims with a pod the store does not hold or a device no slice seen names."""


def write_cards(
    conn: Connection,
    devices: Iterable[DraDevice],
    *,
    file: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """Store the cards (and MIG instances with their card) the devices are; returns how
    many rows were offered. A card the store has on another node or as another model is
    refused as `upsert_gpus` refuses it (`GpuConflictError`)."""
    from auditor.store.writes import upsert_gpus

    records: dict[str, GpuRecord] = {}
    for dev in devices:
        for rec in dev.records():
            records.setdefault(rec.uuid, rec)
    upsert_gpus(conn, records.values(), file=file, cluster=cluster)
    return len(records)


def write_holds(
    conn: Connection, state: DraState, claim_uids: Iterable[str] | None = None
) -> DraWrite:
    """Write the holds of the claims of `claim_uids` (default: every claim of `state`)."""
    from auditor.store.reads import pod_spans
    from auditor.store.writes import upsert_exact_assignments

    uids = list(state.claims) if claim_uids is None else list(dict.fromkeys(claim_uids))
    holds = state.holds(uids)
    spans = pod_spans(conn, [h.pod_uid for h in holds])
    pending = {u for u in uids if not state.resolved(u)}
    found: list[ExactAssignment] = []
    for h in holds:
        span = spans.get(h.pod_uid)
        node = h.node or (span[0] if span else None)
        if span is None or span[1] is None or node is None:
            pending.add(h.claim_uid)
            continue
        start = span[1]
        end = span[2] if span[2] is not None else start
        found.append(ExactAssignment(h.pod_uid, node, h.gpu_uuid, start, max(start, end), h.share))
    written = upsert_exact_assignments(conn, found, source=SOURCE)
    stored = write_asks(conn, state, uids)
    # a claim whose owner is not stored yet is tried again, as a hold whose pod is not
    for u in uids:
        claim = state.claims.get(u)
        if claim is not None and claim.asked and claim.owner not in (None, *stored):
            pending.add(u)
    return DraWrite(written, frozenset(pending))


def write_asks(conn: Connection, state: DraState, claim_uids: Iterable[str]) -> set[str]:
    """Store, as their `gpu_count`, the GPUs the pods owning these claims ask for through
    all their claims: a DRA pod asks for no card in its containers, so without this one
    still waiting would count as waiting for none (SPEC §10 `blocked`). Only pods stored as
    DRA pods are changed; returns the UIDs of those the store holds."""
    from sqlalchemy import update

    from auditor.collect.shares import DRA_RESOURCE
    from auditor.store.schema import pods

    owners = {c.owner for u in claim_uids if (c := state.claims.get(u)) is not None}
    asks = {p: n for p, n in state.asks().items() if p in owners}
    stored: set[str] = set()
    for uid, count in sorted(asks.items()):
        changed = conn.execute(
            update(pods)
            .where(pods.c.uid == uid, pods.c.gpu_resource == DRA_RESOURCE)
            .values(gpu_count=count)
        ).rowcount
        if changed:
            stored.add(uid)
    return stored
