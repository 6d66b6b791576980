"""The whatif job (SPEC §9): replay idle policies over the stored samples and tenures.

Reads who held which card when and every stored sample of the cards held in the window (raw,
and rolled-up minutes where the raw ones are gone), over the whole tenures that overlap it,
and hands them to the pure replay (`auditor.classify.whatif`). Needs no audit run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.common import open_store
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
) -> WhatIf:
    """Each policy replayed over `window` (default: every stored sample)."""
    from auditor.jobs.audit import data_window

    if not policies:
        raise InputError("give at least one --policy, e.g. --policy 'idle>=2h'", field="--policy")
    if window is None:
        window = data_window(url, period_s=thresholds.default_period_s)
    if window[1] <= window[0]:
        raise InputError("the window ends before it starts", field="--end")
    engine = open_store(url)
    try:
        with engine.connect() as conn:
            return replay_stored(conn, policies=policies, window=window, thresholds=thresholds)
    finally:
        engine.dispose()


def replay_stored(
    conn: Connection,
    *,
    policies: Sequence[Policy],
    window: tuple[int, int],
    thresholds: Thresholds,
) -> WhatIf:
    """`whatif` on an open connection (the HTML report reads its section through this)."""
    from auditor.classify.tenures import build_tenures
    from auditor.classify.whatif import what_if
    from auditor.jobs.audit import READ_MARGIN_MS
    from auditor.store import reads
    from auditor.store.rollup import read_audit_samples, rollup_span

    start_ms, end_ms = window
    pods = reads.read_pods(conn)
    gpus = reads.read_gpus(conn)
    span = reads.sample_span(conn) or rollup_span(conn)
    now_ms = span[1] if span else end_ms  # a pod still holding its card holds it to the data's end
    tenures = build_tenures(pods, gpus, reads.read_assignments(conn), now_ms=now_ms)
    over = tenures[(tenures["start_ms"] < end_ms) & (tenures["end_ms"] > start_ms)]
    cards = set(over["gpu"])
    ids = [int(i) for i, u in zip(gpus["id"], gpus["uuid"], strict=True) if u in cards]
    lo = min(start_ms, int(over["start_ms"].min())) if len(over) else start_ms
    hi = max(end_ms, int(over["end_ms"].max())) if len(over) else end_ms
    samples = read_audit_samples(
        conn, start_ms=lo - READ_MARGIN_MS, end_ms=hi + READ_MARGIN_MS, gpu_ids=ids
    )
    return what_if(
        samples,
        over,
        pods=pods[["uid", "team", "job_kind"]],
        policies=policies,
        window=window,
        thresholds=thresholds,
    )
