"""Per-card timelines for `auditor explain`: utilisation over time with categories shaded.

Pure pandas/numpy, no I/O. Two steps:

1. `sample_segments` approximates, sample by sample, how each covered interval of a held card
   splits into categories (columns `gpu, pod_uid, start_ms, end_ms` and one fraction column
   per category, each row summing to 1). The classifier's totals stay the reference; this
   only decides *where in time* the shading goes, by these rules:
   - a sample covers `[t, next t)`, or one period where the next sample is more than
     `gap_periods` periods away (the rest is unobserved); a rolled-up minute's row covers
     its `cover_ms` (as in `coverage.load_samples`); NaN utilisation is unobserved;
   - `u/100` is busy; the idle part goes, first match wins, to the episode of a stored
     finding of that card and pod (`startup`, `teardown`, `reserved_idle`) that holds the
     sample's instant; else the gang is compared at that instant (samples bucketed to the
     gang's period grid): an idle sample while another card is active is `straggler_wait`;
     an active one more than `straggler_tolerance_pct` behind the gang's busiest card
     waits `(u_max - u)/100`; an idle sample in a gang-wide gap of checkpoint length
     (`checkpoint_min_gap_s`..`checkpoint_max_gap_s`) inside the span of the gang's
     `checkpoint` finding is `checkpoint`; the rest is `compute_idle`.
   Where the classifier's regular-series test or run boundaries differ from these, the
   shading may differ from the totals by a few samples; the totals printed next to the chart
   are the classifier's own.
2. `bucketise` integrates those fractions exactly over at most `buckets` equal time buckets
   per card (piecewise-linear cumulative sums, so a long segment splits across buckets in
   proportion to time). Held time no sample covers is `unobserved`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from auditor.classify.coverage import ROLLED_PERIOD_MS
from auditor.model import CATEGORIES, WasteCategory
from auditor.settings import Thresholds

FloatArr = npt.NDArray[np.float64]
CATEGORY_NAMES = [c.value for c in CATEGORIES]
EPISODE_KINDS = ("startup", "teardown", "reserved_idle")


@dataclass(frozen=True)
class CardTimeline:
    """One card of one pod over `edges` (ms, `len = buckets + 1`)."""

    gpu: str
    pod_uid: str
    edges: npt.NDArray[np.int64]
    util: FloatArr
    """Mean utilisation (percent) over each bucket's observed time; NaN where none."""
    seconds: dict[str, FloatArr]
    """Seconds per category per bucket; held time only."""

    def dominant(self) -> list[str]:
        """Per bucket: the biggest non-busy category ('' where the pod held none of it)."""
        return self.dominant_share()[0]

    def dominant_share(self) -> tuple[list[str], FloatArr]:
        """Per bucket: the biggest non-busy category and its share of the held time."""
        idle = [c for c in CATEGORY_NAMES if c != WasteCategory.BUSY.value]
        stack = np.vstack([self.seconds[c] for c in idle])
        total = stack.sum(axis=0) + self.seconds[WasteCategory.BUSY.value]
        best = np.argmax(stack, axis=0)
        top = np.max(stack, axis=0)
        share: FloatArr = np.where(total > 0, top / np.where(total > 0, total, 1.0), 0.0)
        names = ["" if t <= 0 else idle[int(b)] for b, t in zip(best, total, strict=True)]
        return names, share


def _coverage(samples: pd.DataFrame, thresholds: Thresholds) -> pd.DataFrame:
    rolled_up = "cover_ms" in samples.columns and bool(samples["cover_ms"].notna().any())
    cols = ["gpu", "ts_ms", "util", *(["cover_ms"] if rolled_up else [])]
    s = samples[cols].sort_values(["gpu", "ts_ms"], kind="stable")
    s = s.drop_duplicates(["gpu", "ts_ms"], keep="last").reset_index(drop=True)
    nxt = s.groupby("gpu")["ts_ms"].shift(-1)
    if not rolled_up:
        period = s.groupby("gpu")["ts_ms"].transform(lambda x: x.diff().median())
        period = period.fillna(thresholds.default_period_s * 1000).clip(lower=1)
    else:
        period = _raw_period(s, thresholds)
    dt = nxt - s["ts_ms"]
    cover = dt.where(dt.notna() & (dt <= thresholds.gap_periods * period), period)
    if rolled_up:  # a rolled-up minute's row covers what it says, up to the next row
        own = s["cover_ms"].where(dt.isna() | (s["cover_ms"] <= dt), dt)
        cover = own.where(s["cover_ms"].notna(), cover)
        s = s.drop(columns=["cover_ms"])
    return s.assign(end_ms=(s["ts_ms"] + cover).astype("int64"), period=period)


def _raw_period(s: pd.DataFrame, thresholds: Thresholds) -> pd.Series:
    """Per row, its card's median spacing of raw samples, as `coverage.load_samples` has it."""
    rolled = s["cover_ms"].notna()
    same = s["gpu"] == s["gpu"].shift()
    spacing = s["ts_ms"].diff().where(same & ~rolled & ~rolled.shift(fill_value=True))
    period = spacing.groupby(s["gpu"]).transform("median")
    only_rolled = rolled.groupby(s["gpu"]).transform("all") | (
        period.isna() & rolled.groupby(s["gpu"]).transform("any")
    )
    period = period.where(~only_rolled, float(ROLLED_PERIOD_MS))
    return period.fillna(thresholds.default_period_s * 1000).clip(lower=1)


def _clip_to_tenures(cov: pd.DataFrame, tenures: pd.DataFrame) -> pd.DataFrame:
    ten = tenures[["gpu", "pod_uid", "gang", "start_ms", "end_ms"]].rename(
        columns={"start_ms": "t0", "end_ms": "t1"}
    )
    m = cov.merge(ten, on="gpu")
    m["start_ms"] = np.maximum(m["ts_ms"], m["t0"])
    m["end_ms"] = np.minimum(m["end_ms"], m["t1"])
    m = m[(m["end_ms"] > m["start_ms"]) & m["util"].notna()]
    return m.drop(columns=["t0", "t1"]).reset_index(drop=True)


def clip_to_observed(
    tenures: pd.DataFrame, samples: pd.DataFrame, *, thresholds: Thresholds
) -> pd.DataFrame:
    """Tenures cut to their card's observed span (first sample to the last one's end), as
    the classifier counts capacity; tenures of cards never sampled go."""
    cov = _coverage(samples, thresholds)
    span = cov.groupby("gpu").agg(first=("ts_ms", "min"), last=("end_ms", "max")).reset_index()
    t = tenures.merge(span, on="gpu")
    t = t.assign(
        start_ms=np.maximum(t["start_ms"], t["first"]), end_ms=np.minimum(t["end_ms"], t["last"])
    )
    return t[t["end_ms"] > t["start_ms"]].drop(columns=["first", "last"]).reset_index(drop=True)


def _gang_view(m: pd.DataFrame, thresholds: Thresholds) -> pd.DataFrame:
    """Per row: the busiest *other* card of the gang at that instant, and the length of the
    gang-wide idle stretch it is in (ms, 0 where the gang is not all idle)."""
    step = m.groupby("gang")["period"].transform("max")
    key = np.round(m["ts_ms"] / step).astype("int64")
    g = pd.DataFrame({"gang": m["gang"], "key": key, "util": m["util"], "i": m.index})
    g = g.sort_values(["gang", "key", "util"], ascending=[True, True, False], kind="stable")
    first = g.groupby(["gang", "key"])["util"].transform("first")
    is_top = ~g.duplicated(["gang", "key"])
    same_next = (g["gang"] == g["gang"].shift(-1)) & (g["key"] == g["key"].shift(-1))
    second = g["util"].shift(-1).where(same_next)  # on a group's top row: the runner-up
    other = np.where(is_top, second, first)
    g = g.assign(other=other, step=step.loc[g["i"]].to_numpy())
    inst = g.groupby(["gang", "key"], as_index=False).agg(
        top=("util", "max"), step=("step", "first")
    )
    inst["idle"] = inst["top"] <= thresholds.idle_threshold_pct
    brk = (inst["gang"] != inst["gang"].shift()) | (inst["key"] != inst["key"].shift() + 1)
    brk |= inst["idle"] != inst["idle"].shift()
    inst["run"] = brk.cumsum()
    inst["gap_ms"] = inst.groupby("run")["step"].transform("sum").where(inst["idle"], 0)
    g = g.merge(inst[["gang", "key", "gap_ms"]], on=["gang", "key"], how="left")
    return g.set_index("i")[["other", "gap_ms"]].reindex(m.index)


def _in_episodes(m: pd.DataFrame, episodes: pd.DataFrame, by: list[str]) -> pd.Series:
    """Per row of `m`: the kind of the first episode (same `by` keys) holding its start."""
    out = pd.Series("", index=m.index, dtype=object)
    if episodes.empty:
        return out
    j = m[[*by, "start_ms"]].reset_index().merge(episodes, on=by)
    j = j[(j["start_ms"] >= j["e0"]) & (j["start_ms"] < j["e1"])].drop_duplicates("index")
    out.loc[j["index"].to_numpy()] = j["kind"].to_numpy()
    return out


def sample_segments(
    samples: pd.DataFrame,
    tenures: pd.DataFrame,
    findings: pd.DataFrame,
    *,
    thresholds: Thresholds,
) -> pd.DataFrame:
    """Covered, held intervals with the fraction of each category (module docstring, 1)."""
    cols = ["gpu", "pod_uid", "start_ms", "end_ms", *CATEGORY_NAMES]
    if samples.empty or tenures.empty:
        return pd.DataFrame(columns=cols)
    m = _clip_to_tenures(_coverage(samples, thresholds), tenures)
    if m.empty:
        return pd.DataFrame(columns=cols)
    view = _gang_view(m, thresholds)
    u = m["util"].to_numpy(dtype=np.float64).clip(0, 100)
    other = view["other"].to_numpy(dtype=np.float64)
    idle = u <= thresholds.idle_threshold_pct
    f = {c: np.zeros(len(m)) for c in CATEGORY_NAMES}
    f["busy"] = u / 100.0
    rest = 1.0 - u / 100.0
    ep = findings[findings["kind"].isin(EPISODE_KINDS) & findings["start_ms"].notna()]
    ep = ep.assign(e0=ep["start_ms"].astype("int64"), e1=ep["end_ms"].astype("int64"))
    kind = _in_episodes(m, ep[["gpu", "pod_uid", "kind", "e0", "e1"]], ["gpu", "pod_uid"])
    ck = findings[(findings["kind"] == "checkpoint") & findings["start_ms"].notna()]
    ck = ck.assign(kind="checkpoint", e0=ck["start_ms"].astype("int64"))
    ck = ck.assign(e1=ck["end_ms"].astype("int64") + 1)
    in_ck = _in_episodes(m, ck[["gang", "kind", "e0", "e1"]], ["gang"]) != ""
    episode = (kind != "").to_numpy() & idle
    for k in EPISODE_KINDS:
        sel = episode & (kind == k).to_numpy()
        f[k][sel] = rest[sel]
    free = ~episode
    wait = free & idle & (other > thresholds.idle_threshold_pct)
    f["straggler_wait"][wait] = rest[wait]
    gap = view["gap_ms"].to_numpy(dtype=np.float64)
    ck_len = (gap >= thresholds.checkpoint_min_gap_s * 1000) & (
        gap <= thresholds.checkpoint_max_gap_s * 1000
    )
    chk = free & idle & ~wait & in_ck.to_numpy() & ck_len
    f["checkpoint"][chk] = rest[chk]
    behind = free & ~idle & (other - u > thresholds.straggler_tolerance_pct)
    f["straggler_wait"][behind] = (other[behind] - u[behind]) / 100.0
    f["compute_idle"][behind] = (100.0 - other[behind]) / 100.0
    plain = free & ~wait & ~chk & ~behind
    f["compute_idle"][plain] = rest[plain]
    out = m[["gpu", "pod_uid", "start_ms", "end_ms"]].copy()
    for c in CATEGORY_NAMES:
        out[c] = f[c]
    return out


def _integral(starts: FloatArr, ends: FloatArr, rate: FloatArr, edges: FloatArr) -> FloatArr:
    """Integral of a piecewise-constant rate over each bucket of `edges`, in seconds."""
    xp = np.column_stack([starts, ends]).ravel()
    cum = np.cumsum(rate * (ends - starts))
    fp = np.column_stack([np.concatenate([[0.0], cum[:-1]]), cum]).ravel()
    at = np.interp(edges, xp, fp, left=0.0, right=float(fp[-1]) if fp.size else 0.0)
    out: FloatArr = np.diff(at) / 1000.0
    return out


def bucketise(
    segments: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    span: tuple[int, int],
    buckets: int = 600,
) -> list[CardTimeline]:
    """Per (card, pod) of `tenures`: seconds per category and mean util per bucket of `span`."""
    lo, hi = span
    n = max(1, min(buckets, (hi - lo) // 1000))
    edges = np.linspace(lo, hi, n + 1).round().astype(np.int64)
    fe = edges.astype(np.float64)
    out: list[CardTimeline] = []
    by_card = {k: v for k, v in segments.groupby(["gpu", "pod_uid"], sort=False)}
    for (gpu, pod), ten in tenures.groupby(["gpu", "pod_uid"], sort=True):
        t0 = ten["start_ms"].to_numpy(dtype=np.float64)
        t1 = ten["end_ms"].to_numpy(dtype=np.float64)
        held = _integral(t0, t1, np.ones(t0.size), fe)
        seg = by_card.get((gpu, pod))
        sec = {c: np.zeros(n) for c in CATEGORY_NAMES}
        if seg is not None and len(seg):
            seg = seg.sort_values("start_ms")
            s0 = seg["start_ms"].to_numpy(dtype=np.float64)
            s1 = seg["end_ms"].to_numpy(dtype=np.float64)
            for c in CATEGORY_NAMES:
                sec[c] = _integral(s0, s1, seg[c].to_numpy(dtype=np.float64), fe)
        observed = sum(sec.values(), np.zeros(n))
        sec["unobserved"] = sec["unobserved"] + np.clip(held - observed, 0.0, None)
        with np.errstate(invalid="ignore", divide="ignore"):
            util = np.where(observed > 0, 100.0 * sec["busy"] / observed, np.nan)
        out.append(CardTimeline(str(gpu), str(pod), edges, util, sec))
    return out
