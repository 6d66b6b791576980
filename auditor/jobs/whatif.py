"""The whatif job (SPEC §9): replay idle policies over the stored samples and tenures.

Reads who held which card when and every stored sample of the cards held in the window (raw,
and rolled-up minutes where the raw ones are gone), over the whole tenures that overlap it,
and hands them to the pure replay (`auditor.classify.whatif`), in chunks of nodes as the
audit does, so memory follows the chunk, not the fleet or the window. Needs no audit run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.common import open_store
from auditor.jobs.parts import AUDIT_CHUNK_SAMPLES, READ_MARGIN_MS
from auditor.jobs.workers import Part, in_workers, workers_for
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Connection, Engine

    from auditor.classify.whatif import Policy, WhatIf


def whatif(
    url: str,
    *,
    policies: Sequence[Policy],
    window: tuple[int, int] | None,
    thresholds: Thresholds,
    cluster: str | None = None,
    workers: int | None = None,
) -> WhatIf:
    """Each policy replayed over `window` (default: every stored sample) in one cluster
    (None: the one the store holds; an error naming them where it holds several), in
    `workers` processes as the audit takes them (None: as many as pay)."""
    from auditor.jobs.audit import data_window, only_cluster

    if not policies:
        raise InputError("give at least one --policy, e.g. --policy 'idle>=2h'", field="--policy")
    if cluster is None:
        cluster = only_cluster(url)
    if window is None:
        window = data_window(url, period_s=thresholds.default_period_s, cluster=cluster)
    if window[1] <= window[0]:
        raise InputError("the window ends before it starts", field="--end")
    engine = open_store(url)
    try:
        with engine.connect() as conn:
            return replay_stored(
                conn,
                policies=policies,
                window=Window(*window),
                thresholds=thresholds,
                cluster=cluster,
                workers=workers,
            )
    finally:
        engine.dispose()


def replay_stored(
    conn: Connection,
    *,
    policies: Sequence[Policy],
    window: Window,
    thresholds: Thresholds,
    chunk_samples: int = AUDIT_CHUNK_SAMPLES,
    cluster: str = DEFAULT_CLUSTER,
    workers: int | None = None,
) -> WhatIf:
    """`whatif` of `cluster` on an open connection (the HTML report reads its section
    through this).

    As the audit does, whole nodes are classified together with the cards of their gangs on
    other nodes, as many nodes per chunk as keep its samples within `chunk_samples` (and at
    least `MIN_CHUNKS` where the nodes allow); each
    chunk's own pods are replayed there, and the pods of all chunks summed per team. In one
    process the next chunk is read, on a connection of its own, while one is classified;
    a larger replay goes to worker processes as the audit's chunks do (`jobs.workers`;
    `workers` as the audit takes it)."""
    import pandas as pd

    from auditor.classify.whatif import POD_OUT, in_play, summarise
    from auditor.jobs.parts import MIN_CHUNKS, chunks, part_costs, planned_cost
    from auditor.store import reads
    from auditor.store.placement import held_tenures
    from auditor.store.rollup import rollup_span

    found_span = reads.sample_span(conn, cluster=cluster) or rollup_span(conn, cluster=cluster)
    # a pod still holding its card holds it to the data's end
    now_ms = found_span[1] if found_span else window[1]
    pods, gpus, tenures = held_tenures(conn, now_ms=now_ms, window=window, cluster=cluster)
    over = in_play(tenures, window)
    gpu_ids = {str(u): int(i) for u, i in zip(gpus["uuid"], gpus["id"], strict=True)}
    lo = over.groupby("gpu")["start_ms"].min().clip(upper=window[0]) - READ_MARGIN_MS
    hi = over.groupby("gpu")["end_ms"].max().clip(lower=window[1]) + READ_MARGIN_MS
    ranges = {str(u): (int(lo[u]), int(hi[u])) for u in lo.index}
    period_ms = max(1, round(thresholds.default_period_s * 1000))
    stored = reads.stored_spans(conn, cluster=cluster)  # the rows a range reads, not its length
    cost = planned_cost(ranges, period_ms=period_ms, stored=stored)
    workers = workers_for(workers, planned=sum(cost.values()))
    parts = chunks(
        gpus[gpus["uuid"].isin(ranges)],
        over,
        shard=None,
        budget=chunk_samples,
        cost=cost,
        least=MIN_CHUNKS,
        workers=workers,
    )
    plan = Replay(
        ranges=ranges,
        gpu_ids=gpu_ids,
        tenures=over,
        pods=pods[["uid", "namespace", "name", "team", "job_kind"]],
        policies=tuple(policies),
        window=window,
        thresholds=thresholds,
    )
    workers = max(1, min(workers, len(parts)))
    if workers > 1:
        costs = part_costs(parts, cost)
        per_pod = list(in_workers(conn.engine, plan, parts, workers, costs=costs))
    else:
        per_pod = list(_in_process(conn.engine, plan, parts))
    rows = pd.concat(per_pod, ignore_index=True) if per_pod else pd.DataFrame(columns=POD_OUT)
    return summarise(rows, policies=policies, window=window)


@dataclass(frozen=True)
class Replay:
    """What each chunk of a replay needs: each card's range of samples, who held which card
    when, the pods' names and teams, the policies."""

    ranges: dict[str, tuple[int, int]]
    gpu_ids: dict[str, int]
    tenures: pd.DataFrame
    pods: pd.DataFrame
    policies: tuple[Policy, ...]
    window: Window
    thresholds: Thresholds

    def load(self, engine: Engine, context: set[str]) -> pd.DataFrame:
        """A chunk's samples, as the audit reads them."""
        from auditor.classify.rollup import with_rolled
        from auditor.store import reads
        from auditor.store.rollup import read_rolled_card_samples

        uuids = {i: u for u, i in self.gpu_ids.items()}
        wanted = [(self.gpu_ids[u], *self.ranges[u]) for u in sorted(context)]
        with engine.connect() as conn:
            return with_rolled(
                reads.read_card_samples(conn, wanted, uuids),
                read_rolled_card_samples(conn, wanted),
            )

    def replay(self, part: Part, samples: pd.DataFrame) -> pd.DataFrame:
        """The chunk's own pods replayed: a row per pod and policy (`POD_OUT`)."""
        from auditor.classify.pipeline import classify
        from auditor.classify.whatif import card_rows, replay_pods, span

        own, context = part
        held = self.tenures[self.tenures["gpu"].isin(context)]
        found = classify(
            samples, held, window=span(held, self.window), thresholds=self.thresholds,
            keep_pieces=True,
        )  # fmt: skip
        assert found.pieces is not None
        replayed = replay_pods(
            card_rows(found.pieces),
            pods=self.pods,
            tenures=held,
            policies=self.policies,
            window=self.window,
            thresholds=self.thresholds,
        )
        mine = set(held.loc[held["gpu"].isin(own), "pod_uid"])
        return replayed[replayed["pod_uid"].isin(mine)]

    def run(self, engine: Engine, part: Part) -> pd.DataFrame:
        """One chunk read and replayed on `engine`, as a worker process does it."""
        return self.replay(part, self.load(engine, part[1]))


def _in_process(engine: Engine, plan: Replay, parts: list[Part]) -> Iterator[pd.DataFrame]:
    """Each part replayed here, in order, the next one read, on a connection of its own,
    while this one is classified."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="whatif-read") as pool:
        ahead = [pool.submit(plan.load, engine, parts[0][1])] if parts else []
        for i, part in enumerate(parts):
            samples = ahead.pop().result()
            if i + 1 < len(parts):
                ahead.append(pool.submit(plan.load, engine, parts[i + 1][1]))
            yield plan.replay(part, samples)
            del samples
