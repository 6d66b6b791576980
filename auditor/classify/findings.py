"""Findings: the episodes behind the numbers, clipped to the audit window like the results.

Kinds (one row each):
- `startup` / `teardown`: per tenure card, the first and last instant of that category inside
  the window and its seconds.
- `reserved_idle`: per idle run (episode) of a tenure card; `detail` says why it counted.
- `checkpoint`: per gang; `detail` describes each series ("n gaps, period ~X s, median length
  Y s", n counting the gaps with checkpoint time inside the window) and the gaps that count
  because of a checkpoint marker.
- `straggler`: per multi-card gang, the card the others waited on most inside the window
  (the sum of `straggler_wait` it was the busiest card for): its GPU and pod, the first and
  last wait it caused, the seconds, and as `detail` the most common non-empty throttle reason
  recorded on its samples at those instants (ties: the alphabetically first), if any.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify import codes, runs
from auditor.classify.arrays import BoolArr, FloatArr, IntArr, ObjArr, reduce_groups, starts_of
from auditor.classify.gangs import GangView
from auditor.classify.pieces import Pieces
from auditor.classify.runs import RunDecision
from auditor.classify.timeline import TenureTable
from auditor.settings import Thresholds

FINDING_COLUMNS = ["kind", "gang", "gpu", "pod_uid", "start_ms", "end_ms", "seconds", "detail"]

KIND_ORDER = ("checkpoint", "oversubscribed", "reserved_idle", "startup", "straggler", "teardown")


@dataclass(frozen=True)
class FindingInputs:
    """Everything the findings are read from; `lo`/`hi`/`seconds` are the window-clipped
    pieces, `row_*` describe the observed rows that `Pieces.blame` points at."""

    pieces: Pieces
    lo: IntArr
    hi: IntArr
    seconds: FloatArr
    tenures: TenureTable
    uuids: ObjArr
    row_gpu: IntArr
    row_tenure: IntArr
    row_sample: IntArr
    throttle: IntArr | None
    """Per sample: code of its throttle reasons in `throttle_names`, -1 where none."""
    throttle_names: ObjArr
    runs: RunDecision
    gangs: GangView
    thresholds: Thresholds


@dataclass(frozen=True)
class Rows:
    """Findings of one kind as parallel arrays; gpu/pod are -1 where not applicable."""

    kind: str
    gang: IntArr
    gpu: IntArr
    pod: IntArr
    start: IntArr
    end: IntArr
    seconds: FloatArr
    detail: list[str | None]


def empty_findings() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "kind": pd.Series([], dtype=object),
            "gang": pd.Series([], dtype=object),
            "gpu": pd.Series([], dtype=object),
            "pod_uid": pd.Series([], dtype=object),
            "start_ms": pd.Series([], dtype=np.int64),
            "end_ms": pd.Series([], dtype=np.int64),
            "seconds": pd.Series([], dtype=np.float64),
            "detail": pd.Series([], dtype=object),
        }
    )


def _selected(src: FindingInputs, category: int) -> tuple[BoolArr, FloatArr]:
    p = src.pieces
    mask = (p.cat_a == category) & (src.seconds > 0)
    return mask, p.frac_a[mask] * src.seconds[mask]


def _tenure_rows(
    kind: str, *, src: FindingInputs, ten: IntArr, groups: tuple[IntArr, IntArr, FloatArr]
) -> Rows:
    t = src.tenures
    start, end, seconds = groups
    return Rows(kind, t.gang[ten], t.gpu[ten], t.pod[ten], start, end, seconds, [None] * ten.size)


def _per_tenure(src: FindingInputs, *, category: int, kind: str) -> Rows | None:
    mask, seconds = _selected(src, category)
    if not mask.any():
        return None
    (ten,), lo, hi, total, _ = reduce_groups(
        (src.pieces.tenure[mask],), lo=src.lo[mask], hi=src.hi[mask], seconds=seconds
    )
    return _tenure_rows(kind, src=src, ten=ten, groups=(lo, hi, total))


def _reserved(src: FindingInputs) -> Rows | None:
    mask, seconds = _selected(src, codes.RESERVED_IDLE)
    if not mask.any():
        return None
    (run,), lo, hi, total, first = reduce_groups(
        (src.pieces.run[mask],), lo=src.lo[mask], hi=src.hi[mask], seconds=seconds
    )
    th = src.thresholds
    detail: list[str | None] = []
    for r in run.tolist():
        kind = int(src.runs.run_kind[r])
        if kind == runs.WHOLE:
            detail.append("idle for its whole tenure")
        elif kind == runs.LEADING:
            detail.append(f"no activity within {th.startup_cap_s / 60:g} min of binding")
        elif kind == runs.TRAILING:
            detail.append(f"held {th.teardown_cap_s / 60:g} min or more after its last activity")
        else:
            detail.append(f"idle for {src.runs.run_length[r] / 60000:.0f} min mid-run")
    out = _tenure_rows(
        "reserved_idle", src=src, ten=src.pieces.tenure[mask][first], groups=(lo, hi, total)
    )
    return Rows(out.kind, out.gang, out.gpu, out.pod, out.start, out.end, out.seconds, detail)


def _checkpoint(src: FindingInputs) -> Rows | None:
    mask, seconds = _selected(src, codes.CHECKPOINT)
    if not mask.any():
        return None
    lo, hi = src.lo[mask], src.hi[mask]
    gang = src.tenures.gang[src.pieces.tenure[mask]]
    (gangs,), start, end, total, _ = reduce_groups((gang,), lo=lo, hi=hi, seconds=seconds)
    (g_gang, g_gap), *_ = reduce_groups((gang, src.pieces.gap[mask]), lo=lo, hi=hi, seconds=seconds)
    g_series = src.gangs.gap_series[g_gap] + 1
    (c_gang, c_series), _, _, count, _ = reduce_groups(
        (g_gang, g_series), lo=g_gap, hi=g_gap, seconds=np.ones(g_gap.size)
    )
    detail: list[str | None] = []
    for g in gangs.tolist():
        parts: list[str] = []
        for series, n in zip(
            c_series[c_gang == g].tolist(), count[c_gang == g].tolist(), strict=True
        ):
            if series > 0:
                s = src.gangs.series[series - 1]
                parts.append(
                    f"{n:.0f} gaps, period ~{s.period_s:.0f} s,"
                    f" median length {s.median_length_s:.0f} s"
                )
            else:
                parts.append(f"{n:.0f} gaps at checkpoint markers")
        detail.append("; ".join(parts))
    none = np.full(gangs.size, -1, dtype=np.int64)
    return Rows("checkpoint", gangs, none, none, start, end, total, detail)


def _best(group: IntArr, *, item: IntArr, seconds: FloatArr) -> BoolArr:
    """Per group, the item with the most seconds (ties: the lowest item)."""
    order = np.lexsort((item, -seconds, group))
    best = np.zeros(group.size, dtype=np.bool_)
    best[order[starts_of(group[order])]] = True
    return best


def _straggler(src: FindingInputs) -> Rows | None:
    p = src.pieces
    share = np.where(p.cat_a == codes.STRAGGLER_WAIT, p.frac_a, 0.0)
    share = share + np.where(p.cat_b == codes.STRAGGLER_WAIT, p.frac_b, 0.0)
    waited = share * src.seconds
    mask = (waited > 0) & (p.blame >= 0)
    if not mask.any():
        return None
    blame = p.blame[mask]
    gang = src.tenures.gang[p.tenure[mask]]
    gpu = src.row_gpu[blame]
    lo, hi, sec = src.lo[mask], src.hi[mask], waited[mask]
    (c_gang, c_gpu), start, end, total, _ = reduce_groups((gang, gpu), lo=lo, hi=hi, seconds=sec)
    chosen = _best(c_gang, item=c_gpu, seconds=total)
    c_gang, c_gpu = c_gang[chosen], c_gpu[chosen]
    start, end, total = start[chosen], end[chosen], total[chosen]

    (t_gang, t_gpu, t_ten), _, _, t_total, _ = reduce_groups(
        (gang, gpu, src.row_tenure[blame]), lo=lo, hi=hi, seconds=sec
    )
    pick = _best(t_gang * np.int64(src.uuids.size) + t_gpu, item=t_ten, seconds=t_total)
    is_chosen = np.isin(t_gang * np.int64(src.uuids.size) + t_gpu, c_gang * src.uuids.size + c_gpu)
    ten = t_ten[pick & is_chosen]  # one per chosen card, in (gang, gpu) order like c_gang

    detail: list[str | None] = [None] * c_gang.size
    if src.throttle is not None:
        key = gang * np.int64(src.uuids.size) + gpu
        mine = np.isin(key, c_gang * np.int64(src.uuids.size) + c_gpu)
        sample = src.row_sample[blame[mine]]
        (s_gang, s_sample), *_ = reduce_groups(
            (gang[mine], sample), lo=lo[mine], hi=hi[mine], seconds=sec[mine]
        )
        reason = src.throttle[s_sample]
        known = reason >= 0
        if known.any():
            (r_gang, r_reason), _, _, n, _ = reduce_groups(
                (s_gang[known], reason[known]),
                lo=reason[known],
                hi=reason[known],
                seconds=np.ones(known.sum()),
            )
            top = _best(r_gang, item=r_reason, seconds=n)
            names = dict(zip(r_gang[top].tolist(), r_reason[top].tolist(), strict=True))
            detail = [
                None if g not in names else str(src.throttle_names[names[g]])
                for g in c_gang.tolist()
            ]
    return Rows("straggler", c_gang, c_gpu, src.tenures.pod[ten], start, end, total, detail)


def build_findings(src: FindingInputs) -> pd.DataFrame:
    """All findings inside the window, sorted by kind, gang, GPU, pod and start."""
    parts = [
        _checkpoint(src),
        _reserved(src),
        _per_tenure(src, category=codes.STARTUP, kind="startup"),
        _straggler(src),
        _per_tenure(src, category=codes.TEARDOWN, kind="teardown"),
    ]
    found = [r for r in parts if r is not None and r.gang.size]
    if not found:
        return empty_findings()
    kind = np.concatenate([np.full(r.gang.size, KIND_ORDER.index(r.kind)) for r in found])
    gang = np.concatenate([r.gang for r in found])
    gpu = np.concatenate([r.gpu for r in found])
    pod = np.concatenate([r.pod for r in found])
    start = np.concatenate([r.start for r in found])
    order = np.lexsort((start, pod, gpu, gang, kind))
    t = src.tenures

    def names(codes_: IntArr, table: ObjArr) -> pd.Series:
        out = np.full(codes_.size, None, dtype=object)
        known = codes_ >= 0
        out[known] = table[codes_[known]]
        return pd.Series(out[order], dtype=object)

    return pd.DataFrame(
        {
            "kind": pd.Series(np.array(KIND_ORDER, dtype=object)[kind[order]], dtype=object),
            "gang": names(gang, t.gangs),
            "gpu": names(gpu, src.uuids),
            "pod_uid": names(pod, t.pods),
            "start_ms": start[order].astype(np.int64),
            "end_ms": np.concatenate([r.end for r in found])[order].astype(np.int64),
            "seconds": np.concatenate([r.seconds for r in found])[order].astype(np.float64),
            "detail": pd.Series(
                np.array([d for r in found for d in r.detail], dtype=object)[order], dtype=object
            ),
        }
    )
