"""Why a free card sat free (SPEC §10): the causes inside `unallocated`, from nodes' state
and the demand that waited. Pure: frames in, frames out, no I/O and no clock.

The free card-seconds of an `unallocated` piece are split between its causes in proportion
to time, so they sum to the category exactly per card and window.

**`unallocated`**, per free card-second, from nodes' state and the demand that waited:

1. `unavailable`: the card's node could not give it (cordoned, not Ready, or fewer cards
   allocatable than it has) — the part of the piece inside such a stretch;
2. `blocked`: GPU pods waited unscheduled for this kind of card (or any card) while it sat
   free: at each instant at most the cards they asked for, shared among the free available
   cards of that kind in proportion to their free share (demand for any card is shared
   among the kinds in proportion to their free cards);
3. `no_demand`: the rest.

The split of a card's free time depends on the other cards' only through their free
capacity while demand waited, so it comes in two steps: `free_shares` (what depends on the
card alone, folded to a few rows per card and hour) and `split_free` (every card's shares
at once). An audit in chunks, or in shards, keeps the first and does the second once.

Frames (every time in epoch ms):
- pieces: gpu, start_ms, end_ms, category, seconds (and hour_ms where cut at the hours).
- node states: node, start_ms, end_ms (stretches in which the node's cards are unavailable).
- demand: kind (None: any card), start_ms, end_ms, cards (asked by pods that waited).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import numpy as np
import pandas as pd

from auditor.model import WasteCategory


class FreeCause(StrEnum):
    """Causes of `unallocated`."""

    UNAVAILABLE = "unavailable"
    BLOCKED = "blocked"
    NO_DEMAND = "no_demand"


FREE_COLUMNS = ["gpu", "cause", "seconds"]
HOUR = "hour_ms"
"""The bucket column of pieces cut at the hour grid (`auditor.classify.hours.cut_at_hours`):
carried through, so that the causes come out per hour."""


def kind_key(model: object) -> str:
    """A GPU model as both its spellings compare: NVML's `NVIDIA H100 80GB HBM3` and the
    node label's `NVIDIA-H100-80GB-HBM3` (what a pod's node selector names) are one kind."""
    return "-".join(str(model).lower().replace("_", " ").replace("-", " ").split())


def card_maps(cards: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """(card -> node, card -> kind) of `cards` (uuid, node, model): what `free_shares` takes."""
    uuid = cards["uuid"].astype(str)
    return (
        dict(zip(uuid, cards["node"].astype(str), strict=True)),
        {u: kind_key(m) for u, m in zip(uuid, cards["model"].fillna(""), strict=True)},
    )


def keyed_demand(demand: pd.DataFrame | None) -> pd.DataFrame | None:
    """The demand with each kind spelt as `kind_key` spells the cards' models."""
    if demand is None or demand.empty:
        return demand
    keyed = [kind_key(k) if isinstance(k, str) else None for k in demand["kind"].astype(object)]
    return demand.assign(kind=pd.Series(keyed, index=demand.index, dtype=object))


def _covered_ms(
    start: np.ndarray, end: np.ndarray, spans_start: np.ndarray, spans_end: np.ndarray
) -> np.ndarray:
    """Per [start, end): the milliseconds inside the union of the spans (sorted, merged)."""
    if spans_start.size == 0:
        return np.zeros(start.size)
    order = np.argsort(spans_start, kind="stable")
    s, e = spans_start[order], spans_end[order]
    merged_s, merged_e = [int(s[0])], [int(e[0])]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a <= merged_e[-1]:
            merged_e[-1] = max(merged_e[-1], int(b))
        else:
            merged_s.append(int(a))
            merged_e.append(int(b))
    ms, me = np.array(merged_s, dtype=np.int64), np.array(merged_e, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(me - ms)])

    def upto(x: np.ndarray) -> np.ndarray:
        """Covered milliseconds before each x."""
        i = np.searchsorted(ms, x, side="right")  # spans starting at or before x
        inside = np.minimum(x, me[np.maximum(i - 1, 0)]) - ms[np.maximum(i - 1, 0)]
        return np.where(i > 0, cum[np.maximum(i - 1, 0)] + np.maximum(inside, 0), 0)

    covered: np.ndarray = (upto(end) - upto(start)).astype(np.float64)
    return covered


FREE_SHARE_COLUMNS = ["gpu", "kind", "start_ms", "end_ms", "seconds", "gone", "avail_w"]
"""Per `unallocated` piece (`free_shares`): its card and the card's kind, its span, its free
card-seconds, those of them inside an `unavailable` stretch, and the free share still
available per millisecond (what waiting demand is matched against); `hour_ms` too where
the pieces carry it."""


def free_shares(
    pieces: pd.DataFrame,
    *,
    card_node: Mapping[str, str],
    card_kind: Mapping[str, str],
    unavailable: pd.DataFrame | None,
    demand: pd.DataFrame | None,
    fold: bool = True,
) -> pd.DataFrame:
    """The `unallocated` pieces as `FREE_SHARE_COLUMNS`: the part of the free split that
    depends on the card alone. The split of a card's free time depends on the other cards'
    only through their free capacity while demand waited, so the shares of any set of cards
    can be concatenated and split at once (`split_free`) as one split of all their pieces.

    Folded (`fold`), as an audit keeps them until its last chunk: the pieces no wait of
    `demand` overlaps become one row per card (and hour) of no span and no available share
    (no demand can block them, nor do they weigh against another card's), and those a wait
    overlaps are merged where one meets the next of its card and hour at the same free
    share. So a chunk's shares are bounded by its cards and hours, not by its samples, and
    split as its pieces would be. `fold=False`: a row per piece."""
    free = (pieces["category"] == WasteCategory.UNALLOCATED.value).to_numpy()
    hourly = HOUR in pieces.columns
    codes, cards = _card_codes(pieces["gpu"][free])
    start = pieces["start_ms"].to_numpy(np.int64)[free]
    end = pieces["end_ms"].to_numpy(np.int64)[free]
    seconds = pieces["seconds"].to_numpy(np.float64)[free]
    length = np.maximum(end - start, 1).astype(np.float64)
    out_ms = np.zeros(seconds.size)
    card_nodes = np.array([card_node.get(g, "") for g in cards], dtype=object)
    if unavailable is not None and not unavailable.empty and seconds.size:
        for name, spans in unavailable.groupby("node"):
            on = (card_nodes == name)[codes]
            out_ms[on] = _covered_ms(
                start[on],
                end[on],
                spans["start_ms"].to_numpy(np.int64),
                spans["end_ms"].to_numpy(np.int64),
            )
    gone = seconds * out_ms / length
    avail_w = seconds * 1000.0 / length * (1.0 - out_ms / length)  # free share left, per ms
    hours = pieces[HOUR].to_numpy(np.int64)[free] if hourly else np.zeros(seconds.size, np.int64)
    kinds = np.array([card_kind.get(g, "") for g in cards], dtype=object)
    rows = {"code": codes.astype(np.int64), "start_ms": start, "end_ms": end,
            "seconds": seconds, "gone": gone, "avail_w": avail_w, HOUR: hours}  # fmt: skip
    if fold:
        if demand is not None and not demand.empty and seconds.size:
            d_start = demand["start_ms"].to_numpy(np.int64)
            waited = _covered_ms(start, end, d_start, demand["end_ms"].to_numpy(np.int64))
            open_ = waited > 0
        else:
            open_ = np.zeros(seconds.size, dtype=bool)
        shut, merged = _folded(rows, ~open_), _merged(rows, open_)
        rows = {k: np.concatenate([merged[k], shut[k]]) for k in rows}
    frame = pd.DataFrame(
        {
            "gpu": cards[rows["code"]],
            "kind": kinds[rows["code"]],
            **{k: rows[k] for k in FREE_SHARE_COLUMNS[2:]},
        }
    )
    if hourly:
        frame[HOUR] = rows[HOUR]
    return frame


def _folded(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The masked rows summed per (card, hour), in that order: no span, no available share."""
    code, hours = rows["code"][mask], rows[HOUR][mask]
    grid, hour_codes = np.unique(hours, return_inverse=True)
    width = max(grid.size, 1)
    uniq, group = np.unique(code * width + hour_codes.reshape(-1), return_inverse=True)
    group = group.reshape(-1)

    def total(column: str) -> np.ndarray:
        return np.bincount(group, weights=rows[column][mask], minlength=uniq.size)

    zero = np.zeros(uniq.size, np.int64)
    return {
        "code": uniq // width,
        "start_ms": zero,
        "end_ms": zero,
        "seconds": total("seconds"),
        "gone": total("gone"),
        "avail_w": np.zeros(uniq.size),
        HOUR: grid[uniq % width],
    }


def _merged(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The masked rows with each run of one card and hour at one free share, each piece
    ending where the next starts, merged into one: its seconds are theirs, and so is any
    demand's share of them (`split_free` is additive over a share's time)."""
    picked = np.flatnonzero(mask)
    if not picked.size:
        return {k: v[:0] for k, v in rows.items()}
    order = picked[np.lexsort((rows["start_ms"][picked], rows[HOUR][picked],
                               rows["code"][picked]))]  # fmt: skip
    code, hour, a, b, w = (rows[k][order] for k in ("code", HOUR, "start_ms", "end_ms", "avail_w"))
    first = np.ones(order.size, dtype=bool)
    first[1:] = (
        (code[1:] != code[:-1]) | (hour[1:] != hour[:-1]) | (a[1:] != b[:-1]) | (w[1:] != w[:-1])
    )
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], order.size) - 1
    return {"code": code[starts], "start_ms": a[starts], "end_ms": b[ends],
            "seconds": np.add.reduceat(rows["seconds"][order], starts),
            "gone": np.add.reduceat(rows["gone"][order], starts), "avail_w": w[starts],
            HOUR: hour[starts]}  # fmt: skip


def split_free(shares: pd.DataFrame, *, demand: pd.DataFrame | None) -> pd.DataFrame:
    """Seconds per (gpu, cause) of the free shares (module docstring); per (gpu, hour_ms,
    cause) where they carry `hour_ms`."""
    hourly = HOUR in shares.columns
    if shares.empty:
        empty = pd.DataFrame({"gpu": pd.Series(dtype=object), "cause": pd.Series(dtype=object),
                              "seconds": pd.Series(dtype=np.float64)})  # fmt: skip
        return empty.assign(**{HOUR: pd.Series(dtype=np.int64)}) if hourly else empty
    codes, cards = _card_codes(shares["gpu"])
    start = shares["start_ms"].to_numpy(np.int64)
    end = shares["end_ms"].to_numpy(np.int64)
    seconds = shares["seconds"].to_numpy(np.float64)
    gone = shares["gone"].to_numpy(np.float64)
    avail_w = shares["avail_w"].to_numpy(np.float64)

    blocked = np.zeros(seconds.size)
    if demand is not None and not demand.empty and avail_w.any():
        kind = shares["kind"].to_numpy(dtype=object)
        d_kind = demand["kind"].astype(object).where(demand["kind"].notna(), None).to_numpy()
        d_start = demand["start_ms"].to_numpy(np.int64)
        d_end = demand["end_ms"].to_numpy(np.int64)
        d_cards = demand["cards"].to_numpy(np.float64)
        grid = np.unique(np.concatenate([start, end, d_start, d_end]))
        kinds = sorted(set(kind))
        k_of = {k: i for i, k in enumerate(kinds)}
        n_e = grid.size - 1
        # free available card-equivalents and demand per (kind, elementary interval)
        f = np.zeros((len(kinds), n_e + 1))
        si, ei = np.searchsorted(grid, start), np.searchsorted(grid, end)
        ki = np.array([k_of[k] for k in kind], dtype=np.int64)
        np.add.at(f, (ki, si), avail_w)
        np.add.at(f, (ki, ei), -avail_w)
        f = np.cumsum(f, axis=1)[:, :n_e]
        d = np.zeros((len(kinds), n_e + 1))
        d_any = np.zeros(n_e + 1)
        dsi, dei = np.searchsorted(grid, d_start), np.searchsorted(grid, d_end)
        for k, a, b, c in zip(d_kind, dsi, dei, d_cards, strict=True):
            if k is None:
                d_any[a] += c
                d_any[b] -= c
            elif k in k_of:
                d[k_of[k], a] += c
                d[k_of[k], b] -= c
        d = np.cumsum(d, axis=1)[:, :n_e]
        d_any = np.cumsum(d_any)[:n_e]
        total_f = f.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            want = d + d_any * np.where(total_f > 0, f / np.where(total_f > 0, total_f, 1), 0)
            frac = np.where(f > 1e-12, np.minimum(1.0, want / np.where(f > 1e-12, f, 1)), 0.0)
        step = np.diff(grid).astype(np.float64)
        cum = np.concatenate([np.zeros((len(kinds), 1)), np.cumsum(frac * step, axis=1)], axis=1)
        blocked = avail_w * (cum[ki, ei] - cum[ki, si]) / 1000.0
        left = seconds - gone
        # a share merged from several pieces (`free_shares`) adds their rounding: what is
        # within it of all that was left is all of it, as the pieces' sum would give
        blocked = np.where(blocked >= left * (1.0 - 1e-9), left, blocked)
    rest = np.maximum(seconds - gone - blocked, 0.0)
    names = [FreeCause.BLOCKED.value, FreeCause.NO_DEMAND.value, FreeCause.UNAVAILABLE.value]
    group, n_groups = codes, len(cards)
    group_gpu = np.asarray(cards, dtype=object)
    if hourly:  # one group per (card, hour), numbered in (card, hour) order
        hours, hour_codes = np.unique(shares[HOUR].to_numpy(np.int64), return_inverse=True)
        pair = codes.astype(np.int64) * hours.size + hour_codes.reshape(-1)
        uniq, group = np.unique(pair, return_inverse=True)
        group = group.reshape(-1)
        n_groups = uniq.size
        group_gpu = group_gpu[uniq // hours.size]
    per = [np.bincount(group, weights=w, minlength=n_groups) for w in (blocked, rest, gone)]
    sums = np.concatenate(per)  # per cause (in name order), per group (sorted)
    frame = pd.DataFrame(
        {
            "gpu": np.tile(group_gpu, len(names)),
            "cause": np.repeat(np.array(names, dtype=object), n_groups),
            "seconds": sums,
        }
    )
    columns = FREE_COLUMNS
    if hourly:
        frame[HOUR] = np.tile(hours[uniq % hours.size], len(names))
        columns = [*FREE_COLUMNS, HOUR]
    kept = frame[frame["seconds"] > 0].sort_values(["gpu", "cause"], kind="stable")
    return kept.reset_index(drop=True)[columns]


def split_unallocated(
    pieces: pd.DataFrame,
    *,
    card_node: Mapping[str, str],
    card_kind: Mapping[str, str],
    unavailable: pd.DataFrame | None,
    demand: pd.DataFrame | None,
) -> pd.DataFrame:
    """Seconds per (gpu, cause) of the `unallocated` pieces (module docstring); per (gpu,
    hour_ms, cause) where the pieces carry `hour_ms` (cut at the hour grid)."""
    shares = free_shares(
        pieces, card_node=card_node, card_kind=card_kind, unavailable=unavailable, demand=demand
    )
    return split_free(shares, demand=demand)


def _card_codes(gpu: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, the cards as text, sorted): `pd.factorize` of the column as text.
    The cards are text already (UUIDs): the distinct values are converted, not every row."""
    codes, cards = pd.factorize(gpu, sort=True)
    if all(isinstance(c, str) for c in cards) and not (codes < 0).any():
        return codes, np.asarray(cards, dtype=object)
    codes, cards = pd.factorize(gpu.astype(str), sort=True)
    return codes, np.asarray(cards, dtype=object)
