"""Reads of the pods that waited to be scheduled (SPEC §10): the demand behind `blocked`
free cards, and each pod's wait for queue waste. How a wait's start, end and cards are
read is `auditor.classify.queue`'s; this module selects the pods whose wait may overlap a
window and hands them over.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import Connection, func, or_, select

from auditor.classify.queue import WAIT_COLUMNS, clip, demand_of, wait_spans
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.store.schema import pods

_READ = (
    "cluster",
    "uid",
    "namespace",
    "name",
    "team",
    "job",
    "gang",
    "gpu_count",
    "gpu_share",
    "created_ms",
    "bound_ms",
    "finished_ms",
    "deleted_ms",
    "wait_reason",
    "wait_message",
    "wanted_model",
    "wait_seen_ms",
)


def _waits(conn: Connection, window: Window, cluster: str | None) -> pd.DataFrame:
    """The waits of pods (of `cluster`) seen waiting that may overlap `window`, clipped to
    it."""
    start = pods.c.created_ms
    # an upper bound of each wait's end (`wait_spans` takes the exact one): the bind, else
    # the deletion, else the end of its containers, else when it was last seen waiting
    ends_by = func.coalesce(pods.c.bound_ms, pods.c.deleted_ms, pods.c.finished_ms,
                            pods.c.wait_seen_ms)  # fmt: skip
    stmt = select(*(pods.c[c] for c in _READ)).where(
        pods.c.wait_reason.is_not(None),
        or_(start.is_(None), start < window.end_ms),
        ends_by > window.start_ms,
    )
    if cluster is not None:
        stmt = stmt.where(pods.c.cluster == cluster)
    frame = pd.DataFrame([tuple(r) for r in conn.execute(stmt)], columns=list(_READ))
    spans = wait_spans(frame)
    return clip(spans, start_ms=window.start_ms, end_ms=window.end_ms)


def read_demand(
    conn: Connection, *, window: Window, cluster: str = DEFAULT_CLUSTER
) -> pd.DataFrame:
    """One row per waiting stretch of a GPU pod of `cluster` inside `window`: kind (object:
    the GPU model it asked for, None for any card), start_ms, end_ms (int64, clipped to the
    window), cards (float64: its GPU count, or the share it asked for) —
    `split_unallocated`'s `demand`."""
    return demand_of(_waits(conn, window, cluster))


def read_queue_waits(
    conn: Connection, *, window: Window, cluster: str | None = None
) -> pd.DataFrame:
    """One row per pod (of `cluster`; of any where None) that waited inside `window`:
    pod_uid, namespace, name, team, job, gang, cards (float64), start_ms, end_ms (int64,
    clipped to the window), reason, message (the last one seen), cluster. Queue waste is
    cards × (end − start)."""
    frame = _waits(conn, window, cluster)[[*WAIT_COLUMNS, "cluster"]].reset_index(drop=True)
    return frame.astype({"cards": np.float64, "start_ms": np.int64, "end_ms": np.int64})
