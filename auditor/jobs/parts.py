"""What an audit is cut into: shards of nodes (`--shard i/N`), chunks of whole nodes with the
cards of their gangs on other nodes, and the range of samples each card is read over. Pure:
frames in, plans out; the audit and whatif jobs follow the plan."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from auditor.model import Window

if TYPE_CHECKING:
    import pandas as pd

    from auditor.store.reads import StoredSpan

AUDIT_CHUNK_SAMPLES = 2_000_000
"""Samples classified together, at most (unless one node and its gangs need more): memory
follows this, not the fleet or the window. About 600 MiB of peak memory."""
MIN_CHUNKS = 3
"""Chunks an audit takes at least, where its nodes allow: the next chunk is read while this
one is classified, so a fleet within one chunk's budget would otherwise wait for all of its
samples before classifying any (a 64-GPU day: 2.9 s in one chunk, 2.1 s in three)."""
READ_MARGIN_MS = 15 * 60_000
"""Samples read either side of a card's range: enough for any sane period's neighbours."""


def shard_of(node: str, shards: int) -> int:
    """The shard a node belongs to: a stable hash, the same in every process and release."""
    import hashlib

    digest = hashlib.sha256(node.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def card_ranges(gpus: pd.DataFrame, tenures: pd.DataFrame, *, window: Window) -> dict[str, Window]:
    """Per card, the samples the audit reads: `[lo, hi)`, margins included.

    The window, stretched to the whole of every tenure of every gang that holds a card inside
    the window (SPEC §3 classifies whole tenures; a gang's gaps, which make its checkpoint
    series, are those of all its cards over all its tenures), plus `READ_MARGIN_MS` on both
    sides: so the last sample meets its successor, and the sample before the start, whose
    coverage reaches into the window, is there.
    A card's range depends on the tenures only, so it sees the same data however the fleet
    is chunked or sharded, and every window that cuts a tenure classifies it from the same
    samples: adjacent windows add up to their union.
    """
    start_ms, end_ms = window
    inside = (tenures["start_ms"] < end_ms) & (tenures["end_ms"] > start_ms)
    over = tenures[tenures["gang"].isin(set(tenures.loc[inside, "gang"]))]
    lo = over.groupby("gpu")["start_ms"].min()
    hi = over.groupby("gpu")["end_ms"].max()
    out: dict[str, Window] = {}
    for uuid in gpus["uuid"].astype(str):
        a = min(start_ms, int(lo[uuid])) if uuid in lo.index else start_ms
        b = max(end_ms, int(hi[uuid])) if uuid in hi.index else end_ms
        out[uuid] = Window(a - READ_MARGIN_MS, b + READ_MARGIN_MS)
    return out


def planned_cost(
    ranges: Mapping[str, tuple[int, int]],
    *,
    period_ms: int,
    stored: Mapping[str, StoredSpan] | None = None,
) -> dict[str, int]:
    """Per card, the samples reading its range `[lo, hi)` is expected to give: the range at
    the sampling period, or with `stored` (what the store holds of each card) the part of
    the range the card's raw samples span at the period, plus the rolled-up minutes it
    spans (a card the store holds nothing of costs nothing).

    Chunks are cut at equal cost and a worker's chunk is as slow as the rows it reads: a
    window of days over cards the store holds one of, or a node sampled only for an hour,
    made equal ranges of very unequal rows, and one worker alone at the end."""
    if stored is None:
        return {u: (hi - lo) // period_ms for u, (lo, hi) in ranges.items()}
    out: dict[str, int] = {}
    for uuid, (lo, hi) in ranges.items():
        span = stored.get(uuid)
        if span is None:
            out[uuid] = 0
            continue
        raw = _overlap(lo, hi, span.first_ms, span.last_ms) // period_ms
        minutes = _overlap(lo, hi, span.first_minute_ms, span.last_minute_ms) // 60_000
        out[uuid] = raw + minutes
    return out


def part_costs(parts: list[tuple[set[str], set[str]]], cost: Mapping[str, int]) -> list[int]:
    """Each part's cost: of every card it reads (its own and their gangs' others)."""
    return [sum(cost.get(u, 0) for u in context) for _, context in parts]


def _overlap(lo: int, hi: int, first: int | None, last: int | None) -> int:
    """How long `[lo, hi)` overlaps `[first, last]` (0 where either end is None)."""
    if first is None or last is None:
        return 0
    return max(0, min(hi, last) - max(lo, first))


def chunks(
    gpus: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    shard: tuple[int, int] | None,
    budget: int,
    cost: dict[str, int],
    least: int,
    workers: int = 1,
) -> list[tuple[set[str], set[str]]]:
    """`audit_parts` within `budget`, and at least `least` of them where the nodes allow:
    a fleet that fits in fewer is cut into that many smaller ones, so that reading the next
    chunk overlaps classifying this one.

    With `workers` processes taking chunks in turn, as many chunks as are needed rounded up
    to a multiple of them, of about equal cost (`even_parts`): nine chunks for two workers
    leave one alone with the last chunk, ten smaller ones end together."""
    parts = list(audit_parts(gpus, tenures, shard=shard, budget=budget, cost=cost))
    if workers > 1:  # total / want is within the budget: want is no fewer than parts
        want = -(-max(least, len(parts)) // workers) * workers
        return even_parts(gpus, tenures, shard=shard, parts=want, cost=cost)
    if len(parts) >= least:
        return parts
    total = sum(cost.get(u, 0) for own, _ in parts for u in own)
    smaller = max(1, min(budget, -(-total // least)))
    return list(audit_parts(gpus, tenures, shard=shard, budget=smaller, cost=cost))


def even_parts(
    gpus: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    shard: tuple[int, int] | None,
    parts: int,
    cost: dict[str, int],
) -> list[tuple[set[str], set[str]]]:
    """The shard's nodes, in node order, cut into `parts` chunks of about the same cost,
    as `audit_parts` gives them (each with the cards of its gangs on other nodes to read).

    Chunk k ends at the node boundary nearest where the running cost of the own cards
    reaches k / parts of the total, within half a share of it, counting as further off a
    boundary that cuts gangs by what cutting there costs: their cards on one side are read
    and classified again, as context, by the chunk on the other. So a cut falls between
    nodes no gang spans where such a boundary is near, and across the smallest gangs where
    none is (one chunk holding a whole fleet-wide gang would leave the other workers idle)."""
    nodes, node_cards, gang_cards, closure = _node_plan(gpus, tenures, shard=shard)
    n = len(nodes)
    at = {node: i for i, node in enumerate(nodes)}
    weights = [sum(cost.get(u, 0) for u in node_cards[node]) for node in nodes]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    total = prefix[-1]
    card_at = {
        str(u): at[str(node)]
        for u, node in zip(gpus["uuid"], gpus["node"], strict=True)
        if str(node) in at
    }
    crossing = [0] * (n + 1)  # what a cut before node i reads twice
    for cards in gang_cards:
        spots = sorted({card_at[c] for c in cards if c in card_at})
        if len(spots) > 1:  # each side reads the other's cards of the gang
            twice = sum(cost.get(c, 0) for c in cards)
            for i in range(spots[0] + 1, spots[-1] + 1):
                crossing[i] += twice
    cuts: list[int] = []
    for k in range(1, parts):
        target, half = total * k / parts, total / parts / 2
        near = [
            i for i in range((cuts[-1] if cuts else 0) + 1, n) if abs(prefix[i] - target) <= half
        ]
        if near:
            cuts.append(min(near, key=lambda i: (abs(prefix[i] - target) + crossing[i], i)))
    out: list[tuple[set[str], set[str]]] = []
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        own = set().union(*(node_cards[node] for node in nodes[lo:hi]))
        if own:
            out.append((own, closure(own)))
    return out


def audit_parts(
    gpus: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    shard: tuple[int, int] | None,
    budget: int,
    cost: dict[str, int] | None = None,
) -> Iterator[tuple[set[str], set[str]]]:
    """(own cards, cards to read) per chunk of whole nodes of the shard, in node order.

    The cards to read are the own cards and every card of their gangs, wherever it is. A
    chunk takes nodes while the cost (samples expected) of its cards to read stays within
    `budget`, and at least one node. Without `cost` every card costs 1.
    """
    nodes, node_cards, _, closure = _node_plan(gpus, tenures, shard=shard)

    def weight(cards: set[str]) -> int:
        return len(cards) if cost is None else sum(cost.get(u, 0) for u in cards)

    own: set[str] = set()
    context: set[str] = set()
    for node in nodes:
        mine = node_cards[node]
        grown = context | closure(mine)
        if own and weight(grown) > budget:
            yield own, context
            own, grown = set(), closure(mine)
        own |= mine
        context = grown
    if own:
        yield own, context


def _node_plan(
    gpus: pd.DataFrame, tenures: pd.DataFrame, *, shard: tuple[int, int] | None
) -> tuple[list[str], dict[str, set[str]], list[set[str]], Callable[[set[str]], set[str]]]:
    """The shard's nodes in order, each node's cards, each gang's cards, and the closure of
    a set of cards over their gangs (the cards to read with them)."""
    nodes = sorted({str(n) for n in gpus["node"]})
    if shard is not None:
        nodes = [n for n in nodes if shard_of(n, shard[1]) == shard[0]]
    node_cards: dict[str, set[str]] = {n: set() for n in nodes}
    for uuid, node in zip(gpus["uuid"].astype(str), gpus["node"].astype(str), strict=True):
        if node in node_cards:
            node_cards[node].add(uuid)
    gang_cards = tenures.groupby("gang")["gpu"].agg(set)
    card_gangs = tenures.groupby("gpu")["gang"].agg(set)

    def closure(cards: set[str]) -> set[str]:
        out = set(cards)
        for uuid in cards:
            for gang in card_gangs.get(uuid, ()):
                out |= gang_cards[gang]
        return out

    return nodes, node_cards, list(gang_cards), closure
