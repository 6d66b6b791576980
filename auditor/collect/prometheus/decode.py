"""dcgm-exporter series out of a Prometheus answer, into GPUs, samples and holdings.

The answer's envelope and each series are checked for shape as they are reached (`matrix`;
the JSON of a series is freed once read), and every value must be one a GPU can report
(`BOUNDS`, `reading`); anything else is a one-line InputError, and the import stores
nothing. `METRICS` names the series read and the `GpuSample` field each fills (`COLUMNS`,
their slots; `card_samples` aligns them per card and time).

Labels are dcgm-exporter's: `UUID` (with `GPU_I_ID` for a MIG instance, which becomes the
GPU `UUID/gi<ID>` with the card as its parent and `GPU_I_PROFILE` as its MIG profile, SPEC
§7), `gpu` as the index, `modelName`; and `namespace`, `pod` of the pod holding the card,
an exact GPU -> pod mapping (`card_samples.holdings_of` makes them holdings).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor import limits
from auditor.errors import InputError
from auditor.model import GpuRecord
from auditor.redact import redact

METRICS: Mapping[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mib",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
}
"""dcgm-exporter metric -> GpuSample field (FB_FREE only completes the memory total;
GR_ENGINE_ACTIVE x 100 is the utilisation where GPU_UTIL is absent)."""

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
"""A MIG instance exports no GPU_UTIL; its graphics-engine activity (0-1) stands in for it."""

BOUNDS: Mapping[str, tuple[float, float]] = {
    "util": (0.0, 100.0),
    "memory_used_mib": (0.0, 1e7),
    "memory_free_mib": (0.0, 1e7),
    "power_w": (0.0, 1e5),
    "sm_clock_mhz": (0.0, 1e5),
    "temperature_c": (0.0, 200.0),
    "sm_active": (0.0, 1.0),
    "tensor_active": (0.0, 1.0),
    "dram_active": (0.0, 1.0),
    "gr_engine_active": (0.0, 1.0),
}
"""The values a GPU can report, inclusive; anything else refuses the import, as a CSV cell
out of range does (throttle reasons: an integer bitmask below 2**64)."""


def in_bounds(values: npt.NDArray[np.float64], column: str) -> npt.NDArray[np.bool_]:
    """Which readings of a sample column are within what the field can hold (NaN is not:
    the caller decides what an unreadable value is): throttle reasons a whole bitmask of 64
    bits, any other column its `BOUNDS`."""
    with np.errstate(invalid="ignore"):
        if column == "throttle_reasons":
            ok = (values >= 0) & (values < 2.0**64) & (values == np.floor(values))
        else:
            low, high = BOUNDS[column]
            ok = (values >= low) & (values <= high)
    return np.asarray(ok, dtype=np.bool_)


def short(value: object, limit: int = 60) -> str:
    """`value` as a string (`repr` unless it is one), redacted, cut to `limit` characters."""
    text = redact(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shape(query: str, what: str) -> InputError:
    return InputError(f"Prometheus answered {short(query)} oddly: {what}", field="--url")


Series = tuple[dict[str, str], list[list[Any]]]
"""A series' labels and its [timestamp, "value"] points, shapes checked (a `Points` where
`matrix` made it)."""


def matrix(answer: Mapping[str, Any], query: str) -> Iterator[Series]:
    """The series of a `query_range` answer, every part's shape checked (the envelope at
    once, each series as it is reached)."""
    data = answer.get("data")
    if not isinstance(data, dict):
        raise shape(query, "no 'data' object")
    if data.get("resultType") != "matrix":
        kind = data.get("resultType")
        raise shape(query, f"resultType {short(repr(kind))}, not 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise shape(query, "'result' is not a list")
    return _series(result, query)


def _series(result: list[Any], query: str) -> Iterator[Series]:
    for i, item in enumerate(result):
        result[i] = None  # free the JSON of each series once read
        if not isinstance(item, dict):
            raise shape(query, f"a series is {short(item)}, not an object")
        labels = item.get("metric", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise shape(query, f"labels {short(labels)} are not an object of strings")
        values = item.get("values", [])
        if not isinstance(values, list):
            raise shape(query, f"values {short(values)} are not a list")
        points = Points.of(values)
        if points is None:
            for pair in values:  # the first bad one, named
                if not _point_ok(pair):
                    raise shape(query, f'a point {short(pair)} is not [timestamp, "value"]')
            raise shape(query, 'a point is not [timestamp, "value"]')  # pragma: no cover
        del item, values
        yield labels, points


MAX_TIMESTAMP_S = 1e12
"""Largest timestamp (seconds, either sign) a point may have: about the year 33,658, well
inside what float64 milliseconds hold exactly."""


def _point_ok(pair: object) -> bool:
    if not (type(pair) is list and len(pair) == 2 and type(pair[1]) is str):
        return False
    ts = pair[0]
    if type(ts) is int:
        return abs(ts) <= MAX_TIMESTAMP_S
    return type(ts) is float and math.isfinite(ts) and abs(ts) <= MAX_TIMESTAMP_S


class Points(list[Any]):
    """A series' points as the answer gave them ([timestamp, "value"] lists, every one
    checked), with their columns: `seconds` (float64) and `texts`, the value texts."""

    __slots__ = ("seconds", "texts")
    seconds: npt.NDArray[np.float64]
    texts: tuple[str, ...]

    @classmethod
    def of(cls, values: list[Any]) -> Points | None:
        """The points of `values`, checked a column at a time (no Python step per point);
        None where one is not [timestamp, "value"] (`_point_ok`)."""
        points = cls(values)
        if not values:
            points.seconds, points.texts = np.empty(0, np.float64), ()
            return points
        if set(map(type, values)) != {list}:
            return None
        try:
            columns = tuple(zip(*values, strict=True))
        except ValueError:  # points of different lengths
            return None
        if len(columns) != 2:
            return None
        stamps, texts = columns
        if set(map(type, texts)) != {str} or not set(map(type, stamps)) <= {int, float}:
            return None
        try:
            seconds = np.fromiter(stamps, np.float64, len(stamps))
        except OverflowError:  # an int past float64
            return None
        if not (np.abs(seconds) <= MAX_TIMESTAMP_S).all():  # NaN and infinities fail, too
            return None
        points.seconds, points.texts = seconds, texts
        return points


def gpu_record(labels: Mapping[str, str], node: str) -> GpuRecord:
    uuid = labels["UUID"]
    index = labels.get("gpu")
    instance = labels.get("GPU_I_ID")
    if instance:
        profile = labels.get("GPU_I_PROFILE")
        return GpuRecord(
            f"{uuid}/gi{instance}",
            node,
            None,
            labels.get("modelName"),
            None,
            uuid,
            mig_profile=profile if profile and len(profile) <= limits.SHARE_TEXT_MAX else None,
        )
    return GpuRecord(
        uuid,
        node,
        int(index) if index and index.isascii() and index.isdigit() else None,
        labels.get("modelName"),
    )


def _series_name(labels: Mapping[str, str]) -> str:
    parts = (
        labels.get("UUID"),
        labels.get("gpu"),
        labels.get("Hostname") or labels.get("instance"),
    )
    return short("/".join(p if p is not None else "?" for p in parts), 80)


def reading(
    text: str, *, metric: str, column: str, labels: Mapping[str, str], ts: float
) -> float | None:
    """The reading `text` as stored: None for NaN (not read); a value no GPU can report is
    an InputError naming the metric, the series, the time and the value."""
    try:
        value = float(text)
    except ValueError:
        value, problem = math.inf, "not a number"
    else:
        if math.isnan(value):
            return None
        problem = _out_of_bounds(column, value)
    if problem:
        at = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise InputError(
            f"{metric} of {_series_name(labels)} at {at}: {short(repr(text))} is {problem}",
            field="--url",
        )
    return value


def _out_of_bounds(column: str, value: float) -> str:
    if column == "throttle_reasons":
        if math.isfinite(value) and value.is_integer() and 0 <= value < 2**64:
            return ""
        return "not a bitmask (an integer 0 <= n < 2**64)"
    low, high = BOUNDS[column]
    return "" if math.isfinite(value) and low <= value <= high else f"outside {low:g}..{high:g}"


COLUMNS = tuple(dict.fromkeys(METRICS.values()))
SLOT = {c: i for i, c in enumerate(COLUMNS)}
