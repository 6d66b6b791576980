"""Reads into DataFrames with explicit dtypes: the classifier and reports never see SQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Select, and_, func, select

from auditor.model import RunSlice, Window
from auditor.store.hours import parts_condition
from auditor.store.hours import run_ids as hour_runs
from auditor.store.keyscan import CardRange, scan_card_ranges
from auditor.store.schema import (
    audit_findings,
    audit_results,
    audit_runs,
    gpu_assignments,
    gpu_samples,
    gpu_samples_1m,
    gpus,
    nodes,
    pods,
)


def _frame(conn: Connection, stmt: Select[Any], columns: Sequence[str]) -> pd.DataFrame:
    return records(conn.execute(stmt).all(), columns)


def records(rows: Sequence[Any], columns: Sequence[str]) -> pd.DataFrame:
    """A frame of result rows. Each SQLAlchemy `Row` is made a plain tuple first: pandas
    probes every record it is given for array attributes, and each probe of a `Row` raises
    and catches inside SQLAlchemy (8x slower on a day of samples, measured)."""
    return pd.DataFrame.from_records([tuple(r) for r in rows], columns=list(columns))


def read_gpus(conn: Connection, *, cluster: str | None = None) -> pd.DataFrame:
    """The cards (of `cluster`; of every cluster where None), by id."""
    cols = [
        "id",
        "uuid",
        "node",
        "gpu_index",
        "model",
        "memory_total_mib",
        "parent_uuid",
        "mig_profile",
    ]
    stmt = select(*(gpus.c[c] for c in cols)).order_by(gpus.c.id)
    if cluster is not None:
        stmt = stmt.where(gpus.c.cluster == cluster)
    df = _frame(conn, stmt, cols)
    df["gpu_index"] = df["gpu_index"].astype("Int64")
    return df


def read_nodes(conn: Connection, *, cluster: str | None = None) -> pd.DataFrame:
    """Nodes (of `cluster`) as last seen: name, gpu_model, labels (a dict: the sharing labels
    of SPEC §7)."""
    stmt = select(nodes.c.name, nodes.c.gpu_model, nodes.c.labels).order_by(nodes.c.name)
    if cluster is not None:
        stmt = stmt.where(nodes.c.cluster == cluster)
    rows = conn.execute(stmt).all()
    return pd.DataFrame(
        {
            "name": pd.Series([r[0] for r in rows], dtype=object),
            "gpu_model": pd.Series([r[1] for r in rows], dtype=object),
            "labels": pd.Series(
                [dict(r[2]) if isinstance(r[2], Mapping) else {} for r in rows], dtype=object
            ),
        }
    )


POD_COLUMNS = [
    "uid",
    "namespace",
    "name",
    "node",
    "team",
    "job",
    "job_kind",
    "workload",
    "gang",
    "rank",
    "gpu_count",
    "gpu_resource",
    "created_ms",
    "bound_ms",
    "started_ms",
    "finished_ms",
    "deleted_ms",
    "share_kind",
    "gpu_share",
    "gpu_mem_mib",
    "gpu_mem_share",
    "cluster",
]


def read_pods(conn: Connection, *, cluster: str | None = None) -> pd.DataFrame:
    """The pods (of `cluster`), by UID."""
    stmt = select(*(pods.c[c] for c in POD_COLUMNS)).order_by(pods.c.uid)
    if cluster is not None:
        stmt = stmt.where(pods.c.cluster == cluster)
    df = _frame(conn, stmt, POD_COLUMNS)
    for c in (
        "rank",
        "gpu_count",
        "created_ms",
        "bound_ms",
        "started_ms",
        "finished_ms",
        "deleted_ms",
    ):
        df[c] = df[c].astype("Int64")
    for c in ("gpu_share", "gpu_mem_mib", "gpu_mem_share"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    return df


def read_assignments(conn: Connection, *, cluster: str | None = None) -> pd.DataFrame:
    """Exact GPU -> pod observations (of `cluster`'s cards): pod_uid, gpu_uuid, replicas
    (time-slicing device IDs held on the card, <NA> where not said), share (an exact share a
    source gave, NaN where none)."""
    stmt = select(
        gpu_assignments.c.pod_uid,
        gpus.c.uuid,
        gpu_assignments.c.replicas,
        gpu_assignments.c.share,
    ).join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
    if cluster is not None:
        stmt = stmt.where(gpus.c.cluster == cluster)
    df = _frame(conn, stmt, ["pod_uid", "gpu_uuid", "replicas", "share"])
    df["replicas"] = df["replicas"].astype("Int64")
    df["share"] = pd.to_numeric(df["share"], errors="coerce").astype("float64")
    return df


def read_samples(
    conn: Connection, *, start_ms: int, end_ms: int, gpu_ids: Sequence[int] | None = None
) -> pd.DataFrame:
    """Samples with `start_ms <= ts < end_ms`, as gpu (UUID), ts_ms, util, throttle_reasons."""
    cond = and_(gpu_samples.c.ts_ms >= start_ms, gpu_samples.c.ts_ms < end_ms)
    if gpu_ids is not None:
        cond = and_(cond, gpu_samples.c.gpu_id.in_(list(gpu_ids)))
    stmt = (
        select(gpus.c.uuid, gpu_samples.c.ts_ms, gpu_samples.c.util, gpu_samples.c.throttle_reasons)
        .join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
        .where(cond)
        .order_by(gpu_samples.c.gpu_id, gpu_samples.c.ts_ms)
    )
    df = _frame(conn, stmt, ["gpu", "ts_ms", "util", "throttle_reasons"])
    df["ts_ms"] = df["ts_ms"].astype("int64")
    df["util"] = pd.to_numeric(df["util"], errors="coerce").astype("float64")
    return df


def read_card_samples(
    conn: Connection,
    ranges: Sequence[CardRange],
    uuids: Mapping[int, str],
    *,
    neighbours: int = 0,
) -> pd.DataFrame:
    """Samples of each card inside its own range, as `read_samples` returns them, sorted.

    The audit's hot read: one key-range scan per card (`keyscan.scan_card_ranges`), the
    GPU column a categorical of UUIDs.
    With `neighbours` = k, also the card's last k samples before its range and first k
    after it, however far (two index seeks): what the range's edge samples cover, whether
    an outage across the edge is unobserved time of the card, and the card's period (the
    median spacing) are then the same as in any longer range (SPEC §3: adjacent windows add
    up to their union). One neighbour a side is not enough: a range inside an outage would
    read only the two samples around it, and their spacing, the outage, as the period.
    """
    found = scan_card_ranges(
        conn,
        "gpu_samples",
        ("ts_ms", "util", "throttle_reasons", "sm_active"),
        _CARD_ROW,
        ranges,
        neighbours=neighbours,
    )
    parts = [rows for _, rows in found]
    cards = [gpu_id for gpu_id, _ in found]
    sizes = [p.size for p in parts]
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=_CARD_ROW)
    del found, parts
    codes = np.repeat(np.arange(len(cards), dtype=np.int64), sizes)
    return pd.DataFrame(
        {
            "gpu": pd.Categorical.from_codes(
                codes, categories=pd.Index([uuids[g] for g in cards], dtype=object)
            ),
            "ts_ms": rows["ts_ms"],
            "util": rows["util"],
            "throttle_reasons": rows["throttle_reasons"],
            "sm_active": rows["sm_active"],
        }
    )


_CARD_ROW = np.dtype(
    [
        ("ts_ms", np.int64),
        ("util", np.float64),
        ("throttle_reasons", object),
        ("sm_active", np.float64),
    ]
)


def read_tenant_util(
    conn: Connection, ranges: Sequence[CardRange], uuids: Mapping[int, str]
) -> pd.DataFrame:
    """Per-pod utilisation of each card inside its own range (the `wanted` ranges of
    `read_card_samples`), as gpu (UUID), pod_uid, ts_ms, util (percent of the whole card,
    NaN where unread), sorted by card, time and pod.

    Read as the samples are (`keyscan`): a statement built and run through SQLAlchemy per
    card cost more than the rows, which most cards have none of (only shared cards record
    them)."""
    found = scan_card_ranges(
        conn,
        "gpu_tenant_util",
        ("pod_uid", "ts_ms", "util"),
        _TENANT_ROW,
        ranges,
        order="ts_ms, pod_uid",
    )
    parts = [rows for _, rows in found]
    names = [uuids[gpu_id] for gpu_id, _ in found]
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=_TENANT_ROW)
    gpu = np.repeat(np.array(names, dtype=object), [p.size for p in parts])
    return pd.DataFrame(
        {
            "gpu": pd.Series(gpu, dtype=object),
            "pod_uid": pd.Series(rows["pod_uid"], dtype=object),
            "ts_ms": rows["ts_ms"],
            "util": rows["util"],
        }
    )


_TENANT_ROW = np.dtype([("pod_uid", object), ("ts_ms", np.int64), ("util", np.float64)])


def sample_span(conn: Connection, *, cluster: str | None = None) -> tuple[int, int] | None:
    """The first and last sample time stored (of `cluster`'s cards), or None for none.

    Two key seeks per card (its first and last sample), not a scan of every sample: the
    table is keyed (card, time), so a plain min/max over time reads all of it."""
    s = gpu_samples.alias("s")
    first = select(s.c.ts_ms).where(s.c.gpu_id == gpus.c.id).correlate(gpus)
    stmt = select(
        func.min(first.order_by(s.c.ts_ms).limit(1).scalar_subquery()),
        func.max(first.order_by(s.c.ts_ms.desc()).limit(1).scalar_subquery()),
    ).select_from(gpus)
    if cluster is not None:
        stmt = stmt.where(gpus.c.cluster == cluster)
    lo, hi = conn.execute(stmt).one()
    if lo is None:
        return None
    return int(lo), int(hi)


class StoredSpan(NamedTuple):
    """What the store holds of one card: its first and last raw sample, and its first and
    last rolled-up minute (None where it holds none)."""

    first_ms: int | None
    last_ms: int | None
    first_minute_ms: int | None
    last_minute_ms: int | None


def stored_spans(conn: Connection, *, cluster: str | None = None) -> dict[str, StoredSpan]:
    """Per card (of `cluster`), by UUID, the span of its raw samples and of its rolled-up
    minutes: four key seeks a card, as `sample_span` reads, not a scan."""
    s, m = gpu_samples.alias("s"), gpu_samples_1m.alias("m")
    raw = select(s.c.ts_ms).where(s.c.gpu_id == gpus.c.id).correlate(gpus)
    rolled = select(m.c.minute_ms).where(m.c.gpu_id == gpus.c.id).correlate(gpus)
    stmt = select(
        gpus.c.uuid,
        raw.order_by(s.c.ts_ms).limit(1).scalar_subquery(),
        raw.order_by(s.c.ts_ms.desc()).limit(1).scalar_subquery(),
        rolled.order_by(m.c.minute_ms).limit(1).scalar_subquery(),
        rolled.order_by(m.c.minute_ms.desc()).limit(1).scalar_subquery(),
    )
    if cluster is not None:
        stmt = stmt.where(gpus.c.cluster == cluster)
    return {
        str(uuid): StoredSpan(*(None if v is None else int(v) for v in ends))
        for uuid, *ends in conn.execute(stmt)
    }


def clusters(conn: Connection) -> list[str]:
    """The clusters the store holds cards, pods or nodes of, sorted (SPEC §11)."""
    found: set[str] = set()
    for table in (gpus, pods, nodes):
        found.update(conn.execute(select(table.c.cluster).distinct()).scalars())
    return sorted(found)


def clusters_of(conn: Connection, uids: Sequence[str]) -> set[str]:
    """The clusters the stored pods of `uids` are of."""
    found: set[str] = set()
    for i in range(0, len(uids), 500):
        stmt = select(pods.c.cluster).where(pods.c.uid.in_(list(uids[i : i + 500]))).distinct()
        found.update(conn.execute(stmt).scalars())
    return found


def count_rows(conn: Connection) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in (gpus, gpu_samples, pods, gpu_assignments, audit_runs, audit_results):
        out[t.name] = int(conn.execute(select(func.count()).select_from(t)).scalar_one())
    return out


def runs_in_window(
    conn: Connection, *, start_ms: int | None, end_ms: int | None, cluster: str | None = None
) -> pd.DataFrame:
    """Audit runs (of `cluster`; of every cluster where None) overlapping [start, end) (a
    window of whole hours may lie inside one, SPEC §11); without bounds, the runs of the
    latest audited window."""
    cols = [
        "id",
        "window_start_ms",
        "window_end_ms",
        "shard",
        "created_ms",
        "thresholds",
        "version",
        "hourly",
        "cluster",
    ]
    stmt = select(*(audit_runs.c[c] for c in cols))
    if cluster is not None:
        stmt = stmt.where(audit_runs.c.cluster == cluster)
    if start_ms is None or end_ms is None:
        last = select(audit_runs.c.window_start_ms, audit_runs.c.window_end_ms)
        if cluster is not None:
            last = last.where(audit_runs.c.cluster == cluster)
        latest = conn.execute(
            last.order_by(audit_runs.c.created_ms.desc(), audit_runs.c.id.desc()).limit(1)
        ).first()
        if latest is None:
            return pd.DataFrame(columns=cols)
        stmt = stmt.where(
            audit_runs.c.window_start_ms == latest[0], audit_runs.c.window_end_ms == latest[1]
        )
    else:
        stmt = stmt.where(
            audit_runs.c.window_start_ms < end_ms, audit_runs.c.window_end_ms > start_ms
        )
    order = (audit_runs.c.cluster, audit_runs.c.window_start_ms, audit_runs.c.shard)
    return _frame(conn, stmt.order_by(*order), cols)


def read_results(conn: Connection, run_ids: Sequence[int | RunSlice]) -> pd.DataFrame:
    """Results of runs (or of slices of them: their hours in a window, SPEC §11), one row
    per run and key with its hours summed, joined with the card's node/model/utilisation
    source and the pod's attributes. `card` is the physical card (a MIG instance's parent,
    else the GPU itself), whose model `gpu_model` is (the price of an instance is its
    card's)."""
    parent = gpus.alias("parent")
    r = audit_results
    keys = [r.c.run_id, r.c.gpu_id, r.c.pod_uid, r.c.category, r.c.inferred, r.c.estimated]
    summed = (
        select(*keys, r.c.share, func.sum(r.c.seconds).label("seconds"))
        .where(parts_condition(r, run_ids))
        .group_by(*keys, r.c.share)
        .subquery("hours")
    )
    stmt = (
        select(
            summed.c.run_id,
            gpus.c.cluster,
            gpus.c.uuid.label("gpu"),
            func.coalesce(gpus.c.parent_uuid, gpus.c.uuid).label("card"),
            gpus.c.node,
            func.coalesce(parent.c.model, gpus.c.model).label("gpu_model"),
            gpus.c.util_source,
            summed.c.pod_uid,
            summed.c.category,
            summed.c.seconds,
            summed.c.inferred,
            summed.c.estimated,
            summed.c.share,
            pods.c.namespace,
            pods.c.name.label("pod"),
            pods.c.team,
            pods.c.job,
            pods.c.job_kind,
            pods.c.workload,
            pods.c.rank,
            pods.c.gang,
        )
        .select_from(summed)
        .join(gpus, gpus.c.id == summed.c.gpu_id)
        .outerjoin(parent, parent.c.uuid == gpus.c.parent_uuid)
        .outerjoin(pods, pods.c.uid == summed.c.pod_uid)
    )
    cols = [
        "run_id",
        "cluster",
        "gpu",
        "card",
        "node",
        "gpu_model",
        "util_source",
        "pod_uid",
        "category",
        "seconds",
        "inferred",
        "estimated",
        "share",
        "namespace",
        "pod",
        "team",
        "job",
        "job_kind",
        "workload",
        "rank",
        "gang",
    ]
    df = _frame(conn, stmt, cols)
    df["seconds"] = df["seconds"].astype("float64")
    df["inferred"] = df["inferred"].astype(bool)
    df["estimated"] = df["estimated"].astype(bool)
    df["share"] = df["share"].astype("float64")
    df["rank"] = df["rank"].astype("Int64")
    return df


def read_findings(
    conn: Connection, run_ids: Sequence[int | RunSlice], *, window: Window | None = None
) -> pd.DataFrame:
    """Findings of runs, each with its run's cluster. Findings are stored per run, whole
    episodes: with `window` (a report of some hours of a run, SPEC §11) an episode with a
    span is kept where it overlaps the window, clipped to it, its seconds in proportion to
    the time kept; one without a span (a gang's straggler) is the run's and kept."""
    stmt = (
        select(
            audit_findings.c.kind,
            audit_findings.c.gang,
            gpus.c.uuid.label("gpu"),
            gpus.c.node,
            audit_findings.c.pod_uid,
            pods.c.namespace,
            pods.c.name.label("pod"),
            pods.c.rank,
            pods.c.job,
            pods.c.team,
            audit_findings.c.start_ms,
            audit_findings.c.end_ms,
            audit_findings.c.seconds,
            audit_findings.c.detail,
            audit_runs.c.cluster,
        )
        .join(audit_runs, audit_runs.c.id == audit_findings.c.run_id)
        .outerjoin(gpus, gpus.c.id == audit_findings.c.gpu_id)
        .outerjoin(pods, pods.c.uid == audit_findings.c.pod_uid)
        .where(audit_findings.c.run_id.in_(hour_runs(run_ids)))
    )
    cols = [
        "kind",
        "gang",
        "gpu",
        "node",
        "pod_uid",
        "namespace",
        "pod",
        "rank",
        "job",
        "team",
        "start_ms",
        "end_ms",
        "seconds",
        "detail",
        "cluster",
    ]
    found = _frame(conn, stmt, cols)
    if window is None or found.empty:
        return found
    return clip_findings(found, window)


def clip_findings(found: pd.DataFrame, window: Window) -> pd.DataFrame:
    """Episodes overlapping `window`, clipped to it (seconds in proportion); those without
    a span kept as they are."""
    start = pd.to_numeric(found["start_ms"], errors="coerce")
    end = pd.to_numeric(found["end_ms"], errors="coerce")
    spanless = start.isna() | end.isna()
    lo, hi = start.clip(lower=window.start_ms), end.clip(upper=window.end_ms)
    keep = spanless | (hi > lo)
    length = (end - start).where(end > start)
    share = ((hi - lo) / length).where(~spanless & length.notna(), 1.0).clip(upper=1.0)
    out = found.assign(
        start_ms=lo.where(~spanless, found["start_ms"]),
        end_ms=hi.where(~spanless, found["end_ms"]),
        seconds=found["seconds"].astype("float64") * share,
    )[keep]
    for c in ("start_ms", "end_ms"):
        out[c] = out[c].astype(object).where(out[c].notna(), None)
        out[c] = [None if v is None else int(v) for v in out[c]]
    return out.reset_index(drop=True)


def shifted_copy(
    conn: Connection,
    *,
    gpu_id: int,
    ts_ms: Sequence[int],
    util: Sequence[float],
    step_ms: int,
    reach_ms: int,
) -> int | None:
    """The offset (a non-zero multiple of `step_ms` within `reach_ms`) at which the card
    already holds every reading (`ts_ms[i]` + offset with utilisation `util[i]`), the
    smallest first; None where no offset does."""
    offsets = [k * step_ms for k in range(-(reach_ms // step_ms), reach_ms // step_ms + 1) if k]
    wanted = sorted({int(t) + o for t in ts_ms for o in offsets})
    held: dict[int, float | None] = {}
    for i in range(0, len(wanted), 500):
        stmt = select(gpu_samples.c.ts_ms, gpu_samples.c.util).where(
            gpu_samples.c.gpu_id == gpu_id, gpu_samples.c.ts_ms.in_(wanted[i : i + 500])
        )
        held.update((int(t), u) for t, u in conn.execute(stmt))
    for off in sorted(offsets, key=abs):
        if all(
            (int(t) + off) in held
            and held[int(t) + off] is not None
            and abs(float(held[int(t) + off] or 0.0) - u) < 1e-6
            for t, u in zip(ts_ms, util, strict=True)
        ):
            return off
    return None


def pod_spans(
    conn: Connection, uids: Sequence[str]
) -> dict[str, tuple[str | None, int | None, int | None]]:
    """Per stored pod of `uids`: its node, when it began to hold (bound, else created, else
    started) and when it released (finished or deleted, the first; None while it holds)."""
    out: dict[str, tuple[str | None, int | None, int | None]] = {}
    wanted = sorted(set(uids))
    for start in range(0, len(wanted), 500):
        stmt = select(
            pods.c.uid,
            pods.c.node,
            pods.c.bound_ms,
            pods.c.created_ms,
            pods.c.started_ms,
            pods.c.finished_ms,
            pods.c.deleted_ms,
        ).where(pods.c.uid.in_(wanted[start : start + 500]))
        for uid, node, bound, created, started, finished, deleted in conn.execute(stmt):
            begin = next((t for t in (bound, created, started) if t is not None), None)
            ends = [t for t in (finished, deleted) if t is not None]
            out[uid] = (node, begin, min(ends) if ends else None)
    return out
