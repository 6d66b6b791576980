"""Shared and partitioned cards (SPEC §7): every tenant of a card as a card of its own.

A physical card has one card-second of capacity per second however it is divided. Two kinds
of division reach the classifier:

- **MIG.** Each instance is a GPU of its own in the samples, with its own utilisation
  (relative to the instance). It is classified as an exclusive card and every second of it
  is weighted by the share of the physical card it holds *then* (`auditor.classify.mig`:
  compute slices / 7, or / 4 on an A30, over the card's layout in time; its samples are cut
  where that share changes). The physical card itself becomes pseudo-samples over its whole
  observed span, one per stretch of its layout, weighted by what the instances present leave:
  1 where none is (MIG off: its own samples, pods holding it whole, are classified as on any
  card; MIG on and empty: `unallocated`), the uncarved slices beside instances, held by
  nobody: `unallocated` where a sample of the card or of an instance covers the stretch,
  else `unobserved`. A card that reports no samples of its own (nvidia-smi and dcgm-exporter
  show no utilisation for a MIG-enabled card) has unreadable utilisation there.
- **Tenures with a share** (time-slicing and MPS replicas, HAMi, Run:ai fractions,
  gpu-milli; `share` < 1 in the tenures, NaN where unknown). Each such card is cut into
  pseudo-samples at its samples and at every tenure boundary, so that the set of tenants is
  constant in each. Per pseudo-sample, with tenant shares `s_i` (a NaN share is an equal
  split, `1/n` of the n tenants present), scaled by `1/Σs` where they add up to more than 1
  (an *oversubscribed* stretch, reported as a finding), free share `f = 1 − Σs`, card
  activity `U` and tenant activity `u_i`:
  - `u_i` is the tenant's measured utilisation of the card (per-process utilisation summed
    per pod, `activity`) where a sample of it lies within half a period of the card's
    sample; tenants without one share what the measured ones leave, `max(0, U − Σmeasured)`,
    in proportion to their shares (*estimated attribution* where two or more tenants are
    present). Measured values are scaled to sum to `U` where no tenant is unmeasured (down
    where they exceed it, as SPEC §7 says, and up where they fall short: the card's busy
    time is the card's, whoever's process was sampled).
  - `busy_i = u_i`; the idle part `1 − U` is divided in proportion to unused capacity, the
    tenant's `max(0, s_i − u_i)` and the free share `f`; the free part is `unallocated`.
  - Each tenant becomes a *virtual card* (key `uuid + SEP + pod + SEP + start`) carrying its
    pseudo-samples, with its *share utilisation* `min(1, u_i / s_i)` as utilisation: the
    rules of SPEC §3 (idle runs, startup, teardown, checkpoint, straggler) run on it as on
    any card. The time the rules give is then rescaled: busy to `u_i`, the idle fractions
    to the tenant's idle part. Time of the tenant with unreadable utilisation or no sample
    is `unobserved`, its share's worth.
  - The physical card keeps its pseudo-samples and no tenure: the free part of each covered
    stretch (all of it where no tenant is present) is `unallocated`, the free share of an
    uncovered one `unobserved`.

A card whose tenures all have share 1 is not touched: the exclusive path is the same
computation as before, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify.arrays import BoolArr, FloatArr, IntArr, ObjArr
from auditor.classify.coverage import SampleTable
from auditor.classify.mig import Layout, layouts, state, weight_at
from auditor.classify.tenant_split import EPS, Tenant, split_card
from auditor.model import Window

SEP = "\x1f"
"""Separates a physical card's UUID from the tenant in a virtual card's key."""


@dataclass(frozen=True)
class Scale:
    """Per sample of the expanded table: how the classifier's time becomes card-seconds."""

    busy: FloatArr
    """Busy card-seconds per second of a readable sample (utilisation/100 when whole); of a
    physical card's own sample, the kernels that ran while no tenant held it."""
    idle: FloatArr
    """Factor on the idle fractions the rules give a held, readable sample."""
    covered: FloatArr
    """Weight of a stretch the sample covers that is unallocated or unobserved (of an
    unheld stretch, its busy part included)."""
    gap: FloatArr
    """Weight of the uncovered stretch after the sample."""
    estimated: BoolArr
    """Attribution estimated by share (two or more tenants, an active card, no measured
    activity)."""


@dataclass(frozen=True)
class Expanded:
    samples: SampleTable
    tenures: pd.DataFrame
    scale: Scale
    physical: dict[str, str]
    """Key of each virtual card → the UUID of its physical card."""
    oversubscribed: pd.DataFrame
    """gpu, start_ms, end_ms, seconds, detail of stretches whose shares were scaled."""


def is_shared(share: pd.Series) -> pd.Series:
    """Tenures that hold less than a whole card, or an unknown share of one."""
    values = pd.to_numeric(share, errors="coerce")
    return values.isna() | (values < 1.0 - EPS)


def _activity_by_tenant(
    activity: pd.DataFrame | None,
) -> dict[tuple[str, str], tuple[IntArr, FloatArr]]:
    if activity is None or len(activity) == 0:
        return {}
    frame = activity[activity["gpu"].notna() & activity["pod_uid"].notna()]
    frame = frame.sort_values(["gpu", "pod_uid", "ts_ms"], kind="stable")
    out: dict[tuple[str, str], tuple[IntArr, FloatArr]] = {}
    for (gpu, pod), part in frame.groupby(["gpu", "pod_uid"], sort=False):
        util = part["util"].to_numpy(dtype=np.float64, na_value=np.nan)
        out[(str(gpu), str(pod))] = (
            part["ts_ms"].to_numpy(dtype=np.int64),
            np.clip(util, 0.0, 100.0) / 100.0,
        )
    return out


@dataclass
class _Blocks:
    """Per-card blocks of the expanded sample table, in card order."""

    gpu: list[IntArr]
    ts: list[IntArr]
    util: list[FloatArr]
    cov_end: list[IntArr]
    span_end: list[IntArr]
    throttle: list[IntArr]
    busy: list[FloatArr]
    idle: list[FloatArr]
    covered: list[FloatArr]
    gap: list[FloatArr]
    estimated: list[BoolArr]
    origin: list[IntArr]

    def add(
        self,
        gpu: int,
        *,
        ts: IntArr,
        util: FloatArr,
        cov_end: IntArr,
        span_end: IntArr,
        throttle: IntArr,
        busy: FloatArr,
        idle: FloatArr,
        covered: FloatArr,
        gap: FloatArr,
        estimated: BoolArr,
        origin: IntArr,
    ) -> None:
        self.gpu.append(np.full(ts.size, gpu, dtype=np.int64))
        self.ts.append(ts)
        self.util.append(util)
        self.cov_end.append(cov_end)
        self.span_end.append(span_end)
        self.throttle.append(throttle)
        self.busy.append(busy)
        self.idle.append(idle)
        self.covered.append(covered)
        self.gap.append(gap)
        self.estimated.append(estimated)
        self.origin.append(origin)


def expand(
    st: SampleTable,
    tenures: pd.DataFrame,
    *,
    cards: pd.DataFrame | None,
    activity: pd.DataFrame | None,
    window: Window,
    force: Iterable[str] = (),
) -> Expanded | None:
    """The sample table and tenures with shared cards expanded (module docstring), or None
    where no card is shared or partitioned. `force` names cards to expand although every
    tenure on them holds the whole card (tests compare that with the exclusive path)."""
    index = {str(u): i for i, u in enumerate(st.uuids.tolist())}
    lays = layouts(st, cards)
    kid_of = {k: (lay, i) for lay in lays.values() for i, k in enumerate(lay.kids)}
    forced = set(force)
    shared_rows: dict[int, list[int]] = {}
    if len(tenures) and "share" in tenures.columns:
        mask = is_shared(tenures["share"]).to_numpy() | tenures["gpu"].isin(forced).to_numpy()
        sharing_cards = set(tenures.loc[mask, "gpu"].astype(str))
        gpu_col = tenures["gpu"].astype(str).tolist()
        for t_row, uuid in enumerate(gpu_col):
            if uuid in sharing_cards and uuid in index:
                shared_rows.setdefault(index[uuid], []).append(t_row)
    if not shared_rows and not lays:
        return None

    starts: IntArr = (
        np.flatnonzero(np.r_[True, st.gpu[1:] != st.gpu[:-1]]).astype(np.int64)
        if st.ts.size
        else np.zeros(0, dtype=np.int64)
    )
    bounds = np.append(starts, st.ts.size)
    throttle = st.throttle if st.throttle is not None else np.full(st.ts.size, -1, np.int64)
    blocks = _Blocks([], [], [], [], [], [], [], [], [], [], [], [])
    by_tenant = _activity_by_tenant(activity)
    extra_keys: list[str] = []
    extra_period: list[int] = []
    physical: dict[str, str] = {}
    replaced: dict[int, str] = {}
    moved_rows: list[int] = []
    dropped_rows: list[int] = []
    virtual_blocks: list[tuple[str, dict[str, np.ndarray]]] = []
    over_rows: list[tuple[str, int, int, float, str]] = []
    for g in range(st.n_gpus):
        a, b = int(bounds[g]), int(bounds[g + 1])
        uuid = str(st.uuids[g])
        sl = slice(a, b)
        # the share of its physical card this card holds over time (SPEC §7, MIG)
        lay: Layout | None = lays.get(uuid)
        row: int | None = None
        if lay is None and uuid in kid_of:
            lay, row = kid_of[uuid]
        cuts = np.zeros(0, dtype=np.int64)
        if lay is not None:
            cuts = _weight_changes(lay, row, lo=int(st.first[g]), hi=int(st.last_end[g]))
        if g not in shared_rows:
            if lay is not None and row is None:
                blocks.add(g, **_card_block(lay, st, g, bounds, throttle))
                continue
            own: dict[str, np.ndarray] = {
                "ts": st.ts[sl],
                "util": st.util[sl],
                "cov_end": st.cov_end[sl],
                "span_end": st.span_end[sl],
                "throttle": throttle[sl],
                "origin": np.arange(a, b, dtype=np.int64),
            }
            if cuts.size:
                own = _cut(own, cuts, last_end=int(st.last_end[g]))
            w = 1.0 if lay is None else weight_at(lay, row, own["ts"])
            blocks.add(
                g,
                ts=own["ts"],
                util=own["util"],
                cov_end=own["cov_end"],
                span_end=own["span_end"],
                throttle=own["throttle"],
                busy=own["util"] / 100.0 * w,
                idle=np.full(own["ts"].size, 1.0) * w,
                covered=np.full(own["ts"].size, 1.0) * w,
                gap=np.full(own["ts"].size, 1.0) * w,
                estimated=np.zeros(own["ts"].size, dtype=np.bool_),
                origin=own["origin"],
            )
            continue
        tenants = []
        for t_row in shared_rows[g]:
            rec = tenures.iloc[t_row]
            start = max(int(rec["start_ms"]), int(st.first[g]))
            end = min(int(rec["end_ms"]), int(st.last_end[g]))
            if end <= start:
                dropped_rows.append(t_row)
                continue
            share = float(rec["share"]) if pd.notna(rec["share"]) else math.nan
            tenants.append(Tenant(t_row, str(rec["pod_uid"]), start, end, share))
            moved_rows.append(t_row)
        free, virtual, over = split_card(
            uuid=uuid,
            ts=st.ts[sl],
            util=st.util[sl],
            cov_end=st.cov_end[sl],
            last_end=int(st.last_end[g]),
            throttle=throttle[sl],
            period=int(st.period[g]),
            tenants=tenants,
            by_tenant=by_tenant,
            window=window,
            more_cuts=cuts,
            origin=np.arange(a, b, dtype=np.int64),
        )
        over_rows += over
        w_free = 1.0 if lay is None else weight_at(lay, row, free["ts"])
        blocks.add(
            g,
            ts=free["ts"],
            util=free["util"],
            cov_end=free["cov_end"],
            span_end=free["span_end"],
            throttle=free["throttle"],
            busy=free["busy"] * w_free,
            idle=np.zeros(free["ts"].size),
            covered=free["covered"] * w_free,
            gap=free["gap"] * w_free,
            estimated=np.zeros(free["ts"].size, dtype=np.bool_),
            origin=free["origin"],
        )
        for tenant, arrays in virtual:
            key = f"{uuid}{SEP}{tenant.pod}{SEP}{tenant.start}"
            physical[key] = uuid
            replaced[tenant.row] = key
            w_t = 1.0 if lay is None else weight_at(lay, row, arrays["ts"])
            for name in ("busy", "idle", "covered", "gap"):
                arrays[name] = arrays[name] * w_t
            virtual_blocks.append((key, arrays))
            extra_keys.append(key)
            extra_period.append(int(st.period[g]))

    for card, lay in lays.items():  # a card that reports nothing of its own (MIG on)
        if card in index:
            continue
        virtual_blocks.append((card, _card_block(lay, st, None, bounds, throttle)))
        extra_keys.append(card)
        extra_period.append(int(min(st.period[index[k]] for k in lay.kids)))

    n0 = st.n_gpus
    for i, (_key, arrays) in enumerate(virtual_blocks):
        blocks.add(
            n0 + i,
            ts=arrays["ts"],
            util=arrays["util"],
            cov_end=arrays["cov_end"],
            span_end=arrays["span_end"],
            throttle=arrays["throttle"],
            busy=arrays["busy"],
            idle=arrays["idle"],
            covered=arrays["covered"],
            gap=arrays["gap"],
            estimated=arrays["estimated"],
            origin=arrays["origin"],
        )
    samples = _table(st, blocks, extra_keys=extra_keys, extra_period=extra_period)
    new_tenures = tenures.copy()
    if moved_rows:
        gpu_values = new_tenures["gpu"].astype(object).to_numpy().copy()
        for row, key in replaced.items():
            gpu_values[row] = key
        new_tenures["gpu"] = gpu_values
    if dropped_rows:
        new_tenures = new_tenures.drop(new_tenures.index[dropped_rows])
    scale = Scale(
        busy=np.concatenate(blocks.busy),
        idle=np.concatenate(blocks.idle),
        covered=np.concatenate(blocks.covered),
        gap=np.concatenate(blocks.gap),
        estimated=np.concatenate(blocks.estimated),
    )
    over_frame = pd.DataFrame(over_rows, columns=["gpu", "start_ms", "end_ms", "seconds", "detail"])
    return Expanded(samples, new_tenures, scale, physical, over_frame)


def _weight_changes(lay: Layout, row: int | None, *, lo: int, hi: int) -> IntArr:
    """The instants in (lo, hi) where the share a card of `lay` holds changes: where its
    samples must be cut so that each piece has one share. None where it never changes."""
    inside = lay.points[(lay.points > lo) & (lay.points < hi)]
    if inside.size == 0:
        return inside
    before = weight_at(lay, row, inside - 1)
    after = weight_at(lay, row, inside)
    out: IntArr = inside[before != after]
    return out


def _cut(arrays: dict[str, np.ndarray], cuts: IntArr, *, last_end: int) -> dict[str, np.ndarray]:
    """A card's samples as pseudo-samples cut at `cuts` (each piece as its sample says)."""
    ts = arrays["ts"]
    points = np.union1d(ts, cuts[(cuts > ts[0]) & (cuts < last_end)]).astype(np.int64)
    parent = np.searchsorted(ts, points, side="right") - 1
    ends = np.append(points[1:], last_end).astype(np.int64)
    cov_end = np.minimum(np.maximum(arrays["cov_end"][parent], points), ends)
    return {
        "ts": points,
        "util": arrays["util"][parent],
        "cov_end": cov_end,
        "span_end": ends,
        "throttle": arrays["throttle"][parent],
        "origin": arrays["origin"][parent],
    }


def _card_block(
    lay: Layout, st: SampleTable, g: int | None, bounds: IntArr, throttle: IntArr
) -> dict[str, np.ndarray]:
    """A MIG card's own pseudo-samples over its whole observed span: one per stretch of its
    layout, weighed by its own share then (the uncarved slices; all of it where no instance
    is present), with its own utilisation where its own sample covers the stretch."""
    points = lay.points
    ends = np.append(points[1:], lay.end).astype(np.int64)
    util = np.full(points.size, np.nan)
    code = np.full(points.size, -1, dtype=np.int64)
    origin = np.full(points.size, -1, dtype=np.int64)
    if g is not None:
        sample, _, own = state(st, g, bounds, points)
        util = np.where(own, st.util[np.maximum(sample, 0)], np.nan)
        code = np.where(own, throttle[np.maximum(sample, 0)], -1)
        origin = np.where(own, sample, -1)
    w = lay.rest
    return {
        "ts": points,
        "util": util,
        "cov_end": np.where(lay.covered, ends, points),
        "span_end": ends,
        "throttle": code,
        "busy": np.nan_to_num(util) / 100.0 * w,
        "idle": w.copy(),
        "covered": w.copy(),
        "gap": w.copy(),
        "estimated": np.zeros(points.size, dtype=np.bool_),
        "origin": origin,
    }


def _table(
    st: SampleTable, blocks: _Blocks, *, extra_keys: list[str], extra_period: list[int]
) -> SampleTable:
    gpu = np.concatenate(blocks.gpu)
    ts = np.concatenate(blocks.ts)
    span_end = np.concatenate(blocks.span_end)
    # what each pseudo-sample carries of the sample it came from (-1: none): the instant its
    # reading was taken, and whether it is a rolled-up minute (a mean, not a point reading)
    origin = np.concatenate(blocks.origin)
    at_origin = np.maximum(origin, 0)
    uuids: ObjArr = np.concatenate([st.uuids, np.array(extra_keys, dtype=object)])
    n = uuids.size
    first = np.zeros(n, dtype=np.int64)
    last_end = np.zeros(n, dtype=np.int64)
    at = np.flatnonzero(np.r_[True, gpu[1:] != gpu[:-1]]) if gpu.size else np.zeros(0, np.int64)
    ends = np.append(at[1:], gpu.size) - 1
    first[gpu[at]] = ts[at]
    last_end[gpu[ends]] = span_end[ends]
    return SampleTable(
        uuids=uuids,
        gpu=gpu,
        ts=ts,
        util=np.concatenate(blocks.util),
        cov_end=np.concatenate(blocks.cov_end),
        span_end=span_end,
        throttle=None if st.throttle is None else np.concatenate(blocks.throttle),
        throttle_names=st.throttle_names,
        period=np.concatenate([st.period, np.array(extra_period, dtype=np.int64)]),
        first=first,
        last_end=last_end,
        rolled=None if st.rolled is None else (origin >= 0) & st.rolled[at_origin],
        read=np.where(origin >= 0, st.reading_ms[at_origin], ts),
    )


def on_physical_cards(
    results: pd.DataFrame, findings: pd.DataFrame, shared: Expanded
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Results and findings of virtual cards put back on their physical cards; the
    oversubscribed stretches added as findings."""
    from auditor.classify.findings import KIND_ORDER
    from auditor.model import CATEGORIES

    if shared.physical:
        results = results.assign(gpu=results["gpu"].map(lambda g: shared.physical.get(g, g)))
        findings = findings.assign(
            gpu=findings["gpu"].map(lambda g: g if g is None else shared.physical.get(g, g))
        )
    results = (
        results.assign(_pod=results["pod_uid"].fillna(""))
        .groupby(["gpu", "_pod", "category", "estimated"], sort=False, dropna=False)
        .agg(pod_uid=("pod_uid", "first"), seconds=("seconds", "sum"))
        .reset_index()
    )
    order = {str(c): i for i, c in enumerate(CATEGORIES)}
    results["_cat"] = results["category"].map(order)
    results = (
        results.sort_values(["gpu", "_pod", "_cat", "estimated"], kind="stable")
        .loc[:, ["gpu", "pod_uid", "category", "seconds", "estimated"]]
        .reset_index(drop=True)
    )
    results["pod_uid"] = results["pod_uid"].astype(object).where(results["pod_uid"].notna(), None)
    over = shared.oversubscribed
    if len(over):
        extra = pd.DataFrame(
            {
                "kind": "oversubscribed",
                "gang": pd.Series([None] * len(over), dtype=object),
                "gpu": over["gpu"].astype(object),
                "pod_uid": pd.Series([None] * len(over), dtype=object),
                "start_ms": over["start_ms"].astype(np.int64),
                "end_ms": over["end_ms"].astype(np.int64),
                "seconds": over["seconds"].astype(np.float64),
                "detail": over["detail"].astype(object),
            }
        )
        findings = pd.concat([findings, extra], ignore_index=True) if len(findings) else extra
    if len(findings):
        rank = {k: i for i, k in enumerate(KIND_ORDER)}
        findings = (
            findings.assign(
                _k=findings["kind"].map(rank),
                _g=findings["gang"].fillna(""),
                _u=findings["gpu"].fillna(""),
                _p=findings["pod_uid"].fillna(""),
            )
            .sort_values(["_k", "_g", "_u", "_p", "start_ms"], kind="stable")
            .drop(columns=["_k", "_g", "_u", "_p"])
            .reset_index(drop=True)
        )
    return results, findings
