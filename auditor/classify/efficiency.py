"""Busy is not efficiency (SPEC §8): SM activity per held card, and `stalled_busy` episodes.

GPU utilisation says a kernel was running, not that the card did useful work: a collective
waiting on a hung rank spins one kernel and reads 100 %. Where a source records SM activity
(`sm_active`, a 0-1 fraction: dcgm-exporter's `DCGM_FI_PROF_SM_ACTIVE`, NVML GPM in the
sampler), this module sums, per (card, pod) held inside the window,

- `sm_active_seconds`: `sm_active · dt` over the held, covered time (the card's SM activity
  as GPU-seconds, next to `busy`), and
- `sm_busy_seconds`: the busy seconds (`u · dt`) of samples that had SM data, so a report can
  say what share of busy time SM activity covers at all,

and finds **`stalled_busy`** episodes: maximal runs of consecutive samples of one tenure card
at utilisation ≥ `util_pct` with SM activity ≤ `sm_active_max`, unbroken by a coverage gap,
lasting at least `min_s` over the whole tenure (then clipped to the window, like every
other finding). Coverage (what stretch of time each sample stands for) is SPEC §3's, from
`coverage.load_samples`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify.arrays import BoolArr, FloatArr, IntArr
from auditor.classify.coverage import load_samples
from auditor.classify.findings import FINDING_COLUMNS, empty_findings
from auditor.model import Window
from auditor.settings import Thresholds

SM_COLUMNS = ["gpu", "pod_uid", "sm_active_seconds", "sm_busy_seconds"]


@dataclass(frozen=True)
class StallRule:
    """When a busy card is `stalled_busy`: SPEC §8's defaults."""

    util_pct: float = 90.0
    """Utilisation at or above this (percent) reads as busy."""
    sm_active_max: float = 0.05
    """SM activity at or below this (a 0-1 fraction) means the SMs did next to nothing."""
    min_s: float = 600.0
    """Shortest episode reported (seconds)."""


@dataclass(frozen=True)
class Efficiency:
    """What `efficiency` returns: `sm` (columns of `SM_COLUMNS`, one row per held card and
    pod with SM data in the window) and `findings` (the `stalled_busy` rows, in the columns of
    `auditor.classify.findings`)."""

    sm: pd.DataFrame
    findings: pd.DataFrame


def empty_sm() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu": pd.Series([], dtype=object),
            "pod_uid": pd.Series([], dtype=object),
            "sm_active_seconds": pd.Series([], dtype=np.float64),
            "sm_busy_seconds": pd.Series([], dtype=np.float64),
        }
    )


def _sm_per_sample(samples: pd.DataFrame, uuids: np.ndarray, gpu: IntArr, ts: IntArr) -> FloatArr:
    """The highest SM activity recorded at each (card, time) of the sample table; NaN where
    none was."""
    have = samples[samples["sm_active"].notna()]
    keys = pd.DataFrame(
        {
            "gpu": have["gpu"].astype(str).to_numpy(dtype=object),
            "ts_ms": have["ts_ms"].to_numpy(dtype=np.int64),
            "sm": np.clip(have["sm_active"].to_numpy(dtype=np.float64), 0.0, 1.0),
        }
    )
    best = keys.groupby(["gpu", "ts_ms"], sort=False)["sm"].max()
    index = pd.MultiIndex.from_arrays([uuids[gpu], ts])
    return best.reindex(index).to_numpy(dtype=np.float64, na_value=np.nan)


def _runs(flag: BoolArr, *, joined: BoolArr) -> list[tuple[int, int]]:
    """[first, last] index pairs of maximal runs of True, where `joined[i]` says row i runs
    on into row i + 1."""
    cont = np.zeros(flag.size, dtype=np.bool_)
    cont[1:] = flag[:-1] & joined[:-1]
    begin = np.flatnonzero(flag & ~cont)
    stop = np.zeros(flag.size, dtype=np.bool_)
    stop[:-1] = ~(flag[1:] & joined[:-1])
    stop[-1:] = True
    finish = np.flatnonzero(flag & stop)
    return list(zip(begin.tolist(), finish.tolist(), strict=True))


def efficiency(
    samples: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    window: Window,
    thresholds: Thresholds,
    rule: StallRule | None = None,
    hour_ms: int | None = None,
) -> Efficiency:
    """SM activity and `stalled_busy` findings of the held cards inside `window`.

    `samples`: gpu, ts_ms, util (percent) and `sm_active` (0-1; NaN or absent where not
    recorded). `tenures`: gpu, pod_uid, gang, start_ms, end_ms, and optionally `share` (the
    part of the card a tenure holds, SPEC §7; 1 where absent), which scales its seconds.
    `hour_ms`: `sm` per bucket of that length too (`auditor.classify.hours`), with an
    `hour_ms` column, the bucket's start; the findings stay whole.
    """
    rule = rule or StallRule()
    if "sm_active" not in samples.columns or not bool(samples["sm_active"].notna().any()):
        return Efficiency(empty_sm(), empty_findings())
    table = load_samples(samples, thresholds=thresholds)
    uuids = np.asarray(table.uuids, dtype=object)
    sm = _sm_per_sample(samples, uuids, table.gpu, table.ts)
    util = table.util
    first = np.searchsorted(table.gpu, np.arange(uuids.size), side="left")
    last = np.searchsorted(table.gpu, np.arange(uuids.size), side="right")
    code = {str(u): i for i, u in enumerate(uuids.tolist())}
    w_lo, w_hi = window
    sm_rows: list[dict[str, object]] = []
    found: list[dict[str, object]] = []
    shares = (
        tenures["share"].to_numpy(dtype=np.float64, na_value=1.0)
        if "share" in tenures.columns
        else np.ones(len(tenures))
    )
    for (gpu_s, pod, gang, t_lo, t_hi), share in zip(
        tenures[["gpu", "pod_uid", "gang", "start_ms", "end_ms"]].itertuples(index=False),
        shares.tolist(),
        strict=True,
    ):
        g = code.get(str(gpu_s))
        if g is None or pd.isna(t_lo) or pd.isna(t_hi) or pod is None or pd.isna(pod):
            continue
        lo, hi = int(t_lo), int(t_hi)
        a, b = int(first[g]), int(last[g])
        ts, end = table.ts[a:b], table.cov_end[a:b]
        inside = (ts < hi) & (end > lo)
        if not inside.any():
            continue
        ts, end = ts[inside], end[inside]
        u, s = util[a:b][inside], sm[a:b][inside]
        # seconds of each sample inside the tenure, and inside the tenure and the window
        held = (np.minimum(end, hi) - np.maximum(ts, lo)) / 1000.0
        in_window = (
            np.clip(np.minimum(end, min(hi, w_hi)) - np.maximum(ts, max(lo, w_lo)), 0, None)
            / 1000.0
        )
        has_sm = ~np.isnan(s)
        if hour_ms is not None and has_sm.any() and in_window[has_sm].sum() > 0:
            sm_rows += _sm_by_hour(
                str(gpu_s), str(pod), share, s=s, u=u, lo=np.maximum(ts, max(lo, w_lo)),
                hi=np.minimum(end, min(hi, w_hi)), window=window, bucket_ms=hour_ms,
            )  # fmt: skip
        elif has_sm.any() and in_window[has_sm].sum() > 0:
            readable = has_sm & ~np.isnan(u)
            sm_rows.append(
                {
                    "gpu": str(gpu_s),
                    "pod_uid": str(pod),
                    "sm_active_seconds": float((s[has_sm] * in_window[has_sm]).sum()) * share,
                    "sm_busy_seconds": float((u[readable] / 100.0 * in_window[readable]).sum())
                    * share,
                }
            )
        stalled = has_sm & (u >= rule.util_pct) & (s <= rule.sm_active_max)
        joined = np.ones(ts.size, dtype=np.bool_)
        joined[:-1] = end[:-1] >= ts[1:]  # a coverage gap breaks an episode
        for i, j in _runs(stalled, joined=joined):
            if held[i : j + 1].sum() < rule.min_s:
                continue
            seconds = float(in_window[i : j + 1].sum()) * share
            if seconds <= 0:
                continue
            start = max(int(ts[i]), lo, w_lo)
            stop = min(int(end[j]), hi, w_hi)
            found.append(
                {
                    "kind": "stalled_busy",
                    "gang": None if gang is None or pd.isna(gang) else str(gang),
                    "gpu": str(gpu_s),
                    "pod_uid": str(pod),
                    "start_ms": start,
                    "end_ms": stop,
                    "seconds": seconds,
                    "detail": (
                        f"{float(np.mean(u[i : j + 1])):.0f} % utilisation with"
                        f" {100 * float(np.mean(s[i : j + 1])):.1f} % SM activity for"
                        f" {held[i : j + 1].sum() / 60:.0f} min"
                    ),
                }
            )
    columns = SM_COLUMNS if hour_ms is None else [*SM_COLUMNS, "hour_ms"]
    sm_frame = pd.DataFrame(sm_rows, columns=columns) if sm_rows else empty_sm()
    if sm_rows:
        sm_frame = sm_frame.groupby(columns[:2] + columns[4:], as_index=False, sort=True).sum()
        sm_frame = sm_frame[columns]
    elif hour_ms is not None:
        sm_frame = sm_frame.assign(hour_ms=pd.Series([], dtype=np.int64))
    findings = empty_findings()
    if found:
        findings = pd.DataFrame(found, columns=FINDING_COLUMNS).sort_values(
            ["gpu", "pod_uid", "start_ms"], kind="stable", ignore_index=True
        )
        findings["start_ms"] = findings["start_ms"].astype(np.int64)
        findings["end_ms"] = findings["end_ms"].astype(np.int64)
    return Efficiency(sm_frame, findings)


def _sm_by_hour(
    gpu: str,
    pod: str,
    share: float,
    *,
    s: FloatArr,
    u: FloatArr,
    lo: IntArr,
    hi: IntArr,
    window: Window,
    bucket_ms: int,
) -> list[dict[str, object]]:
    """One tenure's SM rows per bucket: each sample's time inside the tenure and the window
    (`[lo, hi)`) cut at the hour grid, so that the buckets sum to the window's figures."""
    from auditor.classify.hours import bucket_rows

    rows, bucket = bucket_rows(lo, hi, window=window, bucket_ms=bucket_ms)
    first = window.start_ms // bucket_ms * bucket_ms
    b_lo = np.maximum(first + bucket * bucket_ms, window.start_ms)
    b_hi = first + (bucket + 1) * bucket_ms
    dt = (np.minimum(hi[rows], b_hi) - np.maximum(lo[rows], b_lo)) / 1000.0
    s_r, u_r = s[rows], u[rows]
    has_sm = ~np.isnan(s_r)
    readable = has_sm & ~np.isnan(u_r)
    out: list[dict[str, object]] = []
    for start in np.unique(b_lo[has_sm]).tolist():
        here = b_lo == start
        out.append(
            {
                "gpu": gpu,
                "pod_uid": pod,
                "sm_active_seconds": float((s_r[here & has_sm] * dt[here & has_sm]).sum()) * share,
                "sm_busy_seconds": float((u_r[here & readable] / 100.0 * dt[here & readable]).sum())
                * share,
                "hour_ms": int(start),
            }
        )
    return out
