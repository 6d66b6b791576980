"""Nodes' observations into `node_outages` stretches (SPEC §10 `unavailable`).

Each observation (`NodeState`, from `auditor.collect.nodes.node_state`) says which outages
hold at the time it was seen and when each began. Per node, in the order seen:

- an open stretch (no end yet) whose reason the observation no longer shows ends: a
  not-Ready one when `Ready` last turned True (its `lastTransitionTime`, where that lies
  inside the stretch), any other at the observation's time, the first time it was seen
  over; an observation older than the stretch's start ends nothing;
- a reason shown that no open stretch of its own carries starts one, unless a stored
  stretch of that reason already covers its start (the same file imported again, or an
  older one after it): so a re-import changes nothing.

Files are to be imported in the order they were captured: an older file imported after a
newer one that had ended a stretch cannot tell that the stretch it shows ended later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, update

from auditor.model import DEFAULT_CLUSTER, NodeState
from auditor.store.schema import node_outages

_CHUNK = 500


@dataclass
class _Span:
    reason: str
    start: int
    end: int | None

    def covers(self, reason: str, start: int) -> bool:
        """Whether a stretch of `reason` from `start` is this one, or inside it."""
        if reason != self.reason:
            return False
        return self.end is None or self.start == start or self.start <= start < self.end


def record_node_states(
    conn: Connection, states: Iterable[NodeState], *, cluster: str = DEFAULT_CLUSTER
) -> int:
    """Apply observations of `cluster`'s nodes to the stored stretches (module docstring);
    returns the stretches started or ended."""
    by_node: dict[str, list[NodeState]] = defaultdict(list)
    for state in states:
        by_node[state.node].append(state)
    if not by_node:
        return 0
    names = sorted(by_node)
    stored: dict[str, list[_Span]] = defaultdict(list)
    for i in range(0, len(names), _CHUNK):
        rows = conn.execute(
            select(
                node_outages.c.node,
                node_outages.c.reason,
                node_outages.c.start_ms,
                node_outages.c.end_ms,
            ).where(
                node_outages.c.cluster == cluster, node_outages.c.node.in_(names[i : i + _CHUNK])
            )
        )
        for node, reason, start, end in rows:
            stored[node].append(_Span(reason, int(start), None if end is None else int(end)))
    changed = 0
    for node in names:
        spans = stored[node]
        for state in sorted(by_node[node], key=lambda s: s.seen_ms):
            for span in spans:
                reason, start = span.reason, span.start
                if span.end is not None or reason in state.outages or state.seen_ms < start:
                    continue
                ready = state.ready_since_ms
                stop = (
                    ready
                    if reason == "not_ready" and ready is not None and start <= ready
                    else state.seen_ms
                )
                conn.execute(
                    update(node_outages)
                    .where(
                        node_outages.c.cluster == cluster,
                        node_outages.c.node == node,
                        node_outages.c.reason == reason,
                        node_outages.c.start_ms == start,
                    )
                    .values(end_ms=stop)
                )
                span.end = stop
                changed += 1
            for reason, start in sorted(state.outages.items()):
                if any(span.covers(reason, start) for span in spans):
                    continue
                conn.execute(
                    insert(node_outages),
                    {
                        "cluster": cluster,
                        "node": node,
                        "reason": reason,
                        "start_ms": start,
                        "end_ms": None,
                    },
                )
                spans.append(_Span(reason, start, None))
                changed += 1
    return changed
