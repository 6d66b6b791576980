"""One chunk of an audit: read its cards' samples and signals, classify them, and give back
the rows the run stores.

Given the plan (`AuditPlan`: who held which card, each card's range, the window), chunks are
independent of each other, so they run either in this process, the next chunk read while
this one is classified (`in_process`), or in worker processes, a chunk at a time each
(`jobs.workers`, which runs `AuditPlan.run`). Either way the chunks' rows come back in plan
order, and the run stores the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.jobs.common import nulls
from auditor.jobs.workers import Part
from auditor.model import Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Engine

NEIGHBOUR_SAMPLES = 16
"""Samples read beyond that margin, however far, either side: the card's period is the
median spacing of what is read, and a window inside an outage must still see the period
the card was sampled at, not the outage's length."""

SPLIT_CATEGORIES = ("compute_idle", "unallocated")
"""The categories split by cause (SPEC §10): the only pieces the audit keeps."""


@dataclass(frozen=True)
class Loaded:
    """What one chunk of the audit is classified from: samples, tenants' activity."""

    samples: pd.DataFrame
    activity: pd.DataFrame


@dataclass(frozen=True)
class Signals:
    """What one chunk's causes are judged on (SPEC §10): pod and card signals."""

    pods: pd.DataFrame
    cards: pd.DataFrame


@dataclass(frozen=True)
class AuditPlan:
    """Everything a chunk is read and classified by, the same for every chunk: small next to
    the samples (cards, tenures, outages, waits), so a worker process gets a copy."""

    window: Window
    thresholds: Thresholds
    gpus: pd.DataFrame
    tenures: pd.DataFrame
    ranges: Mapping[str, Window]
    """Per card UUID, the samples read (`jobs.parts.card_ranges`)."""
    gpu_ids: Mapping[str, int]
    first_card: Mapping[str, str]
    """Per gang, its first card: the chunk owning it stores the gang's findings."""
    card_node: Mapping[str, str]
    card_kind: Mapping[str, str]
    unavailable: pd.DataFrame
    waited: pd.DataFrame | None

    def run(self, engine: Engine, part: Part) -> ChunkRows:
        """One chunk read and classified on `engine`, as a worker process does it."""
        own, context = part
        got = read_chunk(engine, self, context)
        return classify_chunk(self, own, context, got, read_signals(engine, self, context))

    @property
    def uuids(self) -> dict[int, str]:
        return {int(i): str(u) for u, i in self.gpu_ids.items()}

    @property
    def stale_ms(self) -> int:
        return round(self.thresholds.signal_stale_s * 1000)


@dataclass(frozen=True)
class ChunkRows:
    """What one chunk gives the run: rows to store, its free time folded (`free_shares`,
    split once every chunk's is known), and what it counted."""

    results: list[dict[str, object]]
    findings: list[dict[str, object]]
    sm: list[dict[str, object]]
    causes: list[dict[str, object]]
    free: pd.DataFrame
    samples: int
    gpus: int
    rolled_s: float


SampleReader = Callable[[list[tuple[str, int, int]]], "pd.DataFrame"]
"""Samples of cards over their ranges from outside the store (`audit --samples-from`):
(GPU UUID, lo, hi) per card, sorted by UUID -> gpu, ts_ms, util, throttle_reasons,
sm_active, with `NEIGHBOUR_SAMPLES` either side of each card's range."""


def read_chunk(
    engine: Engine, plan: AuditPlan, context: set[str], samples: SampleReader | None = None
) -> Loaded:
    """The cards' raw samples and, where raw data was rolled up, 1-minute pseudo-samples;
    the tenants' own utilisation of shared cards."""
    from auditor.classify.rollup import with_rolled
    from auditor.store import reads
    from auditor.store.rollup import read_rolled_card_samples

    uuids = plan.uuids
    wanted = [(int(plan.gpu_ids[u]), *plan.ranges[u]) for u in sorted(context)]
    with engine.connect() as conn:
        if samples is None:
            raw = reads.read_card_samples(conn, wanted, uuids, neighbours=NEIGHBOUR_SAMPLES)
        else:
            raw = samples([(uuids[g], lo, hi) for g, lo, hi in wanted])
        return Loaded(
            samples=with_rolled(raw, read_rolled_card_samples(conn, wanted)),
            activity=reads.read_tenant_util(conn, wanted, uuids),
        )


def read_signals(engine: Engine, plan: AuditPlan, context: set[str]) -> Signals:
    """The signals the causes of the cards' idle time are judged on: their pods' and
    their own, the latter only while a pod held the card (`held_spans`)."""
    from auditor.jobs.parts import READ_MARGIN_MS
    from auditor.store.signals import read_card_signals, read_pod_signals

    # a piece the window cuts is judged at its whole midpoint, up to a sample's coverage
    # outside the window: its signal may lie that far out, and up to `signal_stale_s` before
    margin = plan.stale_ms + READ_MARGIN_MS
    on = plan.tenures[plan.tenures["gpu"].isin(context)]
    with engine.connect() as conn:
        return Signals(
            pods=read_pod_signals(
                conn, list(on["pod_uid"].astype(str)), window=plan.window, margin_ms=margin
            ),
            cards=read_card_signals(
                conn,
                window=plan.window,
                margin_ms=margin,
                cards={int(plan.gpu_ids[u]): u for u in sorted(context)},
                spans=held_spans(on, plan.gpu_ids, stale_ms=plan.stale_ms),
            ),
        )


def classify_chunk(
    plan: AuditPlan, own: set[str], context: set[str], got: Loaded, signals: Signals
) -> ChunkRows:
    """The rows the run stores for the cards of `own`, classified with those of `context`."""
    from auditor.classify.causes import idle_causes
    from auditor.classify.efficiency import efficiency
    from auditor.classify.free_time import free_shares
    from auditor.classify.hours import HOUR_MS, cut_at_hours
    from auditor.classify.pipeline import classify
    from auditor.classify.rollup import rolled_up_seconds

    audited, thresholds, gpu_ids = plan.window, plan.thresholds, plan.gpu_ids
    samples = got.samples
    part = plan.tenures[plan.tenures["gpu"].isin(context)]
    result = classify(
        samples,
        part,
        window=audited,
        thresholds=thresholds,
        cards=plan.gpus,
        activity=got.activity,
        keep_pieces=True,
        piece_categories=SPLIT_CATEGORIES,
        hour_ms=HOUR_MS,
    )
    assert result.pieces is not None
    assert result.hourly is not None
    # stored per UTC hour (SPEC §11): any whole-hour window inside the run is served
    res = result.hourly[result.hourly["gpu"].isin(own)]
    cut = cut_at_hours(result.pieces[result.pieces["gpu"].isin(own)], window=audited)
    # Free time is split once every chunk's is known: waiting demand is shared among the
    # free cards of the whole run, so a card's `blocked` seconds do not depend on which
    # cards shared its chunk. A chunk keeps a row per card and hour, and its pieces that
    # overlap a wait (`free_shares`).
    free = free_shares(
        cut, card_node=plan.card_node, card_kind=plan.card_kind,
        unavailable=plan.unavailable, demand=plan.waited,
    )  # fmt: skip
    causes = cause_rows(
        idle_causes(
            cut,
            tenures=part,
            pod_signals=signals.pods,
            card_signals=signals.cards,
            thresholds=thresholds.causes,
        ),
        gpu_ids,
    )
    # a finding about a whole gang (a checkpoint series) has no card: the part that owns
    # the gang's first card stores it, so it is stored once
    fnd = result.findings
    fnd = fnd[fnd["gpu"].fillna(fnd["gang"].map(plan.first_card)).isin(own)]
    eff = efficiency(samples, part, window=audited, thresholds=thresholds, hour_ms=HOUR_MS)
    sm = [
        {
            "gpu_id": int(gpu_ids[g]),
            "pod_uid": p,
            "sm_active_seconds": float(a),
            "sm_busy_seconds": float(b),
            "hour_ms": int(h),
        }
        for g, p, a, b, h in eff.sm[eff.sm["gpu"].isin(own)].itertuples(index=False)
    ]
    mine = samples["gpu"].isin(own)
    return ChunkRows(
        results=result_rows(res, part, gpu_ids),
        findings=finding_rows(fnd, gpu_ids)
        + finding_rows(eff.findings[eff.findings["gpu"].isin(own)], gpu_ids),
        sm=sm,
        causes=causes,
        free=free,
        samples=int(mine.sum()),
        gpus=int(samples.loc[mine, "gpu"].nunique()),
        rolled_s=rolled_up_seconds(samples, window=audited, gpus=own),
    )


def in_process(
    engine: Engine, plan: AuditPlan, parts: list[Part], samples: SampleReader | None = None
) -> Iterator[ChunkRows]:
    """Each part's rows, in order, classified here. Reading the next chunk (waiting on the
    database, building its rows) overlaps classifying this one: at most two chunks' samples
    are in memory at once. A chunk's signals are read after its samples, while it is
    classified: they are needed only once it is, so even the first chunk waits for its
    samples alone."""

    def submit(context: set[str]) -> tuple[Future[Loaded], Future[Signals]]:
        return (
            pool.submit(read_chunk, engine, plan, context, samples),
            pool.submit(read_signals, engine, plan, context),
        )

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-read") as pool:
        ahead = [submit(parts[0][1])] if parts else []
        for i, (own, context) in enumerate(parts):
            loading, signalling = ahead.pop()
            got = loading.result()
            if i + 1 < len(parts):
                ahead.append(submit(parts[i + 1][1]))
            yield classify_chunk(plan, own, context, got, signalling.result())
            del got


def held_spans(
    tenures: pd.DataFrame, gpu_ids: Mapping[str, int], *, stale_ms: int
) -> dict[int, list[tuple[int, int]]]:
    """Per GPU id, the spans in which its signals can decide a cause: a held card's idle
    piece lies inside a tenure of its pod on that card (the classifier cuts the time line
    at every tenure's ends) and is judged at its midpoint, by the last signal row at most
    `stale_ms` older. So `[start - stale, end]` of every tenure; a free card's time needs
    none (`unallocated` is split by nodes' state and demand)."""
    out: dict[int, list[tuple[int, int]]] = {}
    known = tenures["start_ms"].notna() & tenures["end_ms"].notna()
    for uuid, lo, hi in zip(
        tenures.loc[known, "gpu"].astype(str),
        tenures.loc[known, "start_ms"],
        tenures.loc[known, "end_ms"],
        strict=True,
    ):
        out.setdefault(int(gpu_ids[uuid]), []).append((int(lo) - stale_ms, int(hi) + 1))
    return out


def result_rows(
    res: pd.DataFrame, tenures: pd.DataFrame, gpu_ids: Mapping[str, int]
) -> list[dict[str, object]]:
    inferred = {
        (g, p): bool(i)
        for g, p, i in zip(tenures["gpu"], tenures["pod_uid"], tenures["inferred"], strict=True)
    }
    shares: dict[tuple[object, object], float] = {}
    if "share" in tenures.columns:  # a pod's share of the card (its largest, if it came back)
        for g, p, sh in zip(tenures["gpu"], tenures["pod_uid"], tenures["share"], strict=True):
            if not math.isnan(sh):  # an unknown share (an equal split) is stored as NULL
                shares[(g, p)] = max(float(sh), shares.get((g, p), 0.0))
    return [
        {
            "gpu_id": int(gpu_ids[g]),
            "pod_uid": p,
            "category": c,
            "seconds": float(s),
            "inferred": inferred.get((g, p), False) if p is not None else False,
            "estimated": bool(e),
            "share": shares.get((g, p)) if p is not None else None,
            "hour_ms": int(h),
        }
        for g, p, c, s, e, h in zip(
            res["gpu"],
            nulls(res["pod_uid"]),
            res["category"],
            res["seconds"],
            res["estimated"],
            res["hour_ms"],
            strict=True,
        )
    ]


def finding_rows(fnd: pd.DataFrame, gpu_ids: Mapping[str, int]) -> list[dict[str, object]]:
    return [
        {
            "kind": k,
            "gang": gang,
            "gpu_id": None if g is None else int(gpu_ids[str(g)]),
            "pod_uid": p,
            "start_ms": None if a is None else int(str(a)),
            "end_ms": None if b is None else int(str(b)),
            "seconds": float(s),
            "detail": d,
        }
        for k, gang, g, p, a, b, s, d in zip(
            fnd["kind"], nulls(fnd["gang"]), nulls(fnd["gpu"]), nulls(fnd["pod_uid"]),
            nulls(fnd["start_ms"]), nulls(fnd["end_ms"]), fnd["seconds"], nulls(fnd["detail"]),
            strict=True,
        )
    ]  # fmt: skip


def cause_rows(causes: pd.DataFrame, gpu_ids: Mapping[str, int]) -> list[dict[str, object]]:
    return [
        {
            "gpu_id": int(gpu_ids[str(g)]),
            "pod_uid": p,
            "category": c,
            "cause": k,
            "seconds": float(s),
            "signalled_seconds": float(x),
            "hour_ms": int(h),
        }
        for g, p, c, k, s, x, h in zip(
            causes["gpu"], nulls(causes["pod_uid"]), causes["category"], causes["cause"],
            causes["seconds"], causes["signalled_seconds"], causes["hour_ms"], strict=True,
        )
    ]  # fmt: skip
