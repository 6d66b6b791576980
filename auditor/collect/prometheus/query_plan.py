"""How a window is read from Prometheus: the grid split into queries, and the limits on
what one query may ask for and take.

Prometheus refuses more than 11,000 points per series: each metric is read in chunks of at
most `max_points` grid points (`chunks`), fewer where many series would make one answer
large (`points_per_query`, `POINT_BUDGET` points in all). One query may take `DEADLINE_S`
to its last byte and `MAX_RESPONSE_BYTES` of answer (`PrometheusClient` enforces both).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol


class SeriesCounter(Protocol):
    """What planning asks of a client (`PrometheusClient` is one): how many series match."""

    def series_count(self, metric: str, *, start_s: float, end_s: float) -> int | None: ...


MAX_POINTS = 10_000
"""Grid points per series in one query, at most (Prometheus refuses more than 11,000)."""
DEADLINE_S = 60.0
"""Longest one query may take, connecting to the last byte (a socket timeout alone restarts
with every byte a slow server sends)."""
MAX_RESPONSE_BYTES = 64 << 20
"""Largest answer read; a larger one asks for a narrower window or a larger --step."""

POINT_BUDGET = 200_000
"""Most points (series x grid points) one query asks for: what bounds the memory of a chunk
where the cluster has many GPUs."""


def points_per_query(
    client: SeriesCounter, *, start_s: float, end_s: float, max_points: int
) -> int:
    """Grid points per chunk: `max_points`, fewer where many series would make a large
    answer (POINT_BUDGET in all)."""
    count = client.series_count("DCGM_FI_DEV_GPU_UTIL", start_s=start_s, end_s=end_s)
    if not count:
        return max_points
    return max(1, min(max_points, POINT_BUDGET // count))


def chunks(
    start_ms: int, end_ms: int, *, step_ms: int, max_points: int
) -> Iterator[tuple[int, int]]:
    """(first, last) evaluation times of each query: the grid start + k*step below end_ms,
    at most `max_points` per chunk."""
    total = max(0, math.ceil((end_ms - start_ms) / step_ms))
    for first in range(0, total, max_points):
        last = min(first + max_points, total) - 1
        yield start_ms + first * step_ms, start_ms + last * step_ms
