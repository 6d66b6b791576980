"""Each GPU's observed span cut into segments: one sample, one holder (or none), one state.

Tenures are first made consistent: per GPU, sorted by start, a tenure that overlaps the next
one is cut at the next one's start (the later start wins, as in `tenures.build_tenures`), and
empty ones are dropped. Tenure parts outside the GPU's observed span carry no capacity and
are dropped too. Then the span is cut at every sample time, every end of coverage before a
gap, every tenure boundary, and any extra points (the startup caps), so that every segment
lies inside one sample's stretch and inside at most one tenure. Tenure boundaries thereby
split a sample's interval in proportion to time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify.arrays import KEY_LIMIT, BoolArr, IntArr, ObjArr, empty_int, starts_of
from auditor.classify.coverage import SampleTable


@dataclass(frozen=True)
class TenureTable:
    """Consistent tenures, sorted by (GPU, start), clipped to each GPU's observed span."""

    gpu: IntArr
    start: IntArr
    """Clipped to the observed span."""
    end: IntArr
    bound: IntArr
    """The unclipped start: when the pod was bound (startup caps are measured from it)."""
    pod: IntArr
    gang: IntArr
    pods: ObjArr
    gangs: ObjArr
    released: BoolArr
    """False for a pod still holding its card where the data ends (no teardown yet)."""

    @property
    def size(self) -> int:
        return int(self.gpu.size)


@dataclass(frozen=True)
class Segments:
    """Disjoint pieces of time, sorted by (GPU, start); `tenure` is -1 where nobody held."""

    gpu: IntArr
    start: IntArr
    end: IntArr
    sample: IntArr
    covered: BoolArr
    tenure: IntArr


def _strings(values: pd.Series) -> ObjArr:
    return np.array([None if pd.isna(v) else str(v) for v in values.tolist()], dtype=object)


def _codes(values: ObjArr) -> tuple[IntArr, ObjArr]:
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def normalise_tenures(tenures: pd.DataFrame, samples: SampleTable) -> TenureTable:
    """Map tenures onto the sampled GPUs and make them disjoint per GPU.

    Rows without GPU, pod, start or end are ignored; a missing gang is the pod's own.
    """
    gpu_s = _strings(tenures["gpu"])
    pod_s = _strings(tenures["pod_uid"])
    gang_s = _strings(tenures["gang"]) if "gang" in tenures.columns else pod_s.copy()
    gang_s = np.where(pd.isna(gang_s), pod_s, gang_s)
    released_b = (
        tenures["released"].to_numpy(dtype=np.bool_, na_value=True)
        if "released" in tenures.columns
        else np.ones(len(tenures), dtype=np.bool_)
    )
    start_f = tenures["start_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
    end_f = tenures["end_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
    g = pd.Index(samples.uuids).get_indexer(pd.Index(gpu_s)).astype(np.int64)
    ok = (g >= 0) & ~pd.isna(pod_s) & ~np.isnan(start_f) & ~np.isnan(end_f)
    g, pod_s, gang_s, released = g[ok], pod_s[ok], gang_s[ok], released_b[ok]
    start = start_f[ok].astype(np.int64)
    end = end_f[ok].astype(np.int64)
    pod, pods = _codes(pod_s)
    gang, gangs = _codes(gang_s)

    order = np.lexsort((gang, pod, end, start, g))
    g, start, end, pod, gang = g[order], start[order], end[order], pod[order], gang[order]
    released = released[order]
    if g.size > 1:
        same = g[1:] == g[:-1]
        cut = same & (start[1:] < end[:-1])
        end[:-1] = np.where(cut, start[1:], end[:-1])
        released[:-1] |= cut
    lo = np.maximum(start, samples.first[g])
    hi = np.minimum(end, samples.last_end[g])
    keep = (end > start) & (hi > lo)
    return TenureTable(
        gpu=g[keep],
        start=lo[keep],
        end=hi[keep],
        bound=start[keep],
        pod=pod[keep],
        gang=gang[keep],
        pods=pods,
        gangs=gangs,
        released=released[keep],
    )


def cut_segments(
    samples: SampleTable, tenures: TenureTable, *, extra_gpu: IntArr, extra_ms: IntArr
) -> Segments:
    """Cut every GPU's observed span into segments (see the module docstring).

    `extra_gpu`/`extra_ms` are further cut points; those outside a span are ignored.
    """
    if samples.ts.size == 0:
        e = empty_int()
        return Segments(e, e, e, e, np.zeros(0, dtype=np.bool_), e)
    base = int(samples.first.min())
    stride = int(samples.last_end.max()) - base + 1
    if samples.n_gpus * stride >= KEY_LIMIT:
        raise ValueError("samples span too long a time for one classification; split the input")

    def key(gpu: IntArr, ms: IntArr) -> IntArr:
        return gpu * np.int64(stride) + (ms - base)

    sample_key = key(samples.gpu, samples.ts)
    gapped = samples.cov_end < samples.span_end
    inside = (extra_ms > samples.first[extra_gpu]) & (extra_ms < samples.last_end[extra_gpu])
    others = np.concatenate(
        [
            key(samples.gpu[gapped], samples.cov_end[gapped]),
            key(np.arange(samples.n_gpus, dtype=np.int64), samples.last_end),
            key(tenures.gpu, tenures.start),
            key(tenures.gpu, tenures.end),
            key(extra_gpu[inside], extra_ms[inside]),
        ]
    )
    others.sort()
    # Merge the few other cut points into the sorted sample times; each segment starting at
    # a point lies in the stretch [ts, next ts) of the last sample at or before it (`j`).
    # A point equal to a sample time comes after it and is dropped as a duplicate.
    at = np.searchsorted(sample_key, others, side="right")
    points = np.insert(sample_key, at, others)
    j = np.insert(np.arange(sample_key.size, dtype=np.int64), at, at - 1)
    distinct = starts_of(points)
    points, j = points[distinct], j[distinct]
    lo, hi, j = points[:-1], points[1:], j[:-1]
    # Segments between two GPUs' spans belong to none and go.
    valid = (j >= 0) & (lo < key(samples.gpu, samples.span_end)[np.maximum(j, 0)])
    lo, hi, j = lo[valid], hi[valid], j[valid]
    gpu = samples.gpu[j]
    covered = lo < key(gpu, samples.cov_end[j])

    tenure = np.full(lo.size, -1, dtype=np.int64)
    if tenures.size:
        t_start = key(tenures.gpu, tenures.start)
        k = np.searchsorted(t_start, lo, side="right") - 1
        held = (k >= 0) & (lo < key(tenures.gpu, tenures.end)[np.maximum(k, 0)])
        tenure = np.where(held, k, -1)
    offset = gpu * np.int64(stride) - base
    return Segments(
        gpu=gpu,
        start=lo - offset,
        end=hi - offset,
        sample=j.astype(np.int64),
        covered=covered,
        tenure=tenure.astype(np.int64),
    )
