"""A sharded audit's free time where pods waited, split once every shard of its window is
stored (SPEC §10 `blocked`, §11 shards).

Waiting demand is shared among the free cards of the whole fleet, and no shard holds them
all. So each shard stores, beside its causes, the free shares (`auditor.classify.free_time
.free_shares`) of its cards in every (card, hour) that a wait overlaps (`keep_free_shares`);
its own split of them stands until the set is complete. The shard that completes it splits
every shard's kept shares at once and replaces their `unallocated` causes in those hours
(`settle_free_split`), so the N shards together store what one unsharded run stores. It runs
inside the audit's write transaction, after `write_lock`: shards of one window take turns,
and the last to store its run sees every other's. Re-running one shard of a complete set
splits them again.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from sqlalchemy import Connection, delete, exists, insert, select

from auditor.classify.causes import free_cause_frame
from auditor.classify.free_time import FREE_SHARE_COLUMNS, HOUR, split_free
from auditor.model import WasteCategory, Window
from auditor.store.schema import audit_causes, audit_free_shares, audit_runs

_COLUMNS = [c for c in FREE_SHARE_COLUMNS if c != "gpu"]


def keep_free_shares(
    conn: Connection, *, run_id: int, shares: pd.DataFrame, gpu_ids: Mapping[str, int]
) -> int:
    """Store `run_id`'s shares (`FREE_SHARE_COLUMNS` and hour_ms, `gpu` a UUID) of every
    (card, hour) that holds one with a span (a wait overlaps it); the rows stored. The other
    (card, hour)s are split for good already: no demand can block them."""
    if shares.empty:
        return 0
    spanned = (shares["end_ms"] > shares["start_ms"]).to_numpy()
    if not spanned.any():
        return 0
    keys = pd.MultiIndex.from_frame(shares[["gpu", HOUR]])
    kept = shares[keys.isin(keys[spanned])]
    rows = [
        {"run_id": run_id, "gpu_id": int(gpu_ids[str(g)]), HOUR: int(h), "kind": str(k),
         "start_ms": int(a), "end_ms": int(b), "seconds": float(s), "gone": float(o),
         "avail_w": float(w)}
        for g, h, k, a, b, s, o, w in zip(
            kept["gpu"], kept[HOUR], *(kept[c] for c in _COLUMNS), strict=True
        )
    ]  # fmt: skip
    conn.execute(insert(audit_free_shares), rows)
    return len(rows)


def settle_free_split(
    conn: Connection,
    *,
    cluster: str,
    window: Window,
    shards: int,
    demand: pd.DataFrame | None,
    demand_known: bool,
) -> list[int]:
    """If every shard `i/shards` of `cluster`'s `window` is stored, split their kept free
    shares at once against `demand` and replace those (card, hour)s' `unallocated` causes
    (`demand_known` as `free_cause_frame` takes it). Returns the runs of the complete set, in
    shard order; empty while a shard is missing."""
    r = audit_runs
    stored = conn.execute(
        select(r.c.id, r.c.shard).where(
            r.c.cluster == cluster,
            r.c.window_start_ms == window.start_ms,
            r.c.window_end_ms == window.end_ms,
        )
    )
    by_shard = {str(s): int(i) for i, s in stored}
    wanted = [f"{j}/{shards}" for j in range(shards)]
    if any(s not in by_shard for s in wanted):
        return []
    run_ids = [by_shard[s] for s in wanted]
    s = audit_free_shares
    rows = conn.execute(
        select(s.c.run_id, s.c.gpu_id, s.c.hour_ms, *(s.c[c] for c in _COLUMNS)).where(
            s.c.run_id.in_(run_ids)
        )
    ).all()
    if not rows:
        return run_ids
    frame = pd.DataFrame(rows, columns=["run_id", "gpu", HOUR, *_COLUMNS])
    run_of = dict(zip(frame["gpu"].astype(str), frame["run_id"].astype(int), strict=True))
    shares = frame.astype({"gpu": str, HOUR: np.int64, "start_ms": np.int64, "end_ms": np.int64})
    split = free_cause_frame(split_free(shares.drop(columns="run_id"), demand=demand),
                             demand_known=demand_known)  # fmt: skip
    c = audit_causes
    conn.execute(
        delete(c).where(
            c.c.run_id.in_(run_ids),
            c.c.category == WasteCategory.UNALLOCATED.value,
            exists().where(
                s.c.run_id == c.c.run_id, s.c.gpu_id == c.c.gpu_id, s.c.hour_ms == c.c.hour_ms
            ),
        )
    )
    causes = [
        {"run_id": run_of[str(g)], "gpu_id": int(g), "pod_uid": None, "category": k,
         "cause": why, "seconds": float(sec), "signalled_seconds": float(sig), HOUR: int(h)}
        for g, k, why, sec, sig, h in zip(
            split["gpu"], split["category"], split["cause"], split["seconds"],
            split["signalled_seconds"], split[HOUR], strict=True,
        )
    ]  # fmt: skip
    if causes:
        conn.execute(insert(audit_causes), causes)
    return run_ids
