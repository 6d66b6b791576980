"""Where each held card's idle stretch began, from the stored samples: what a restarted
sampler resumes its live idle streaks from (`auditor.agents.sample.streaks`).

For each card of the node, the pods recorded holding it most recently (the exact mapping the
sampler itself stored, `gpu_assignments`) whose pods have not finished: the stretch starts at
the first idle sample (utilisation at or below the threshold) after the last active one
within the holding, or at the holding's first idle sample when it was never active. A card
active in its latest readable sample has no stretch to resume. Unreadable samples count as
neither, as in the classifier's idle runs.
"""

from __future__ import annotations

from sqlalchemy import Connection, and_, func, select

from auditor.model import DEFAULT_CLUSTER
from auditor.store.schema import gpu_assignments, gpu_samples, gpus, pods


def idle_streak_starts(
    conn: Connection, *, node: str, idle_threshold_pct: float, cluster: str = DEFAULT_CLUSTER
) -> dict[tuple[str, str, str], int]:
    """(gpu uuid, namespace, pod name) → start of the card's current idle stretch (ms)."""
    latest = (
        select(gpu_assignments.c.gpu_id, func.max(gpu_assignments.c.last_seen_ms).label("last"))
        .group_by(gpu_assignments.c.gpu_id)
        .subquery()
    )
    holders = conn.execute(
        select(
            gpus.c.id,
            gpus.c.uuid,
            pods.c.namespace,
            pods.c.name,
            gpu_assignments.c.first_seen_ms,
        )
        .join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
        .join(pods, pods.c.uid == gpu_assignments.c.pod_uid)
        .join(
            latest,
            and_(
                latest.c.gpu_id == gpu_assignments.c.gpu_id,
                latest.c.last == gpu_assignments.c.last_seen_ms,
            ),
        )
        .where(
            gpus.c.cluster == cluster,
            gpus.c.node == node,
            pods.c.finished_ms.is_(None),
            pods.c.deleted_ms.is_(None),
        )
        .order_by(gpus.c.uuid, pods.c.namespace, pods.c.name)
    ).all()
    out: dict[tuple[str, str, str], int] = {}
    for gpu_id, uuid, namespace, name, first_seen in holders:
        mine = and_(gpu_samples.c.gpu_id == gpu_id, gpu_samples.c.ts_ms >= first_seen)
        last_active = conn.execute(
            select(func.max(gpu_samples.c.ts_ms)).where(
                mine, gpu_samples.c.util > idle_threshold_pct
            )
        ).scalar()
        after = first_seen if last_active is None else int(last_active) + 1
        start = conn.execute(
            select(func.min(gpu_samples.c.ts_ms)).where(
                mine, gpu_samples.c.ts_ms >= after, gpu_samples.c.util <= idle_threshold_pct
            )
        ).scalar()
        if start is not None:
            out[(str(uuid), str(namespace), str(name))] = int(start)
    return out
