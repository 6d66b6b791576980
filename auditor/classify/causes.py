"""Why a held card idles, and why a free card sits free (SPEC §10): causes inside
`compute_idle` and inside `unallocated`, from infrastructure signals. Pure: frames in,
frames out, no I/O and no clock.

Each cause is a part of its category: a piece of classified time (`pieces.piece_frame`, one
row per sampled interval and category) goes whole to one cause of `compute_idle`, and the
free card-seconds of an `unallocated` piece are split between the causes of `unallocated`
in proportion to time. So the causes of a category sum to it exactly per card, pod, job,
team and window, and the categories themselves are untouched.

**`compute_idle`**, per piece, from the holding pod's and the card's signals at the piece's
midpoint (the latest signal row at or before it, if no older than `signal_stale_s`); the
first rule that holds wins:

1. `input_bound`: CPU used ≥ `cpu_limit_ratio` of the pod's CPU limit, or CFS-throttled in
   ≥ `throttled_ratio` of periods, or CPU or I/O pressure (PSI `some`) ≥ `pressure_ratio`;
2. `host_transfer`: PCIe traffic ≥ `pcie_ratio` of the link's bandwidth
   (`pcie_default_bytes_s` where the link is unknown);
3. `communication`: the pod's gang holds more than one card and the card's NVLink traffic,
   or the pod's network traffic, is ≥ `comm_bytes_s`;
4. `batching`: a serving pod had requests running or waiting;
5. `low_demand`: a serving pod had none running and none waiting;
6. `unexplained`: none of these (a signal that was not recorded never holds).

**`unallocated`**, per free card-second, from nodes' state and the demand that waited:

1. `unavailable`: the card's node could not give it (cordoned, not Ready, or fewer cards
   allocatable than it has) — the part of the piece inside such a stretch;
2. `blocked`: GPU pods waited unscheduled for this kind of card (or any card) while it sat
   free: at each instant at most the cards they asked for, shared among the free available
   cards of that kind in proportion to their free share (demand for any card is shared
   among the kinds in proportion to their free cards);
3. `no_demand`: the rest.

Frames (every time in epoch ms; a missing signal is NaN, never 0):
- pieces: gpu, pod_uid (None: no pod), start_ms, end_ms, category, seconds, and mid_ms (the
  instant a piece is judged at: the unclipped piece's midpoint; without it, the middle of
  [start_ms, end_ms)).
- pod signals: pod_uid, ts_ms and any of `POD_SIGNALS`.
- card signals: gpu, ts_ms and any of `CARD_SIGNALS`.
- node states: node, start_ms, end_ms (stretches in which the node's cards are unavailable).
- demand: kind (None: any card), start_ms, end_ms, cards (asked by pods that waited).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum

import numpy as np
import pandas as pd

from auditor.classify.arrays import run_factorize, run_isin
from auditor.model import WasteCategory
from auditor.settings import CauseThresholds


class IdleCause(StrEnum):
    """Causes of `compute_idle`, in the order the rules are tried."""

    INPUT_BOUND = "input_bound"
    HOST_TRANSFER = "host_transfer"
    COMMUNICATION = "communication"
    BATCHING = "batching"
    LOW_DEMAND = "low_demand"
    UNEXPLAINED = "unexplained"


class FreeCause(StrEnum):
    """Causes of `unallocated`."""

    UNAVAILABLE = "unavailable"
    BLOCKED = "blocked"
    NO_DEMAND = "no_demand"


POD_SIGNALS = (
    "cpu_limit_ratio",
    "throttled_ratio",
    "cpu_pressure",
    "io_pressure",
    "net_bytes_s",
    "requests_running",
    "requests_waiting",
)
"""Per pod: CPU used / CPU limit, throttled periods / periods, PSI `some` shares (0-1),
network bytes per second (in + out), serving requests running and waiting."""
CARD_SIGNALS = ("pcie_bytes_s", "pcie_link_bytes_s", "nvlink_bytes_s")
"""Per card: PCIe bytes per second (rx + tx), the link's bandwidth, NVLink bytes per second."""

SIGNAL_OF = {
    "cpu_limit": "cpu_limit_ratio",
    "cpu_throttled": "throttled_ratio",
    "cpu_pressure": "cpu_pressure",
    "io_pressure": "io_pressure",
    "pcie": "pcie_bytes_s",
    "nvlink": "nvlink_bytes_s",
    "network": "net_bytes_s",
    "serving_queue": "requests_running",
    "serving_idle": "requests_running",
}
"""The signal that decided a piece (`deciding` column) -> the column it was read from."""

IDLE_COLUMNS = ["gpu", "pod_uid", "start_ms", "end_ms", "cause", "deciding", "seconds", "signalled"]
FREE_COLUMNS = ["gpu", "cause", "seconds"]
HOUR = "hour_ms"
"""The bucket column of pieces cut at the hour grid (`auditor.classify.hours.cut_at_hours`):
carried through, so that the causes come out per hour."""


Values = dict[str, np.ndarray]
"""Signal column -> its value at each piece (float, NaN where none is recent)."""


def _at(
    pieces: pd.DataFrame,
    signals: pd.DataFrame | None,
    *,
    key: str,
    columns: tuple[str, ...],
    stale_ms: int,
) -> Values:
    """Each signal column's value at each piece's midpoint (NaN where none is recent). Rows
    of several sources (a `source` column: the sampler's cgroup reading, cAdvisor, a
    server's gauges) are read apart, so that one source's row never hides another's: the
    first source in name order with a recent value gives it."""
    out = {c: np.full(len(pieces), np.nan) for c in columns}
    if signals is None or signals.empty:
        return out
    if "mid_ms" in pieces.columns:  # the whole piece's midpoint, however a window cut it
        mid = pieces["mid_ms"].to_numpy(np.int64)
    else:
        mid = (pieces["start_ms"].to_numpy(np.int64) + pieces["end_ms"].to_numpy(np.int64)) // 2
    # the pieces come grouped by card and pod: only their runs' keys are hashed, once
    p_runs, p_names = run_factorize(pieces[key].astype(str))
    if "source" not in signals.columns:
        return _at_source(out, p_runs, p_names, mid, signals, key=key, stale_ms=stale_ms)
    for _, rows in signals.groupby("source", sort=True):
        got = _at_source(
            {c: np.full(len(pieces), np.nan) for c in columns},
            p_runs,
            p_names,
            mid,
            rows.drop(columns="source"),
            key=key,
            stale_ms=stale_ms,
        )
        out = {c: np.where(np.isnan(v), got[c], v) for c, v in out.items()}
    return out


def _at_source(
    out: Values,
    p_runs: np.ndarray,
    p_names: np.ndarray,
    mid: np.ndarray,
    signals: pd.DataFrame,
    *,
    key: str,
    stale_ms: int,
) -> Values:
    """`_at` of one source's rows, into `out` (NaN columns): the pieces' keys as run codes
    of `p_names`, their midpoints `mid`."""
    have = [c for c in out if c in signals.columns]
    if not have:
        return out
    right = signals[[key, "ts_ms", *have]].dropna(subset=[key, "ts_ms"])
    # An as-of join by key, in arrays: rows sorted (stably) by key and the rank of their
    # time; each piece finds the last row of its key at or before its midpoint by one
    # binary search, and takes it if it is no older than `stale_ms`. Of rows of one key and
    # time, the last given wins.
    keys = np.concatenate([p_names, right[key].astype(str).to_numpy(dtype=object)])
    codes = pd.factorize(keys)[0].astype(np.int64)
    p_key = np.append(codes[: p_names.size], -1)[p_runs]  # a missing key (-1) matches none
    r_key = codes[p_names.size :]
    r_t = right["ts_ms"].to_numpy(np.int64)
    times = np.unique(r_t)
    width = np.int64(times.size + 1)
    r_pos = r_key * width + np.searchsorted(times, r_t) + 1  # a time's rank counts from 1
    r_order = np.argsort(r_pos, kind="stable")
    r_sorted = r_pos[r_order]
    # the rank of the latest signal time at or before each midpoint (0: none)
    p_rank = np.searchsorted(times, mid, side="right")
    found = np.searchsorted(r_sorted, p_key * width + p_rank, side="right") - 1
    row = r_order[np.maximum(found, 0)]
    hit = (found >= 0) & (r_key[row] == p_key) & (mid - r_t[row] <= stale_ms)
    for c in have:
        values = right[c].to_numpy(dtype=np.float64, na_value=np.nan)
        out[c] = np.where(hit, values[row], np.nan)
    return out


def split_compute_idle(
    pieces: pd.DataFrame,
    *,
    pod_signals: pd.DataFrame | None,
    card_signals: pd.DataFrame | None,
    multi_card_pods: Collection[str],
    thresholds: CauseThresholds,
) -> pd.DataFrame:
    """One row per `compute_idle` piece: its span, its cause, the signal that decided it
    (`""` for `unexplained`), its seconds, and whether any signal was recorded for it."""
    idle = pieces[
        (pieces["category"] == WasteCategory.COMPUTE_IDLE.value) & pieces["pod_uid"].notna()
    ]
    if idle.empty:
        columns = [*IDLE_COLUMNS, HOUR] if HOUR in pieces.columns else IDLE_COLUMNS
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns}).astype(
            {"start_ms": np.int64, "end_ms": np.int64, "seconds": np.float64, "signalled": bool}
            | ({HOUR: np.int64} if HOUR in pieces.columns else {})
        )
    stale = round(thresholds.signal_stale_s * 1000)
    pod = _at(idle, pod_signals, key="pod_uid", columns=POD_SIGNALS, stale_ms=stale)
    card = _at(idle, card_signals, key="gpu", columns=CARD_SIGNALS, stale_ms=stale)
    t = thresholds
    link = np.where(np.isnan(card["pcie_link_bytes_s"]), t.pcie_default_bytes_s,
                    card["pcie_link_bytes_s"])  # fmt: skip
    # per run of pieces, not per piece: half a million pieces share a few hundred pods
    gang = run_isin(idle["pod_uid"].astype(str), set(multi_card_pods))
    running, waiting = pod["requests_running"], pod["requests_waiting"]
    serving = ~np.isnan(running) | ~np.isnan(waiting)
    queued = np.nan_to_num(running) + np.nan_to_num(waiting) > 0

    def at_least(frame: Values, column: str, bound: float | np.ndarray) -> np.ndarray:
        """True where the signal was recorded and reached `bound` (NaN never holds)."""
        return np.asarray(frame[column] >= bound, dtype=bool)

    rules: list[tuple[str, IdleCause, np.ndarray]] = [
        ("cpu_limit", IdleCause.INPUT_BOUND, at_least(pod, "cpu_limit_ratio", t.cpu_limit_ratio)),
        (
            "cpu_throttled",
            IdleCause.INPUT_BOUND,
            at_least(pod, "throttled_ratio", t.throttled_ratio),
        ),
        ("cpu_pressure", IdleCause.INPUT_BOUND, at_least(pod, "cpu_pressure", t.pressure_ratio)),
        ("io_pressure", IdleCause.INPUT_BOUND, at_least(pod, "io_pressure", t.pressure_ratio)),
        ("pcie", IdleCause.HOST_TRANSFER, at_least(card, "pcie_bytes_s", t.pcie_ratio * link)),
        (
            "nvlink",
            IdleCause.COMMUNICATION,
            gang & at_least(card, "nvlink_bytes_s", t.comm_bytes_s),
        ),
        ("network", IdleCause.COMMUNICATION, gang & at_least(pod, "net_bytes_s", t.comm_bytes_s)),
        ("serving_queue", IdleCause.BATCHING, serving & queued),
        ("serving_idle", IdleCause.LOW_DEMAND, serving & ~queued),
    ]
    cause = np.full(len(idle), IdleCause.UNEXPLAINED.value, dtype=object)
    deciding = np.full(len(idle), "", dtype=object)
    open_ = np.ones(len(idle), dtype=bool)
    for name, verdict, holds in rules:
        hit = open_ & holds
        cause[hit] = verdict.value
        deciding[hit] = name
        open_ &= ~hit
    signalled = np.zeros(len(idle), dtype=bool)
    for values in (*pod.values(), *card.values()):
        signalled |= ~np.isnan(values)
    out = pd.DataFrame(
        {
            "gpu": idle["gpu"].to_numpy(dtype=object),
            "pod_uid": idle["pod_uid"].to_numpy(dtype=object),
            "start_ms": idle["start_ms"].to_numpy(dtype=np.int64),
            "end_ms": idle["end_ms"].to_numpy(dtype=np.int64),
            "cause": cause,
            "deciding": deciding,
            "seconds": idle["seconds"].to_numpy(dtype=np.float64),
            "signalled": signalled,
        }
    )
    if HOUR in idle.columns:  # pieces cut at the hour grid keep their bucket
        out[HOUR] = idle[HOUR].to_numpy(dtype=np.int64)
    return out


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


CAUSE_COLUMNS = ["gpu", "pod_uid", "category", "cause", "seconds", "signalled_seconds"]


def kind_key(model: object) -> str:
    """A GPU model as both its spellings compare: NVML's `NVIDIA H100 80GB HBM3` and the
    node label's `NVIDIA-H100-80GB-HBM3` (what a pod's node selector names) are one kind."""
    return "-".join(str(model).lower().replace("_", " ").replace("-", " ").split())


def multi_card_pods(tenures: pd.DataFrame) -> set[str]:
    """Pods whose gang holds more than one card (`communication` can only hold for these)."""
    if tenures.empty:
        return set()
    cards = tenures.groupby("gang")["gpu"].nunique()
    gangs = set(cards[cards > 1].index)
    return set(tenures.loc[tenures["gang"].isin(gangs), "pod_uid"].astype(str))


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


def free_cause_frame(free: pd.DataFrame, *, demand_known: bool) -> pd.DataFrame:
    """`split_free`'s seconds as `CAUSE_COLUMNS` rows of `unallocated` (hour_ms too where
    they carry it): `blocked` and `unavailable` always rest on a signal, `no_demand` only
    where waiting pods were looked for (`split_causes`)."""
    on_signal = free["cause"] != FreeCause.NO_DEMAND.value
    out = free.assign(
        pod_uid=None,
        category=WasteCategory.UNALLOCATED.value,
        signalled_seconds=np.where(on_signal | demand_known, free["seconds"], 0.0),
    )
    return out[[*CAUSE_COLUMNS, HOUR] if HOUR in free.columns else CAUSE_COLUMNS]


def split_causes(
    pieces: pd.DataFrame,
    *,
    tenures: pd.DataFrame,
    cards: pd.DataFrame,
    pod_signals: pd.DataFrame | None,
    card_signals: pd.DataFrame | None,
    unavailable: pd.DataFrame | None,
    demand: pd.DataFrame | None,
    demand_known: bool,
    thresholds: CauseThresholds,
    free: bool = True,
) -> pd.DataFrame:
    """Seconds per (gpu, pod_uid, category, cause) of both splits (`CAUSE_COLUMNS`), and the
    part of them judged on a recorded signal. `cards`: uuid, node, model (a card's kind is
    its model). `demand_known`: whether waiting pods were looked for at all (pod objects
    were recorded); without it `no_demand` rests on no signal, while `unavailable` and
    `blocked` always rest on one. `free=False`: `compute_idle` alone, the free time left to
    the caller (`free_shares`, then `split_free` and `free_cause_frame`), as an audit in
    chunks does to split every chunk's free time at once."""
    idle = split_compute_idle(
        pieces,
        pod_signals=pod_signals,
        card_signals=card_signals,
        multi_card_pods=multi_card_pods(tenures),
        thresholds=thresholds,
    )
    card_node, card_kind = card_maps(cards)
    free_time = split_unallocated(
        pieces if free else pieces[:0],
        card_node=card_node,
        card_kind=card_kind,
        unavailable=unavailable,
        demand=keyed_demand(demand),
    )
    idle = idle.assign(
        category=WasteCategory.COMPUTE_IDLE.value,
        signalled_seconds=np.where(idle["signalled"], idle["seconds"], 0.0),
    )
    columns = [*CAUSE_COLUMNS, HOUR] if HOUR in pieces.columns else CAUSE_COLUMNS
    both = pd.concat(
        [idle[columns], free_cause_frame(free_time, demand_known=demand_known)],
        ignore_index=True,
    )
    if both.empty:
        return both.astype({"seconds": np.float64, "signalled_seconds": np.float64})
    keys = ["gpu", "pod_uid", "category", "cause", *columns[len(CAUSE_COLUMNS) :]]
    summed = both.groupby(keys, dropna=False, as_index=False, sort=True)[
        ["seconds", "signalled_seconds"]
    ].sum()
    summed["pod_uid"] = summed["pod_uid"].astype(object).where(summed["pod_uid"].notna(), None)
    return summed[columns]
