"""The classifier (SPEC §3): every capacity second of every GPU to one category and holder.

Pipeline, each step a vectorised pass over flat arrays (loops only per GPU, gang or series):

1. `coverage.load_samples`: sort, merge duplicate timestamps, period, coverage.
2. `timeline.normalise_tenures` and `timeline.cut_segments`: disjoint tenures; each GPU's
   observed span cut at samples, coverage gaps, tenure boundaries and startup caps.
3. Unheld segments: covered → `unallocated`, less the kernel time a readable sample
   shows (`busy` of no pod: kernels ran on a card that no known pod held), uncovered →
   `unobserved`.
   Held segments that are uncovered or whose utilisation is unreadable → `unobserved` of
   the pod. The rest are *observed rows*: `u/100` of their time is `busy`.
4. `runs.classify_runs`: idle runs per tenure card (whole / leading / trailing / long mid).
5. `gangs.compare_with_gang`: each row against its gang at the same instant; gang-wide gaps and
   their regular series.
6. Per row, what is left: an idle row while another card of the gang is active →
   `straggler_wait`; an idle row in a checkpoint gap → `checkpoint`; other idle →
   `compute_idle`. An active row whose gang's busiest other card is more than
   `straggler_tolerance_pct` busier → `(u_max − u)/100` of it `straggler_wait`,
   `(100 − u_max)/100` `compute_idle`; other active rows → `(100 − u)/100` `compute_idle`.
7. Tenures on cards that no sample names are `unobserved` of their pods
   (`unsampled.unsampled_results`): the pod held a card nobody measured.
8. Everything is classified over the whole input, then clipped to the window
   (`pieces.Pieces.window_ms`) and summed; findings come from the same clipped pieces.
   On request (`keep_pieces`) the clipped pieces themselves come back too, one row per
   piece and category (`pieces.piece_frame`): what `auditor explain` draws over time.

Shared and partitioned cards (SPEC §7) enter between steps 1 and 2: `shares.expand` turns
each tenant of a shared card into a virtual card and weighs MIG instances; the pieces'
fractions are then scaled to card-seconds (`shares.Scale`) and put back on the physical
cards at the end. Without shared cards none of this runs.

Names: `st` is the sample table, `ten` the tenure table, `seg` the segments; `r_…` arrays
have one entry per *observed row* (a held, covered, readable segment: the rows the rules
judge); `rest` holds the segments that are wholly one category (unallocated, unobserved).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd

from auditor.classify import codes
from auditor.classify.arrays import INT_MIN, BoolArr, FloatArr, IntArr, empty_int
from auditor.classify.coverage import load_samples
from auditor.classify.findings import FindingInputs, build_findings, empty_findings
from auditor.classify.gangs import GangView, compare_with_gang
from auditor.classify.hours import empty_hourly, hour_buckets, sum_results_by_hour
from auditor.classify.pieces import (
    Pieces,
    Plain,
    empty_piece_frame,
    piece_frame,
    sum_results,
)
from auditor.classify.runs import RunDecision, classify_runs
from auditor.classify.shares import Scale, expand, on_physical_cards
from auditor.classify.timeline import Segments, TenureTable, cut_segments, normalise_tenures
from auditor.classify.unsampled import unsampled_pieces, unsampled_results
from auditor.model import WasteCategory, Window
from auditor.settings import Thresholds

T = TypeVar("T", bound=np.generic)


@dataclass(frozen=True)
class Classification:
    """What `classify` returns.

    `results`: columns gpu, pod_uid (None where nobody held the card), category (a
    `WasteCategory` value), seconds; one row per (gpu, pod_uid, category) with seconds > 0
    inside the window, sorted by gpu, pod_uid (None first) and category (in the order of
    `WasteCategory`).
    `findings`: columns kind, gang, gpu, pod_uid, start_ms, end_ms, seconds, detail (see
    `auditor.classify.findings`).
    `pieces`: None unless asked for (`classify(..., keep_pieces=True)`); then the classified
    pieces over time, columns gpu, pod_uid, start_ms, end_ms, category, seconds, clipped to
    the window: summed per (gpu, pod_uid, category) they are `results`
    (`auditor.classify.pieces.piece_frame`).
    """

    results: pd.DataFrame
    findings: pd.DataFrame
    pieces: pd.DataFrame | None = None
    hourly: pd.DataFrame | None = None
    """None unless asked for (`classify(..., hour_ms=...)`); then `results` per bucket of
    the window (`auditor.classify.hours`), with `hour_ms`, the bucket's start: summed over
    the buckets they are `results`."""


def _marker_codes(markers: pd.DataFrame | None, tenures: TenureTable) -> tuple[IntArr, ...]:
    if markers is None or len(markers) == 0 or tenures.size == 0:
        return empty_int(), empty_int(), empty_int()
    frame = markers[markers["gang"].notna() & markers["start_ms"].notna()]
    gang = pd.Index(tenures.gangs).get_indexer(pd.Index(frame["gang"].astype(object).map(str)))
    start = frame["start_ms"].to_numpy(dtype=np.float64)
    end = frame["end_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
    end = np.where(np.isnan(end), start, end)
    keep = gang >= 0
    return (
        gang[keep].astype(np.int64),
        start[keep].astype(np.int64),
        end[keep].astype(np.int64),
    )


def _per_sample_rules(
    *, util: FloatArr, idle: BoolArr, decided: RunDecision, view: GangView, thresholds: Thresholds
) -> tuple[IntArr, FloatArr, IntArr, FloatArr, IntArr]:
    """Categories of observed rows the run rules left pending (module docstring, step 6).

    Returns cat_a, frac_a, cat_b, frac_b and blame, as `Pieces` holds them.
    """
    n = util.size
    cat_a = decided.category.copy()
    frac_a = (100.0 - util) / 100.0
    cat_b = np.full(n, codes.NO_CATEGORY, dtype=np.int64)
    frac_b = np.zeros(n)
    blame = np.full(n, -1, dtype=np.int64)
    pending = cat_a == codes.PENDING
    wait = pending & idle & view.others_active
    gap_checkpoint = np.zeros(n, dtype=np.bool_)
    in_gap = view.gap >= 0
    gap_checkpoint[in_gap] = view.gap_checkpoint[view.gap[in_gap]]
    checkpoint = pending & idle & ~wait & view.gang_idle & gap_checkpoint
    cat_a[wait] = codes.STRAGGLER_WAIT
    blame[wait] = view.blame[wait]
    cat_a[checkpoint] = codes.CHECKPOINT
    cat_a[pending & ~wait & ~checkpoint] = codes.COMPUTE_IDLE
    behind = pending & ~idle & (view.other_max - util > thresholds.straggler_tolerance_pct)
    frac_a[behind] = (100.0 - view.other_max[behind]) / 100.0
    cat_b[behind] = codes.STRAGGLER_WAIT
    frac_b[behind] = (view.other_max[behind] - util[behind]) / 100.0
    blame[behind] = view.blame[behind]
    return cat_a, frac_a, cat_b, frac_b, blame


def _split_teardown(pieces: Pieces, split_at: IntArr) -> Pieces:
    """Cut the rows in which a trailing run passes its teardown cap: `reserved_idle` after."""
    at = np.flatnonzero(split_at != INT_MIN)
    if at.size == 0:
        return pieces
    cut = split_at[at]
    end = pieces.end.copy()
    end[at] = cut

    def more(values: npt.NDArray[T]) -> npt.NDArray[T]:
        return np.concatenate([values, values[at]])

    return Pieces(
        gpu=more(pieces.gpu),
        tenure=more(pieces.tenure),
        start=np.concatenate([pieces.start, cut]),
        end=np.concatenate([end, pieces.end[at]]),
        busy=more(pieces.busy),
        cat_a=np.concatenate([pieces.cat_a, np.full(at.size, codes.RESERVED_IDLE, dtype=np.int64)]),
        frac_a=more(pieces.frac_a),
        cat_b=more(pieces.cat_b),
        frac_b=more(pieces.frac_b),
        blame=more(pieces.blame),
        run=more(pieces.run),
        gap=more(pieces.gap),
        estimated=None if pieces.estimated is None else more(pieces.estimated),
    )


def _unheld_and_unobserved(
    seg: Segments, plain: IntArr, *, held: BoolArr, util: FloatArr, scale: Scale | None
) -> Plain:
    """The segments no rule judges: held ones uncovered or unreadable are `unobserved` of
    their pod; unheld covered ones `unallocated`, except the kernel time a readable sample
    shows, which is `busy` of no pod (step 3); unheld uncovered ones `unobserved`."""
    sample = seg.sample[plain]
    covered = seg.covered[plain]
    unheld = ~held[plain] & covered
    category = np.where(unheld, codes.UNALLOCATED, codes.UNOBSERVED).astype(np.int64)
    if scale is None:
        weight = np.ones(plain.size)
        busy = np.nan_to_num(util[plain]) / 100.0
    else:
        weight = np.where(covered, scale.covered[sample], scale.gap[sample])
        busy = scale.busy[sample]
    busy = np.where(unheld & ~np.isnan(util[plain]), np.minimum(busy, weight), 0.0)
    ran = np.flatnonzero(busy > 0)
    whole = scale is None and ran.size == 0
    return Plain(
        gpu=np.concatenate([seg.gpu[plain], seg.gpu[plain][ran]]),
        tenure=np.concatenate([seg.tenure[plain], seg.tenure[plain][ran]]),
        start=np.concatenate([seg.start[plain], seg.start[plain][ran]]),
        end=np.concatenate([seg.end[plain], seg.end[plain][ran]]),
        category=np.concatenate([category, np.full(ran.size, codes.BUSY, dtype=np.int64)]),
        weight=None if whole else np.concatenate([weight - busy, busy[ran]]),
    )


def present(gpu: pd.Series) -> set[str]:
    """The GPUs a column names. A categorical one (the store's reads) is read from its codes:
    turning millions of rows into strings to hash them took longer than classifying them."""
    if isinstance(gpu.dtype, pd.CategoricalDtype):
        used = np.unique(gpu.cat.codes.to_numpy())
        return {str(c) for c in gpu.cat.categories[used[used >= 0]]}
    return {str(g) for g in gpu.dropna().unique()}


def classify(
    samples: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    window: Window,
    thresholds: Thresholds,
    markers: pd.DataFrame | None = None,
    cards: pd.DataFrame | None = None,
    activity: pd.DataFrame | None = None,
    shared_cards: Collection[str] = (),
    keep_pieces: bool = False,
    piece_categories: Collection[str] | None = None,
    hour_ms: int | None = None,
) -> Classification:
    """Split every capacity second in `window` into categories (module docstring).

    `samples`: gpu, ts_ms, util (percent, NaN unreadable), optionally throttle_reasons; every
    stored sample of the GPUs concerned over the whole tenures that overlap the window.
    `tenures`: gpu, pod_uid, gang, start_ms, end_ms, optionally released (as
    `build_tenures` makes them; without `released` every tenure counts as ended).
    `markers`: gang, start_ms, end_ms of checkpoint markers (optional).
    Shared and partitioned cards (SPEC §7, `auditor.classify.shares`): `tenures` may carry a
    `share` column (share of the card per tenure; NaN: an equal split); `cards` (uuid,
    parent_uuid, mig_profile, model) weighs MIG instances; `activity` (gpu, pod_uid, ts_ms,
    util: a pod's utilisation of the whole card) is each tenant's measured activity.
    `shared_cards` go through the shared path even where every tenure holds them whole (a
    test hook: one tenant of share 1 must come out as the exclusive path does).
    `keep_pieces`: also return the classified pieces over time (`Classification.pieces`),
    of `piece_categories` only when given.
    `hour_ms`: also return the results per bucket of that length (`Classification.hourly`).
    """
    sampled = present(samples["gpu"])
    unsampled = unsampled_results(tenures, sampled=sampled, window=window, cards=cards)
    # the unsampled cards' pieces too, so that the pieces always sum to the results
    extra = (
        unsampled_pieces(tenures, sampled=sampled, window=window, cards=cards)
        if keep_pieces
        and (piece_categories is None or WasteCategory.UNOBSERVED.value in piece_categories)
        else None
    )
    st = load_samples(samples, thresholds=thresholds)
    if st.ts.size == 0:
        return Classification(
            results=unsampled,
            findings=empty_findings(),
            pieces=_with_pieces(empty_piece_frame(), extra) if keep_pieces else None,
            hourly=None
            if hour_ms is None
            else _unsampled_hourly(tenures, sampled, window, cards, hour_ms),
        )
    shared = expand(
        st,
        tenures,
        cards=cards,
        activity=activity,
        window=window,
        force=shared_cards,
    )
    scale: Scale | None = None
    if shared is not None:
        st, tenures, scale = shared.samples, shared.tenures, shared.scale
    ten = normalise_tenures(tenures, st)
    startup_cap = ten.bound + round(thresholds.startup_cap_s * 1000)
    seg = cut_segments(st, ten, extra_gpu=ten.gpu, extra_ms=startup_cap)

    held = seg.tenure >= 0
    seg_util = st.util[seg.sample]
    observed = held & seg.covered & ~np.isnan(seg_util)
    rows = np.flatnonzero(observed)
    plain = np.flatnonzero(~observed)
    rest = _unheld_and_unobserved(seg, plain, held=held, util=seg_util, scale=scale)
    r_ten, r_start, r_end = seg.tenure[rows], seg.start[rows], seg.end[rows]
    r_util, r_sample, r_gpu = seg_util[rows], seg.sample[rows], seg.gpu[rows]
    del seg, seg_util, held, observed, plain
    idle = r_util <= thresholds.idle_threshold_pct

    decided = classify_runs(
        tenure=r_ten,
        start=r_start,
        end=r_end,
        idle=idle,
        bound=ten.bound,
        released=ten.released,
        thresholds=thresholds,
    )
    gang_period = np.ones(ten.gangs.size, dtype=np.int64)
    np.maximum.at(gang_period, ten.gang, st.period[ten.gpu])
    m_gang, m_start, m_end = _marker_codes(markers, ten)
    view = compare_with_gang(
        gang=ten.gang[r_ten],
        gpu=r_gpu,
        ts=st.reading_ms[r_sample],  # a reading meets its gang when it was taken
        util=r_util,
        gang_period=gang_period,
        marker_gang=m_gang,
        marker_start=m_start,
        marker_end=m_end,
        thresholds=thresholds,
        averaged=None if st.rolled is None else st.rolled[r_sample],
    )
    cat_a, frac_a, cat_b, frac_b, blame = _per_sample_rules(
        util=r_util, idle=idle, decided=decided, view=view, thresholds=thresholds
    )
    busy = r_util / 100.0
    if scale is not None:  # shares of a card (SPEC §7): card-seconds, not the tenant's own
        busy = scale.busy[r_sample]
        frac_a = frac_a * scale.idle[r_sample]
        frac_b = frac_b * scale.idle[r_sample]
    pieces = _split_teardown(
        Pieces(
            gpu=r_gpu,
            tenure=r_ten,
            start=r_start,
            end=r_end,
            busy=busy,
            cat_a=cat_a,
            frac_a=frac_a,
            cat_b=cat_b,
            frac_b=frac_b,
            blame=blame,
            run=decided.run,
            gap=view.gap,
            estimated=None if scale is None else scale.estimated[r_sample],
        ),
        decided.split_at,
    )

    lo, hi, seconds = pieces.window_ms(window.start_ms, window.end_ms)
    results = sum_results(
        pieces,
        seconds=seconds,
        rest=rest,
        window=window,
        tenures=ten,
        uuids=st.uuids,
    )
    findings = build_findings(
        FindingInputs(
            pieces=pieces,
            lo=lo,
            hi=hi,
            seconds=seconds,
            tenures=ten,
            uuids=st.uuids,
            row_gpu=r_gpu,
            row_tenure=r_ten,
            row_sample=r_sample,
            throttle=st.throttle,
            throttle_names=st.throttle_names,
            runs=decided,
            gangs=view,
            thresholds=thresholds,
        )
    )
    hourly = None
    if hour_ms is not None:
        hourly = sum_results_by_hour(
            pieces, rest=rest, window=window, tenures=ten, uuids=st.uuids, bucket_ms=hour_ms
        )
    kept = None
    if keep_pieces:
        kept = piece_frame(
            pieces,
            lo=lo,
            hi=hi,
            seconds=seconds,
            rest=rest,
            window=window,
            tenures=ten,
            uuids=st.uuids,
            categories=piece_categories,
        )
    if shared is not None:
        results, findings = on_physical_cards(results, findings, shared)
        if kept is not None and shared.physical:
            kept = kept.assign(gpu=kept["gpu"].map(lambda g: shared.physical.get(g, g)))
        if hourly is not None:
            hourly = _hourly_on_physical(hourly, shared.physical)
    if hour_ms is not None and hourly is not None and not unsampled.empty:
        more = _unsampled_hourly(tenures, sampled, window, cards, hour_ms)
        hourly = pd.concat([hourly, more], ignore_index=True)
    if not unsampled.empty:
        results = pd.concat([results, unsampled], ignore_index=True).sort_values(
            ["gpu", "pod_uid"], na_position="first", kind="stable"
        )
        results = results.reset_index(drop=True)
    if kept is not None:
        kept = _with_pieces(kept, extra)
    return Classification(results=results, findings=findings, pieces=kept, hourly=hourly)


def _unsampled_hourly(
    tenures: pd.DataFrame,
    sampled: Collection[str],
    window: Window,
    cards: pd.DataFrame | None,
    bucket_ms: int,
) -> pd.DataFrame:
    """`unsampled_results` per bucket of the window, with `hour_ms`."""
    frames = [
        unsampled_results(tenures, sampled=sampled, window=b, cards=cards).assign(
            hour_ms=np.int64(b.start_ms)
        )
        for b in hour_buckets(window, bucket_ms)
    ]
    kept = [f for f in frames if len(f)]
    return pd.concat(kept, ignore_index=True) if kept else empty_hourly()


def _hourly_on_physical(hourly: pd.DataFrame, physical: dict[str, str]) -> pd.DataFrame:
    """Hourly results of virtual cards put back on their physical cards, summed."""
    if not physical:
        return hourly
    moved = hourly.assign(
        gpu=hourly["gpu"].map(lambda g: physical.get(g, g)), _pod=hourly["pod_uid"].fillna("")
    )
    out = (
        moved.groupby(["gpu", "_pod", "category", "estimated", "hour_ms"], sort=False)
        .agg(pod_uid=("pod_uid", "first"), seconds=("seconds", "sum"))
        .reset_index()
    )
    out["pod_uid"] = out["pod_uid"].astype(object).where(out["pod_uid"].notna(), None)
    return out[["gpu", "pod_uid", "category", "seconds", "estimated", "hour_ms"]]


def _with_pieces(kept: pd.DataFrame, extra: pd.DataFrame | None) -> pd.DataFrame:
    """`kept` and the pieces `extra` (in its column order), sorted as `piece_frame` sorts."""
    if extra is None or extra.empty:
        return kept
    both = pd.concat([kept, extra[list(kept.columns)]], ignore_index=True)
    both = both.sort_values(["gpu", "pod_uid", "start_ms"], na_position="first", kind="stable")
    return both.reset_index(drop=True)
