"""The whatif job (SPEC §9): replay idle policies over the stored samples and tenures.

Reads who held which card when and every stored sample of the cards held in the window (raw,
and rolled-up minutes where the raw ones are gone), over the whole tenures that overlap it,
and hands them to the pure replay (`auditor.classify.whatif`), in chunks of nodes as the
audit does, so memory follows the chunk, not the fleet or the window. Needs no audit run.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.common import open_store
from auditor.jobs.parts import AUDIT_CHUNK_SAMPLES, READ_MARGIN_MS
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from auditor.classify.whatif import Policy, WhatIf


def whatif(
    url: str,
    *,
    policies: Sequence[Policy],
    window: tuple[int, int] | None,
    thresholds: Thresholds,
    cluster: str | None = None,
) -> WhatIf:
    """Each policy replayed over `window` (default: every stored sample) in one cluster
    (None: the one the store holds; an error naming them where it holds several)."""
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
) -> WhatIf:
    """`whatif` of `cluster` on an open connection (the HTML report reads its section
    through this).

    As the audit does, whole nodes are classified together with the cards of their gangs on
    other nodes, as many nodes per chunk as keep its samples within `chunk_samples` (and at
    least `MIN_CHUNKS` where the nodes allow); each
    chunk's own pods are replayed there, and the pods of all chunks summed per team. The
    next chunk is read, on a connection of its own, while one is classified."""
    import pandas as pd

    from auditor.classify.pipeline import classify
    from auditor.classify.rollup import with_rolled
    from auditor.classify.whatif import (
        POD_OUT,
        card_rows,
        in_play,
        replay_pods,
        span,
        summarise,
    )
    from auditor.jobs.parts import MIN_CHUNKS, chunks
    from auditor.store import reads
    from auditor.store.placement import held_tenures
    from auditor.store.rollup import read_rolled_card_samples, rollup_span

    found_span = reads.sample_span(conn, cluster=cluster) or rollup_span(conn, cluster=cluster)
    # a pod still holding its card holds it to the data's end
    now_ms = found_span[1] if found_span else window[1]
    pods, gpus, tenures = held_tenures(conn, now_ms=now_ms, window=window, cluster=cluster)
    over = in_play(tenures, window)
    gpu_ids = {str(u): int(i) for u, i in zip(gpus["uuid"], gpus["id"], strict=True)}
    uuids = {i: u for u, i in gpu_ids.items()}
    lo = over.groupby("gpu")["start_ms"].min().clip(upper=window[0]) - READ_MARGIN_MS
    hi = over.groupby("gpu")["end_ms"].max().clip(lower=window[1]) + READ_MARGIN_MS
    ranges = {str(u): (int(lo[u]), int(hi[u])) for u in lo.index}
    period_ms = max(1, round(thresholds.default_period_s * 1000))
    info = pods[["uid", "namespace", "name", "team", "job_kind"]]
    per_pod = []
    parts = chunks(
        gpus[gpus["uuid"].isin(ranges)],
        over,
        shard=None,
        budget=chunk_samples,
        cost={u: (b - a) // period_ms for u, (a, b) in ranges.items()},
        least=MIN_CHUNKS,
    )

    def load(context: set[str]) -> pd.DataFrame:
        """A chunk's samples, on a connection of its own: read while the previous chunk is
        classified, as the audit reads them."""
        wanted = [(gpu_ids[u], *ranges[u]) for u in sorted(context)]
        with conn.engine.connect() as own_conn:
            return with_rolled(
                reads.read_card_samples(own_conn, wanted, uuids),
                read_rolled_card_samples(own_conn, wanted),
            )

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="whatif-read") as pool:
        ahead = [pool.submit(load, parts[0][1])] if parts else []
        for i, (own, context) in enumerate(parts):
            samples = ahead.pop().result()
            if i + 1 < len(parts):
                ahead.append(pool.submit(load, parts[i + 1][1]))
            part = over[over["gpu"].isin(context)]
            found = classify(
                samples, part, window=span(part, window), thresholds=thresholds,
                keep_pieces=True,
            )  # fmt: skip
            assert found.pieces is not None
            replayed = replay_pods(
                card_rows(found.pieces),
                pods=info,
                tenures=part,
                policies=policies,
                window=window,
                thresholds=thresholds,
            )
            mine = set(part.loc[part["gpu"].isin(own), "pod_uid"])
            per_pod.append(replayed[replayed["pod_uid"].isin(mine)])
            del samples, found
    rows = pd.concat(per_pod, ignore_index=True) if per_pod else pd.DataFrame(columns=POD_OUT)
    return summarise(rows, policies=policies, window=window)
