"""The points of one chunk into per-card sample columns: the import's hot path.

Each series' points become two numpy arrays (times in ms, values) with their values checked
as `decode.reading` checks them, no Python object per point; the series of one card are then
aligned by timestamp (`assemble`): a time any series of the card has a point at is a sample,
a later series at the same time wins (NaN included), the metrics it lacks are NaN. The pod
labels of the series give the card's holder at each time, made holdings by `holdings_of`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.collect.prometheus.decode import BOUNDS, COLUMNS, SLOT, Points, in_bounds, reading
from auditor.model import SAMPLE_FIELDS, GpuSample, Holding

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Piece:
    """The points of one series of a card: the `COLUMNS` slot they fill, their times and
    values, and the index of the pod holding the card in them (-1: none)."""

    slot: int
    ms: IntArray
    values: FloatArray
    holder: int


@dataclass(frozen=True, slots=True)
class CardSamples:
    """One card's samples of a chunk, sorted by time, column by column: `values` has every
    `SAMPLE_FIELDS` name, float64 with NaN for a missing reading, throttle reasons an object
    array of str or None."""

    uuid: str
    ts_ms: IntArray
    values: dict[str, npt.NDArray[Any]]
    from_util: int
    """Samples whose utilisation is GPU_UTIL."""
    from_engine: int
    """Samples whose utilisation is GR_ENGINE_ACTIVE x 100 (no GPU_UTIL at that time)."""
    holder: IntArray
    """Per sample, the index of the pod holding the card (-1: none)."""

    def __len__(self) -> int:
        return len(self.ts_ms)

    def memory_total_mib(self) -> float | None:
        """The first memory total of the chunk (used + free), or None."""
        total = self.values["memory_total_mib"]
        have = np.flatnonzero(~np.isnan(total))
        return float(total[have[0]]) if have.size else None

    def samples(self) -> list[GpuSample]:
        """The samples as `GpuSample`s (None for NaN)."""
        columns = []
        for name in SAMPLE_FIELDS:
            column = self.values[name]
            if column.dtype.kind == "f":
                held = column.astype(object)
                held[np.isnan(column)] = None
                columns.append(held.tolist())
            else:
                columns.append(column.tolist())
        return [
            GpuSample(self.uuid, ts, *row)
            for ts, *row in zip(self.ts_ms.tolist(), *columns, strict=True)
        ]


def point_columns(
    points: Sequence[Sequence[Any]],
    *,
    metric: str,
    column: str,
    labels: dict[str, str],
) -> tuple[IntArray, FloatArray]:
    """The times (ms, rounded half to even) and values (NaN: not read) of a series' points
    (`decode.matrix` checked their shape), every value checked as `decode.reading` checks it:
    the first bad one is an InputError."""
    if isinstance(points, Points):
        seconds, texts = points.seconds, points.texts
    else:  # a part of one (the raw points of a chunk)
        stamps, texts = zip(*points, strict=True)
        seconds = np.array(stamps, dtype=np.float64)
    ms = np.rint(seconds * 1000).astype(np.int64)
    try:
        values = np.fromiter(map(float, texts), np.float64, count=len(texts))
    except ValueError:  # a text that is no number: checked point by point, in order
        return ms, _checked(seconds.tolist(), texts, metric=metric, column=column, labels=labels)
    bad = ~in_bounds(values, column) & ~np.isnan(values)
    for i in np.flatnonzero(bad).tolist():  # raises at the first
        values[i] = _value(texts[i], float(seconds[i]), metric=metric, column=column, labels=labels)
    return ms, values


def _value(text: str, ts: float, *, metric: str, column: str, labels: dict[str, str]) -> float:
    value = reading(text, metric=metric, column=column, labels=labels, ts=ts)
    return np.nan if value is None else value


def _checked(
    stamps: Sequence[float],
    texts: Sequence[str],
    *,
    metric: str,
    column: str,
    labels: dict[str, str],
) -> FloatArray:
    low, high = BOUNDS.get(column, (0.0, 0.0))  # throttle reasons: always checked in full
    out = np.empty(len(texts), np.float64)
    for i, (ts, text) in enumerate(zip(stamps, texts, strict=True)):
        try:
            value = float(text)
        except ValueError:  # not a number: refused
            out[i] = _value(text, ts, metric=metric, column=column, labels=labels)
            continue
        if not low <= value <= high:  # NaN, too: not read, or bad
            value = _value(text, ts, metric=metric, column=column, labels=labels)
        out[i] = value
    return out


def _last_of_each_time(piece: Piece) -> Piece:
    """The piece with one point per time, the last of each (as a later point overwrites)."""
    ms = piece.ms
    if ms.size < 2 or bool((ms[1:] > ms[:-1]).all()):
        return piece
    _, first_from_end = np.unique(ms[::-1], return_index=True)
    keep = ms.size - 1 - first_from_end
    return Piece(piece.slot, ms[keep], piece.values[keep], piece.holder)


_ROUNDED: dict[float, float] = {}
_THROTTLE_TEXT: dict[float, str] = {}


def assemble(uuid: str, pieces: Sequence[Piece]) -> CardSamples:
    """The samples of one card from its series' pieces, in the order they were read (a
    later piece wins at a time both have). The memory total is used + free; the utilisation
    is GR_ENGINE_ACTIVE x 100 (rounded to 6 places) where GPU_UTIL is missing."""
    pieces = [_last_of_each_time(p) for p in pieces]
    times = np.unique(np.concatenate([p.ms for p in pieces]))
    filled = np.full((len(COLUMNS), times.size), np.nan)
    holder = np.full(times.size, -1, np.int64)
    for p in pieces:
        at = np.searchsorted(times, p.ms)
        filled[p.slot, at] = p.values
        if p.holder >= 0:
            holder[at] = p.holder
    util = filled[SLOT["util"]]
    engine = filled[SLOT["gr_engine_active"]]
    have_util = ~np.isnan(util)
    fill = ~have_util & ~np.isnan(engine)
    from_util, from_engine = int(have_util.sum()), int(fill.sum())
    if from_engine:  # 0.07 x 100 is 7.000000000000001: rounded as Python rounds it
        util[fill] = [_rounded(e) for e in engine[fill].tolist()]
    throttle = np.full(times.size, None, dtype=object)
    raw = filled[SLOT["throttle_reasons"]]
    have = np.flatnonzero(~np.isnan(raw))
    if have.size:
        throttle[have] = [_throttle_text(v) for v in raw[have].tolist()]
    used, free = filled[SLOT["memory_used_mib"]], filled[SLOT["memory_free_mib"]]
    values: dict[str, npt.NDArray[Any]] = {}
    for name in SAMPLE_FIELDS:
        if name == "memory_total_mib":
            values[name] = used + free  # NaN where either is missing
        elif name == "throttle_reasons":
            values[name] = throttle
        else:
            values[name] = filled[SLOT[name]]
    return CardSamples(uuid, times, values, from_util, from_engine, holder)


def _rounded(engine: float) -> float:
    value = _ROUNDED.get(engine)
    if value is None:
        value = _ROUNDED[engine] = round(engine * 100.0, 6)
    return value


def _throttle_text(value: float) -> str:
    text = _THROTTLE_TEXT.get(value)
    if text is None:
        text = _THROTTLE_TEXT[value] = f"0x{int(value):016x}"
    return text


def holdings_of(
    cards: Sequence[CardSamples], holders: Sequence[tuple[str, str]], *, step_ms: int
) -> list[Holding]:
    """Consecutive held times of each card (in UUID order) held by one pod within `step_ms`
    of each other, as one holding each: every card's closed holdings, then each card's
    last (as `decode.spans` orders them)."""
    closed: list[Holding] = []
    last: list[Holding] = []
    for card in sorted(cards, key=lambda c: c.uuid):
        held = card.holder >= 0
        if not held.any():
            continue
        ts, who = card.ts_ms[held], card.holder[held]
        breaks = np.flatnonzero((who[1:] != who[:-1]) | (ts[1:] - ts[:-1] > step_ms)) + 1
        starts = np.concatenate(([0], breaks)).tolist()
        ends = np.concatenate((breaks - 1, [ts.size - 1])).tolist()
        spans = [
            Holding(*holders[int(who[s])], card.uuid, int(ts[s]), int(ts[e]))
            for s, e in zip(starts, ends, strict=True)
        ]
        closed.extend(spans[:-1])
        last.append(spans[-1])
    return closed + last
