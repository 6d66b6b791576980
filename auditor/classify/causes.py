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

**`unallocated`**, per free card-second: `auditor.classify.free_time`.

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

from collections.abc import Collection
from enum import StrEnum

import numpy as np
import pandas as pd

from auditor.classify.arrays import codes_in, run_factorize
from auditor.classify.free_time import (
    HOUR,
    FreeCause,
)
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


Values = dict[str, np.ndarray]
"""Signal column -> its value at each piece (float, NaN where none is recent)."""


def _text_runs(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """`run_factorize` of the values as text: the pieces come grouped by card and pod, so
    only their runs' keys are hashed, and only the distinct ones made text."""
    codes, names = run_factorize(values)
    return codes, np.array([str(n) for n in names], dtype=object)


def _at(
    pieces: pd.DataFrame,
    signals: pd.DataFrame | None,
    *,
    key: str,
    keys: tuple[np.ndarray, np.ndarray],
    columns: tuple[str, ...],
    stale_ms: int,
) -> Values:
    """Each signal column's value at each piece's midpoint (NaN where none is recent). Rows
    of several sources (a `source` column: the sampler's cgroup reading, cAdvisor, a
    server's gauges) are read apart, so that one source's row never hides another's: the
    first source in name order with a recent value gives it. `keys`: the pieces' `key` column
    as `_text_runs` codes it."""
    n = len(pieces)
    if signals is None or signals.empty:
        return _unknown(columns, n)
    if "mid_ms" in pieces.columns:  # the whole piece's midpoint, however a window cut it
        mid = pieces["mid_ms"].to_numpy(np.int64)
    else:
        mid = (pieces["start_ms"].to_numpy(np.int64) + pieces["end_ms"].to_numpy(np.int64)) // 2
    p_runs, p_names = keys
    if "source" not in signals.columns:
        return _at_source(columns, p_runs, p_names, mid, signals, key=key, stale_ms=stale_ms)
    out: Values = {}
    for _, rows in signals.groupby("source", sort=True):
        got = _at_source(
            columns, p_runs, p_names, mid, rows.drop(columns="source"), key=key, stale_ms=stale_ms
        )
        out = got if not out else {c: np.where(np.isnan(v), got[c], v) for c, v in out.items()}
    return out or _unknown(columns, n)


def _unknown(columns: tuple[str, ...], n: int) -> Values:
    return {c: np.full(n, np.nan) for c in columns}


def _at_source(
    columns: tuple[str, ...],
    p_runs: np.ndarray,
    p_names: np.ndarray,
    mid: np.ndarray,
    signals: pd.DataFrame,
    *,
    key: str,
    stale_ms: int,
) -> Values:
    """`_at` of one source's rows: the pieces' keys as run codes of `p_names`, their
    midpoints `mid`; NaN for the `columns` the rows do not carry."""
    have = [c for c in columns if c in signals.columns]
    out = _unknown(tuple(c for c in columns if c not in have), mid.size)
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
    return {c: out[c] for c in columns}


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
    # compared as arrays, and the pods by their runs' codes (-1: nobody held the card):
    # pandas' comparison and notna of a text column cost more than the rules below
    held, _ = run_factorize(pieces["pod_uid"])
    idle = pieces[
        (pieces["category"].to_numpy(dtype=object) == WasteCategory.COMPUTE_IDLE.value)
        & (held >= 0)
    ]
    if idle.empty:
        columns = [*IDLE_COLUMNS, HOUR] if HOUR in pieces.columns else IDLE_COLUMNS
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns}).astype(
            {"start_ms": np.int64, "end_ms": np.int64, "seconds": np.float64, "signalled": bool}
            | ({HOUR: np.int64} if HOUR in pieces.columns else {})
        )
    stale = round(thresholds.signal_stale_s * 1000)
    pod_runs, pod_names = _text_runs(idle["pod_uid"])
    pod = _at(
        idle,
        pod_signals,
        key="pod_uid",
        keys=(pod_runs, pod_names),
        columns=POD_SIGNALS,
        stale_ms=stale,
    )
    card = _at(
        idle,
        card_signals,
        key="gpu",
        keys=_text_runs(idle["gpu"]),
        columns=CARD_SIGNALS,
        stale_ms=stale,
    )
    t = thresholds
    link = np.where(np.isnan(card["pcie_link_bytes_s"]), t.pcie_default_bytes_s,
                    card["pcie_link_bytes_s"])  # fmt: skip
    # per run of pieces, not per piece: half a million pieces share a few hundred pods
    gang = codes_in(pod_runs, pod_names, set(multi_card_pods))
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
    cause = _filled(len(idle), IdleCause.UNEXPLAINED.value)
    deciding = _filled(len(idle), "")
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


def _filled(n: int, text: str) -> np.ndarray:
    """An object array of `n` times the one `text` (`np.full` makes a new string per row)."""
    out = np.empty(n, dtype=object)
    out.fill(text)
    return out


CAUSE_COLUMNS = ["gpu", "pod_uid", "category", "cause", "seconds", "signalled_seconds"]


def multi_card_pods(tenures: pd.DataFrame) -> set[str]:
    """Pods whose gang holds more than one card (`communication` can only hold for these)."""
    if tenures.empty:
        return set()
    cards = tenures.groupby("gang")["gpu"].nunique()
    gangs = set(cards[cards > 1].index)
    return set(tenures.loc[tenures["gang"].isin(gangs), "pod_uid"].astype(str))


def free_cause_frame(free: pd.DataFrame, *, demand_known: bool) -> pd.DataFrame:
    """`split_free`'s seconds as `CAUSE_COLUMNS` rows of `unallocated` (hour_ms too where
    they carry it): `blocked` and `unavailable` always rest on a signal, `no_demand` only
    where waiting pods were looked for at all (pod objects were recorded)."""
    on_signal = free["cause"] != FreeCause.NO_DEMAND.value
    out = free.assign(
        pod_uid=None,
        category=WasteCategory.UNALLOCATED.value,
        signalled_seconds=np.where(on_signal | demand_known, free["seconds"], 0.0),
    )
    return out[[*CAUSE_COLUMNS, HOUR] if HOUR in free.columns else CAUSE_COLUMNS]


def idle_causes(
    pieces: pd.DataFrame,
    *,
    tenures: pd.DataFrame,
    pod_signals: pd.DataFrame | None,
    card_signals: pd.DataFrame | None,
    thresholds: CauseThresholds,
) -> pd.DataFrame:
    """Seconds per (gpu, pod_uid, category, cause) of `compute_idle` (`CAUSE_COLUMNS`, and
    hour_ms where the pieces carry it), and the part of them judged on a recorded signal.
    Free time is split apart, once every chunk's is known (`free_time.free_shares`, then
    `split_free` and `free_cause_frame`)."""
    idle = split_compute_idle(
        pieces,
        pod_signals=pod_signals,
        card_signals=card_signals,
        multi_card_pods=multi_card_pods(tenures),
        thresholds=thresholds,
    )
    columns = [*CAUSE_COLUMNS, HOUR] if HOUR in pieces.columns else CAUSE_COLUMNS
    rows = idle.assign(
        category=WasteCategory.COMPUTE_IDLE.value,
        signalled_seconds=np.where(idle["signalled"], idle["seconds"], 0.0),
    )[columns]
    if rows.empty:
        return rows.astype({"seconds": np.float64, "signalled_seconds": np.float64})
    # Summed per (gpu, pod, cause[, hour]) as a groupby of those columns sorts them, but
    # grouped by one integer made of their sorted codes: the pieces come in runs of one card,
    # pod and cause, so only each run's first value is hashed (`run_factorize`), where a
    # groupby of the text columns hashed every row of each.
    keys = ["gpu", "pod_uid", "cause", *columns[len(CAUSE_COLUMNS) :]]
    coded = [run_factorize(rows[k], sort=True) for k in keys]
    key = np.zeros(len(rows), dtype=np.int64)
    for codes, names in coded:
        assert codes.size == 0 or codes.min() >= 0, "compute idle pieces name a card and pod"
        key = key * max(len(names), 1) + codes
    summed = rows[["seconds", "signalled_seconds"]].groupby(key, sort=True).sum()
    at = summed.index.to_numpy(np.int64)
    out: dict[str, object] = {}
    for k, (_, names) in reversed(list(zip(keys, coded, strict=True))):
        out[k] = names[at % max(len(names), 1)]
        at = at // max(len(names), 1)
    frame = pd.DataFrame(
        {
            "gpu": pd.Series(out["gpu"], dtype=object),
            "pod_uid": pd.Series(out["pod_uid"], dtype=object),
            "category": WasteCategory.COMPUTE_IDLE.value,
            "cause": pd.Series(out["cause"], dtype=object),
            "seconds": summed["seconds"].to_numpy(np.float64),
            "signalled_seconds": summed["signalled_seconds"].to_numpy(np.float64),
        }
    )
    if HOUR in columns:
        frame[HOUR] = np.asarray(out[HOUR], dtype=np.int64)
    return frame[columns]
