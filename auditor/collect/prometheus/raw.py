"""Raw dcgm-exporter points out of a Prometheus-compatible store (Prometheus, Thanos Query,
Grafana Mimir, VictoriaMetrics), for the audit that classifies straight from it (SPEC §11).

A range selector `m{...}[d]` evaluated by `/api/v1/query` at time t answers the points
scraped in (t - d, t] as stored: no grid, no value repeated from the lookback, the scrape's
own timestamps (`query_range` would move them onto its step grid and fill gaps). Prometheus 2
also includes t - d, so each query asks one millisecond more than its chunk and keeps
`[first, end)`: chunks tile the window, every point read once.

Time is split into chunks so that one query asks for at most `budget` points (series x
points per series at the scrape period) and at most `MAX_POINTS` per series; a store that
refuses a query over its limits (Prometheus' `--query.max-samples`, VictoriaMetrics'
`-search.maxSamplesPerQuery`, an answer over `MAX_RESPONSE_BYTES`) gets half the chunk,
down to one scrape period, and only then is it a one-line InputError.

`read_cards` turns the points of the metrics the classifier reads into per-card columns
(`CardColumns`) with numpy, no Python object per point but the throttle text; every value
is checked as the import checks it (`decode.BOUNDS`, `decode.reading`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from auditor.collect.prometheus.client import PrometheusClient, QueryRefused
from auditor.collect.prometheus.decode import (
    GPU_UTIL,
    GR_ENGINE,
    METRICS,
    Series,
    gpu_record,
    in_bounds,
    reading,
    short,
)
from auditor.collect.prometheus.matchers import selector
from auditor.collect.prometheus.query_plan import MAX_POINTS, POINT_BUDGET
from auditor.errors import InputError

THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
CLASSIFIED = (GPU_UTIL, GR_ENGINE, THROTTLE, SM_ACTIVE)
"""The metrics the classifier reads: utilisation (GR_ENGINE_ACTIVE x 100 where a MIG
instance has no GPU_UTIL), throttle reasons, SM activity."""
DISCOVERED = (GPU_UTIL, GR_ENGINE, "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
"""The metrics that say which cards exist, where, who held them and their memory in use."""

UUIDS_PER_QUERY = 200
"""Cards named in one selector, at most: a regex of 200 UUIDs is about 8 KiB of form."""

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


@dataclass
class RawSource:
    """Raw points of one metric over `[first_ms, end_ms)`, in chunks within the store's
    limits; counts the queries made and the refusals that shrank the chunk."""

    client: PrometheusClient
    period_ms: int
    """The scrape interval (`--step`): what a chunk's points per series are counted in."""
    budget: int = POINT_BUDGET
    """Points one query may ask for (series x points per series), at most."""
    chunk_ms: int | None = None
    """The chunk asked for (`--store-chunk`); None: the budget decides."""
    queries: int = 0
    shrunk: int = 0
    points: int = 0
    _learnt: int | None = field(default=None, repr=False)

    def chunk_for(self, series: int) -> int:
        """The chunk of a query over `series` series: the one asked for, else the budget's,
        else what a refusal taught (the smallest)."""
        if self.chunk_ms is not None:
            chunk = self.chunk_ms
        else:
            per_series = max(1, min(MAX_POINTS, self.budget // max(series, 1)))
            chunk = per_series * self.period_ms
        return chunk if self._learnt is None else min(chunk, self._learnt)

    def read(
        self,
        metric: str,
        *,
        first_ms: int,
        end_ms: int,
        uuids: Sequence[str] | None = None,
        series: int = 1,
    ) -> Iterator[Series]:
        """The series of `metric` (of the cards `uuids`, by their `UUID` label; None: all)
        chunk by chunk, each series' points inside `[first_ms, end_ms)`; a series comes once
        per chunk it has points in."""
        names = sorted(set(uuids)) if uuids is not None else None
        if names is not None and not names:
            return
        groups = (
            [names[i : i + UUIDS_PER_QUERY] for i in range(0, len(names), UUIDS_PER_QUERY)]
            if names is not None
            else [None]
        )
        for group in groups:
            which = "" if group is None else f'UUID=~"{_pattern(group)}"'
            count = series if group is None else min(series, len(group) * 2)
            yield from self._read(
                selector(metric, which, self.client.matchers),
                first_ms=first_ms,
                end_ms=end_ms,
                series=count,
            )

    def _read(self, selector: str, *, first_ms: int, end_ms: int, series: int) -> Iterator[Series]:
        at = first_ms
        while at < end_ms:
            stop = min(end_ms, at + self.chunk_for(series))
            try:
                self.queries += 1
                answer = self.client.query(
                    f"{selector}[{stop - at + 1}ms]", time_s=(stop - 1) / 1000
                )
            except QueryRefused as e:
                if not e.too_large or stop - at <= self.period_ms:
                    raise InputError(
                        f"{e.message}; even {(stop - at) / 1000:g}s per query is refused: raise "
                        "the store's per-query sample limit or give --store-points fewer",
                        field="--samples-from",
                    ) from None
                self.shrunk += 1
                self._learnt = max(self.period_ms, (stop - at) // 2)
                continue
            for labels, points in answer:
                lo, hi = 0, len(points)
                while lo < hi and round(points[lo][0] * 1000) < at:
                    lo += 1
                while hi > lo and round(points[hi - 1][0] * 1000) >= stop:
                    hi -= 1
                if lo < hi:
                    self.points += hi - lo
                    yield labels, points[lo:hi] if (lo, hi) != (0, len(points)) else points
            at = stop


def _pattern(uuids: Sequence[str]) -> str:
    """A PromQL regex matching exactly these UUIDs (a backslash doubled inside the string)."""
    return "|".join(u if _PLAIN.fullmatch(u) else re.escape(u).replace("\\", "\\\\") for u in uuids)


@dataclass
class CardColumns:
    """One card's samples as the classifier reads them, sorted by time."""

    ts_ms: np.ndarray
    util: np.ndarray
    throttle_reasons: np.ndarray
    sm_active: np.ndarray


_COLUMN = {GPU_UTIL: "util", GR_ENGINE: "gr_engine_active", THROTTLE: "throttle_reasons"}
_COLUMN[SM_ACTIVE] = "sm_active"


def read_cards(
    source: RawSource, uuids: Sequence[str], *, first_ms: int, end_ms: int
) -> dict[str, CardColumns]:
    """The classified metrics of these cards (GPU UUIDs; a MIG instance `UUID/giN`) over
    `[first_ms, end_ms)`, as per-card columns: a time any of them was scraped is a sample,
    the metrics it lacks NaN (None for throttle reasons), as the import stores them."""
    wanted = set(uuids)
    labels_of = sorted({u.split("/gi", 1)[0] for u in wanted})
    pieces: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for metric in CLASSIFIED:
        column = _COLUMN[metric]
        for labels, points in source.read(
            metric, first_ms=first_ms, end_ms=end_ms, uuids=labels_of, series=len(wanted)
        ):
            if not labels.get("UUID") or not (labels.get("Hostname") or labels.get("instance")):
                continue  # as the import skips them
            uuid = gpu_record(labels, "").uuid
            if uuid not in wanted:
                continue
            ms, values = _values(points, metric=metric, column=column, labels=labels)
            pieces.setdefault(uuid, []).append((column, ms, values))
    out: dict[str, CardColumns] = {}
    for uuid, parts in pieces.items():
        out[uuid] = _columns(parts)
    return out


def _values(
    points: list[list[object]], *, metric: str, column: str, labels: dict[str, str]
) -> tuple[np.ndarray, np.ndarray]:
    """The points' times (ms) and values (NaN: not read), every value checked."""
    n = len(points)
    ts = np.fromiter((p[0] for p in points), dtype=np.float64, count=n)
    ms = np.rint(ts * 1000).astype(np.int64)
    try:
        values = np.array([p[1] for p in points], dtype=np.float64)
    except ValueError:
        values = np.full(n, np.nan)
        bad = np.ones(n, dtype=bool)
    else:
        bad = ~in_bounds(values, column) & ~np.isnan(values)
    if bad.any():
        for i in np.flatnonzero(bad):
            p = points[int(i)]
            reading(str(p[1]), metric=metric, column=column, labels=labels, ts=float(str(p[0])))
        raise InputError(f"{metric} of {short(labels.get('UUID'))}: a bad value", field="--url")
    return ms, values


def _columns(parts: list[tuple[str, np.ndarray, np.ndarray]]) -> CardColumns:
    times = np.unique(np.concatenate([ms for _, ms, _ in parts]))
    filled = {c: np.full(times.size, np.nan) for c in _COLUMN.values()}
    for column, ms, values in parts:  # a later series of the same time wins, as in the import
        filled[column][np.searchsorted(times, ms)] = values
    util, engine = filled["util"], filled["gr_engine_active"]
    fill = np.isnan(util) & ~np.isnan(engine)
    if fill.any():  # 0.07 x 100 is 7.000000000000001: rounded as the import rounds it
        util = util.copy()
        util[fill] = [round(float(e) * 100.0, 6) for e in engine[fill]]
    throttle = np.full(times.size, None, dtype=object)
    raw = filled["throttle_reasons"]
    have = np.flatnonzero(~np.isnan(raw))
    if have.size:
        texts: dict[float, str] = {}
        for i in have:
            v = float(raw[i])
            text = texts.get(v)
            if text is None:
                text = texts[v] = f"0x{int(v):016x}"
            throttle[i] = text
    return CardColumns(times, util, throttle, filled["sm_active"])


__all__ = [
    "CLASSIFIED",
    "DISCOVERED",
    "METRICS",
    "CardColumns",
    "RawSource",
    "read_cards",
]
