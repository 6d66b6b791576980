"""What the nvidia-smi reader yields: `SampleBlock`, the samples of a run of lines column
by column, and the block the row parser's (GPU, sample) pairs make (`pairs_block`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.model import GpuRecord, GpuSample

SAMPLE_FIELDS = (
    "util",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "sm_clock_mhz",
    "throttle_reasons",
    "temperature_c",
)
"""The `GpuSample` fields a block holds as columns, in this order."""


@dataclass(frozen=True, slots=True)
class SampleBlock:
    """The samples of a run of lines, column by column: the import's hot path.

    `records` are the distinct GPU facts of the block in order of first appearance;
    `which[i]` is the record of row `i`. `columns` holds each `SAMPLE_COLUMNS` name the log
    has: float64 arrays with NaN for a missing reading, or (throttle reasons) object arrays
    with None.
    """

    records: list[GpuRecord]
    which: npt.NDArray[np.intp]
    ts_ms: npt.NDArray[np.int64]
    columns: dict[str, npt.NDArray[Any]]

    def __len__(self) -> int:
        return len(self.ts_ms)

    def pairs(self) -> Iterator[tuple[GpuRecord, GpuSample]]:
        """The block as (GPU, sample) pairs, as `read_nvidia_smi` yields them."""
        names = [name for name in SAMPLE_FIELDS if name in self.columns]
        values = [_nullable(self.columns[name]) for name in names]
        records = self.records
        for i, (which, ts) in enumerate(zip(self.which.tolist(), self.ts_ms.tolist(), strict=True)):
            record = records[which]
            extra = {name: column[i] for name, column in zip(names, values, strict=True)}
            yield record, GpuSample(gpu_uuid=record.uuid, ts_ms=ts, **extra)


def _nullable(column: npt.NDArray[Any]) -> list[Any]:
    if column.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in column.tolist()]
    return list(column.tolist())


def pairs_block(pairs: list[tuple[GpuRecord, GpuSample]]) -> SampleBlock:
    """A block of the row parser's output (the slow path)."""
    index: dict[GpuRecord, int] = {}
    which = np.fromiter((index.setdefault(r, len(index)) for r, _ in pairs), np.intp, len(pairs))
    samples = [s for _, s in pairs]
    columns: dict[str, npt.NDArray[Any]] = {}
    for name in SAMPLE_FIELDS:
        values = [getattr(s, name) for s in samples]
        if name == "throttle_reasons":
            columns[name] = np.array(values, dtype=object)
        else:
            columns[name] = np.array([np.nan if v is None else v for v in values], np.float64)
    ts = np.fromiter((s.ts_ms for s in samples), np.int64, len(samples))
    return SampleBlock(list(index), which, ts, columns)
