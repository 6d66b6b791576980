"""Reads `nvidia-smi --query-gpu ... --format=csv` logs into GPU records and samples.

This module owns the nvidia-smi CSV format: which columns it reads, how a header line is
recognised, what counts as a missing reading, how the node's local time becomes epoch
milliseconds UTC, and which lines are errors. It is a pure parser: no database, no clock.

The format, as `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] -l N` writes it:

* Cells are separated by commas and padded with spaces; nvidia-smi never quotes, so a cell is
  the text between two commas, stripped.
* A header line names the fields, with units in brackets (`memory.used [MiB]`); `nounits`
  drops the units from the values but not from the header. A line is a header when its first
  cell names a known field or any of its cells names a required one; the fields may come in
  any order, any superset of the required `timestamp`, `index`, `utilization.gpu`, `memory.used`.
  Every header cell must be a known `--query-gpu` property (`auditor/data/nvidia_smi_fields.txt`)
  unless `ignore_unknown_columns` is set. A repeated header is skipped; a different header
  (files concatenated) applies to the lines after it.
* Without a header (`noheader`) the columns must be exactly the four default ones, in this
  order: timestamp, index, utilization.gpu, memory.used.
* Values carry their unit (`38 %`, `575 MiB`, `28.16 W`) or not (`nounits`); a bracketed value
  (`[N/A]`, `[Not Supported]`, `[Unknown Error]`, ...) or `N/A` is a reading the driver could
  not make and becomes `None`, never 0. MIG-enabled GPUs report `utilization.gpu` as `[N/A]`.
* Timestamps are `YYYY/MM/DD HH:MM:SS.mmm` (milliseconds optional) in the node's local time,
  without a zone; they are read in `tz`. A local time that occurs twice (the hour a clock is
  set back) is read as its first occurrence, unless that would put it more than a minute
  before a time already read from the file and the second occurrence would not: a log runs
  forward, so it is then in the repeated hour.
* nvidia-smi ends every line with a newline, so a last line without one is an interrupted
  write: it is dropped when it has fewer cells than the header or its last cell does not
  parse. Anywhere else such a line is an error.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.errors import InputError, shown
from auditor.model import GpuRecord, GpuSample

REQUIRED_FIELDS: tuple[str, ...] = ("timestamp", "utilization.gpu", "memory.used")
"""Fields every file must have (a one-GPU log may have nothing else)."""
DEFAULT_FIELDS: tuple[str, ...] = ("timestamp", "index", "utilization.gpu", "memory.used")
"""The columns, in order, of a file without a header and without `--columns`."""
CAPTURE_COMMAND = (
    "nvidia-smi --query-gpu=timestamp,uuid,index,utilization.gpu,memory.used,memory.total "
    "--format=csv -l 5"
)
"""How to capture a log this reader takes, as error messages tell it."""

PROGRESS_EVERY_LINES = 10_000
"""How often, in lines, `on_progress` is told how many bytes have been read."""

_UUID = ("uuid", "gpu_uuid")
_PCI = ("pci.bus_id",)
_NAME = ("name", "gpu_name")
_MEMORY_TOTAL = ("memory.total",)
_POWER = (
    "power.draw",
    "power.draw.instant",
    "gpu.power.draw.instant",
    "power.draw.average",
    "gpu.power.draw.average",
)
_SM_CLOCK = ("clocks.current.sm", "clocks.sm")
_THROTTLE = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
_TEMPERATURE = ("temperature.gpu",)

_UNIT_IN_HEADER = re.compile(r"\s*\[[^\]]*\]\Z")
_HEX = re.compile(r"0[xX][0-9A-Fa-f]+")
_TIMESTAMP = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MS = timedelta(milliseconds=1)
_REPEAT_TOLERANCE_MS = 60_000
"""How far back a repeated local time must go before it is read as its second occurrence."""


@cache
def known_fields() -> frozenset[str]:
    """Every property name (and alias) `nvidia-smi --query-gpu` accepts, from the data file."""
    text = resources.files("auditor").joinpath("data/nvidia_smi_fields.txt").read_text("utf-8")
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


class _BadCell(Exception):
    """A cell (or line) that does not parse; the caller adds the file and line.

    `column` is the cell's position, -1 for a fault of the whole line; `field` names the
    field where the column alone does not.
    """

    def __init__(self, column: int, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.column = column
        self.message = message
        self.field = field


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where each field this reader uses sits in a line, from a header or the default."""

    names: tuple[str, ...]
    timestamp: int
    index: int | None
    util: int
    memory_used: int
    uuid: tuple[int, ...]
    pci: tuple[int, ...]
    name: tuple[int, ...]
    memory_total: tuple[int, ...]
    power: tuple[int, ...]
    sm_clock: tuple[int, ...]
    throttle: tuple[int, ...]
    temperature: tuple[int, ...]

    @classmethod
    def of(cls, names: Sequence[str]) -> _Layout:
        first: dict[str, int] = {}
        for column, name in enumerate(names):
            first.setdefault(name, column)

        def find(candidates: tuple[str, ...]) -> tuple[int, ...]:
            return tuple(first[n] for n in candidates if n in first)

        return cls(
            names=tuple(names),
            timestamp=first["timestamp"],
            index=first.get("index"),
            util=first["utilization.gpu"],
            memory_used=first["memory.used"],
            uuid=find(_UUID),
            pci=find(_PCI),
            name=find(_NAME),
            memory_total=find(_MEMORY_TOTAL),
            power=find(_POWER),
            sm_clock=find(_SM_CLOCK),
            throttle=find(_THROTTLE),
            temperature=find(_TEMPERATURE),
        )


_DEFAULT_LAYOUT = _Layout.of(DEFAULT_FIELDS)


def _header_name(cell: str) -> str:
    """The field a header cell names, without its unit: `memory.used [MiB]` → `memory.used`."""
    return _UNIT_IN_HEADER.sub("", cell) if cell.endswith("]") else cell


def _is_header(cells: Sequence[str]) -> bool:
    if cells[0][:1].isdigit():
        return False  # field names start with a letter; a timestamp or index does not
    if _header_name(cells[0]) in known_fields():
        return True
    return any(_header_name(c) in DEFAULT_FIELDS for c in cells if c.startswith(DEFAULT_FIELDS))


def _header_layout(cells: Sequence[str], *, ignore_unknown: bool) -> _Layout:
    """The layout a header line declares; raises `_BadCell` for unknown or missing fields."""
    names = [_header_name(c) for c in cells]
    if not ignore_unknown:
        known = known_fields()
        for column, name in enumerate(names):
            if name not in known:
                raise _BadCell(
                    column,
                    "unknown column: not an nvidia-smi --query-gpu property "
                    "(pass --ignore-unknown-columns to skip columns a newer driver added)",
                    field=name,
                )
    for required in REQUIRED_FIELDS:
        if required not in names:
            raise _BadCell(
                -1,
                f"missing required column {required!r}: the file must have "
                f"{', '.join(REQUIRED_FIELDS)} ({CAPTURE_COMMAND})",
                field=required,
            )
    return _Layout.of(names)


def _index(cells: Sequence[str], column: int | None) -> int | None:
    if column is None:
        return None
    cell = cells[column]
    if _is_missing(cell):
        return None
    if not (cell.isascii() and cell.isdigit()):
        raise _BadCell(column, f"expected a GPU index like 0, found {shown(cell)}")
    if len(cell) > 6:  # int() of a 10,000-digit cell raises; no node has a million GPUs
        raise _BadCell(column, f"GPU index out of range: {shown(cell)}")
    return int(cell)


def _identity(
    cells: Sequence[str], layout: _Layout, index: int | None, *, node: str
) -> tuple[str, int | None]:
    """The GPU's UUID and index: `uuid`, else `NODE/pci.bus_id`, else `NODE/index`; a log
    with none of those columns is a one-GPU log, index 0."""
    uuid = _first_text(cells, layout.uuid)
    if uuid is not None:
        return uuid, index
    bus = _first_text(cells, layout.pci)
    if bus is not None:
        return f"{node}/{bus}", index
    if index is not None:
        return f"{node}/{index}", index
    if layout.index is None and not layout.uuid and not layout.pci:
        return f"{node}/0", 0
    column = layout.index if layout.index is not None else (layout.uuid or layout.pci)[0]
    raise _BadCell(column, "no uuid, pci.bus_id or index: cannot tell which GPU this is")


def _is_missing(cell: str) -> bool:
    """A reading the driver could not make: `[N/A]`, `[Not Supported]`, `[Unknown Error]`..."""
    return (cell.startswith("[") and cell.endswith("]")) or cell == "N/A"


def _number(cells: Sequence[str], column: int, *, unit: str) -> float | None:
    """A number with or without its unit (`38 %` or `38`); `None` for a missing reading."""
    cell = cells[column]
    text = cell[: -len(unit)].rstrip() if cell.endswith(unit) else cell
    try:
        value = float(text)
    except ValueError:
        if _is_missing(cell):
            return None
        if not cell:
            raise _BadCell(
                column, "empty value (nvidia-smi writes [N/A] for a missing reading)"
            ) from None
        raise _BadCell(column, f"expected a number in {unit}, found {shown(cell)}") from None
    if not math.isfinite(value) or "_" in text:
        raise _BadCell(column, f"expected a number in {unit}, found {shown(cell)}")
    return value


def _first_number(cells: Sequence[str], columns: tuple[int, ...], *, unit: str) -> float | None:
    """The first reading among equivalent columns (`power.draw`, `power.draw.instant`...)."""
    for column in columns:
        value = _number(cells, column, unit=unit)
        if value is not None:
            if value < 0:
                raise _BadCell(column, f"negative value {shown(cells[column])}")
            return value
    return None


def _first_text(cells: Sequence[str], columns: tuple[int, ...]) -> str | None:
    for column in columns:
        cell = cells[column]
        if cell and not _is_missing(cell):
            return cell
    return None


def _first_hex(cells: Sequence[str], columns: tuple[int, ...]) -> str | None:
    for column in columns:
        cell = cells[column]
        if _is_missing(cell):
            continue
        if not _HEX.fullmatch(cell):
            raise _BadCell(
                column,
                f"expected a hexadecimal bitmask like 0x0000000000000001, found {shown(cell)}",
            )
        return cell
    return None


EARLIEST_MS = 946_684_800_000
"""2000-01-01T00:00:00Z: no GPU log is older; a 1970 date is a clock that was reset."""


class _LocalClock:
    """Turns nvidia-smi's zone-less local timestamps into epoch milliseconds UTC.

    The work per minute (date arithmetic, the zone's offsets) is done once and cached:
    consecutive rows share their minute.
    """

    def __init__(self, tz: tzinfo, *, not_after_ms: int | None = None) -> None:
        self._tz = tz
        self._not_after_ms = not_after_ms
        fixed = tz.utcoffset(None) if isinstance(tz, timezone) else None
        self._fixed_ms = None if fixed is None else fixed // _MS
        # (the "YYYY/MM/DD HH:MM" text, its local ms, first and second UTC offset in ms)
        self._minute: tuple[str, int, int, int] = ("", 0, 0, 0)
        self.latest_ms: int | None = None
        self._offsets: dict[int, int | None] = {}

    @property
    def not_after_ms(self) -> int | None:
        return self._not_after_ms

    def offsets(self, key: int) -> int | None:
        """The UTC ms of local minute `key` (YYYYMMDDHHMM as a number), or None where the
        minute does not exist or happens twice in the zone (or is no date at all)."""
        known = self._offsets.get(key, False)
        if known is not False:
            return known
        year, rest = divmod(key, 100_000_000)
        month, rest = divmod(rest, 1_000_000)
        day, rest = divmod(rest, 10_000)
        hour, minute = divmod(rest, 100)
        found: int | None = None
        try:
            days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            days = None
        if days is not None and hour <= 23 and minute <= 59:
            minute_ms = ((days * 24 + hour) * 60 + minute) * 60_000
            if self._fixed_ms is not None:
                found = minute_ms - self._fixed_ms
            else:
                local = datetime(year, month, day, hour, minute, tzinfo=self._tz)
                first = local.utcoffset()
                second = local.replace(fold=1).utcoffset()
                back = local.astimezone(UTC).astimezone(self._tz).replace(tzinfo=None)
                if first is not None and first == second and back == local.replace(tzinfo=None):
                    found = minute_ms - first // _MS
        if len(self._offsets) > 100_000:
            self._offsets.clear()
        self._offsets[key] = found
        return found

    def epoch_ms(self, cells: Sequence[str], column: int) -> int:
        cell = cells[column]
        match = _TIMESTAMP.fullmatch(cell)
        if match is None:
            if not cell or _is_missing(cell):
                raise _BadCell(column, f"no timestamp, found {shown(cell)}")
            raise _BadCell(column, f"expected YYYY/MM/DD HH:MM:SS.mmm, found {shown(cell)}")
        key = cell[: match.end(5)]
        if key != self._minute[0]:
            self._minute = self._minute_of(key, match, column)
        _, minute_ms, first, second = self._minute
        seconds = int(match.group(6))
        if seconds > 59:
            raise _BadCell(column, f"no such time of day in {shown(cell)}")
        fraction = match.group(7)
        local_ms = minute_ms + seconds * 1000 + (int(fraction.ljust(3, "0")[:3]) if fraction else 0)
        utc_ms = local_ms - first
        latest = self.latest_ms
        if first != second and latest is not None:
            # A local time that happens twice (clocks set back): read as the first occurrence
            # unless that goes back past a time already read and the second does not.
            repeat_ms = local_ms - second
            if utc_ms < latest - _REPEAT_TOLERANCE_MS and repeat_ms >= latest:
                utc_ms = repeat_ms
        if not EARLIEST_MS <= utc_ms <= (self._not_after_ms or utc_ms):
            when = "before 2000" if utc_ms < EARLIEST_MS else "in the future"
            raise _BadCell(column, f"{cell} is {when}: is the node's clock set right?")
        if latest is None or utc_ms > latest:
            self.latest_ms = utc_ms
        return utc_ms

    def _minute_of(self, key: str, match: re.Match[str], column: int) -> tuple[str, int, int, int]:
        year, month, day, hour, minute = (int(match.group(g)) for g in range(1, 6))
        try:
            days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            raise _BadCell(column, f"no such date in {shown(match.group(0))}") from None
        if hour > 23 or minute > 59:
            raise _BadCell(column, f"no such time of day in {shown(match.group(0))}")
        minute_ms = ((days * 24 + hour) * 60 + minute) * 60_000
        if self._fixed_ms is not None:
            return key, minute_ms, self._fixed_ms, self._fixed_ms
        local = datetime(year, month, day, hour, minute, tzinfo=self._tz)
        first = local.utcoffset()
        second = local.replace(fold=1).utcoffset()
        if first is None or second is None:
            raise ValueError(f"time zone {self._tz!r} gives no UTC offset")
        if local.astimezone(UTC).astimezone(self._tz).replace(tzinfo=None) != local.replace(
            tzinfo=None
        ):
            raise _BadCell(
                column, f"{match.group(0)} does not exist in {self._tz} (clocks went forward)"
            )
        return key, minute_ms, first // _MS, second // _MS


class _Reader:
    """Turns the cells of one data line into a GPU and a sample, under a layout."""

    def __init__(
        self,
        *,
        node: str,
        tz: tzinfo,
        gpu_lines: dict[str, int] | None,
        not_after_ms: int | None = None,
    ) -> None:
        self.node = node
        self.clock = _LocalClock(tz, not_after_ms=not_after_ms)
        self._records: dict[tuple[str, int | None, str | None, float | None], GpuRecord] = {}
        self._cards: dict[str, tuple[int, int | None, str | None]] = {}
        """Per UUID: the line it first appears on, its index and model (once known)."""
        self.gpu_lines = gpu_lines

    def sample(
        self, cells: Sequence[str], layout: _Layout, *, line: int
    ) -> tuple[GpuRecord, GpuSample]:
        ts_ms = self.clock.epoch_ms(cells, layout.timestamp)
        index = _index(cells, layout.index)
        util = _number(cells, layout.util, unit="%")
        if util is not None and not 0 <= util <= 100:
            raise _BadCell(
                layout.util, f"utilization must be 0-100 %, found {shown(cells[layout.util])}"
            )
        memory_total = _first_number(cells, layout.memory_total, unit="MiB")
        uuid, index = _identity(cells, layout, index, node=self.node)
        temperature = None
        if layout.temperature:
            temperature = _number(cells, layout.temperature[0], unit="C")
        sample = GpuSample(
            gpu_uuid=uuid,
            ts_ms=ts_ms,
            util=util,
            memory_used_mib=_first_number(cells, (layout.memory_used,), unit="MiB"),
            memory_total_mib=memory_total,
            power_w=_first_number(cells, layout.power, unit="W"),
            sm_clock_mhz=_first_number(cells, layout.sm_clock, unit="MHz"),
            throttle_reasons=_first_hex(cells, layout.throttle),
            temperature_c=temperature,
        )
        model = _first_text(cells, layout.name)
        key = (uuid, index, model, memory_total)
        record = self._records.get(key)
        if record is None:
            self._check_card(uuid, index, model, line=line, layout=layout)
            record = self._record(key)
        return record, sample

    def _check_card(
        self, uuid: str, index: int | None, model: str | None, *, line: int, layout: _Layout
    ) -> None:
        """One UUID is one card: it keeps its index and model throughout a file."""
        known = self._cards.get(uuid)
        if known is None:
            self._cards[uuid] = (line, index, model)
            if self.gpu_lines is not None:
                self.gpu_lines[uuid] = line
            return
        first_line, first_index, first_model = known
        clash = f"one UUID is one card (are two nodes' logs in one file?); GPU {uuid}"
        if index is not None and first_index is not None and index != first_index:
            raise _BadCell(
                layout.index if layout.index is not None else -1,
                f"{clash} is index {index} here, index {first_index} on line {first_line}",
            )
        if model is not None and first_model is not None and model != first_model:
            raise _BadCell(
                layout.name[0], f"{clash} is {model!r} here, {first_model!r} on line {first_line}"
            )
        if (first_index is None and index is not None) or (first_model is None and model):
            self._cards[uuid] = (
                first_line,
                first_index if index is None else index,
                first_model or model,
            )

    def _record(self, key: tuple[str, int | None, str | None, float | None]) -> GpuRecord:
        """The same record object for the same GPU facts: a log repeats them every row."""
        uuid, index, model, memory_total = key
        record = self._records.get(key)
        if record is None:
            if len(self._records) >= 4096:
                self._records.clear()
            record = GpuRecord(
                uuid=uuid, node=self.node, index=index, model=model, memory_total_mib=memory_total
            )
            self._records[key] = record
        return record


def _encoding(raw: io.BufferedReader) -> str:
    """UTF-8, or UTF-16 when a byte-order mark says so (PowerShell 5 redirects write it)."""
    head = raw.peek(4)[:4]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    return "utf-8-sig"


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
        names = [name for name in _SAMPLE_FIELDS if name in self.columns]
        values = [_nullable(self.columns[name]) for name in names]
        records = self.records
        for i, (which, ts) in enumerate(zip(self.which.tolist(), self.ts_ms.tolist(), strict=True)):
            record = records[which]
            extra = {name: column[i] for name, column in zip(names, values, strict=True)}
            yield record, GpuSample(gpu_uuid=record.uuid, ts_ms=ts, **extra)


_SAMPLE_FIELDS = (
    "util",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "sm_clock_mhz",
    "throttle_reasons",
    "temperature_c",
)


def _nullable(column: npt.NDArray[Any]) -> list[Any]:
    if column.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in column.tolist()]
    return list(column.tolist())


def _pairs_block(pairs: list[tuple[GpuRecord, GpuSample]]) -> SampleBlock:
    """A block of the row parser's output (the slow path)."""
    index: dict[GpuRecord, int] = {}
    which = np.fromiter((index.setdefault(r, len(index)) for r, _ in pairs), np.intp, len(pairs))
    samples = [s for _, s in pairs]
    columns: dict[str, npt.NDArray[Any]] = {}
    for name in _SAMPLE_FIELDS:
        values = [getattr(s, name) for s in samples]
        if name == "throttle_reasons":
            columns[name] = np.array(values, dtype=object)
        else:
            columns[name] = np.array([np.nan if v is None else v for v in values], np.float64)
    ts = np.fromiter((s.ts_ms for s in samples), np.int64, len(samples))
    return SampleBlock(list(index), which, ts, columns)


CHUNK_LINES = PROGRESS_EVERY_LINES
"""Lines read and parsed at a time (the first chunk is shorter: it holds the header)."""
_FIRST_CHUNK_LINES = 64


def read_nvidia_smi(
    path: Path,
    *,
    node: str,
    tz: tzinfo = UTC,
    ignore_unknown_columns: bool = False,
    on_progress: Callable[[int], None] | None = None,
    gpu_lines: dict[str, int] | None = None,
    not_after_ms: int | None = None,
    columns: Sequence[str] | None = None,
) -> Iterator[tuple[GpuRecord, GpuSample]]:
    """Yield one (GPU, sample) per data row of an nvidia-smi CSV log, streaming the file.

    `node` names the machine the log came from; a GPU is identified by its `uuid`, else
    `NODE/pci.bus_id`, else `NODE/index`; a log with none of those columns is one GPU,
    `NODE/0`. `tz` is the node's time zone (nvidia-smi writes local time without one).
    `columns` are the fields of a file without a header (the list given to `--query-gpu`);
    without it such a file must have the default four. `on_progress` receives the number
    of bytes read so far every `PROGRESS_EVERY_LINES` lines and at the end. Duplicate rows
    are yielded as they come. `gpu_lines`, if given, is filled in with the line where each
    GPU first appears (for errors found later, such as the store's conflict check). One GPU
    UUID showing two indexes or two models is an error on the line of the second. A time
    before 2000 or after `not_after_ms` (the caller's "now", with a margin) is refused: a
    node whose clock was reset writes 1970, and one such sample would stretch every audit
    of all data over decades. So is a local time that does not exist in `tz` (the hour
    skipped in spring).

    Raises `InputError` naming the file, line and field for bad input, including a file that
    cannot be read, holds no sample, or is not a CSV at all (nvidia-smi's table or `-q`
    output). Being a generator, it opens the file and raises only as it is iterated: a
    caller that must not act on part of a bad file (an import is one transaction) consumes
    it inside that transaction.
    """
    for block in read_nvidia_smi_blocks(
        path,
        node=node,
        tz=tz,
        ignore_unknown_columns=ignore_unknown_columns,
        on_progress=on_progress,
        gpu_lines=gpu_lines,
        not_after_ms=not_after_ms,
        columns=columns,
    ):
        yield from block.pairs()


def read_nvidia_smi_blocks(
    path: Path,
    *,
    node: str,
    tz: tzinfo = UTC,
    ignore_unknown_columns: bool = False,
    on_progress: Callable[[int], None] | None = None,
    gpu_lines: dict[str, int] | None = None,
    not_after_ms: int | None = None,
    columns: Sequence[str] | None = None,
) -> Iterator[SampleBlock]:
    """`read_nvidia_smi`, a block of lines at a time, column by column (same arguments).

    Each chunk of lines is parsed vectorised when it is plain (the lines nvidia-smi writes:
    ASCII, one space after each comma, units where the header says, the header repeated
    as it was); anything else, including any bad cell, is read by the row parser from the
    same state, which gives the same values or the one-line error with its line and field.
    """
    file = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise InputError(f"cannot read the file: {e.strerror or e}", file=file) from e
    with raw:
        state = _State(
            file=file,
            reader=_Reader(node=node, tz=tz, gpu_lines=gpu_lines, not_after_ms=not_after_ms),
            ignore_unknown=ignore_unknown_columns,
        )
        if columns is not None:
            try:
                state.layout = _header_layout(list(columns), ignore_unknown=ignore_unknown_columns)
            except _BadCell as bad:
                raise InputError(bad.message, field=bad.field or "--columns") from None
            state.from_option = True
        if _encoding(raw) == "utf-16":
            text = io.TextIOWrapper(raw, encoding="utf-16", errors="replace", newline="")
            while lines := list(itertools.islice(text, CHUNK_LINES)):
                block = state.slow(lines)
                if on_progress is not None:
                    on_progress(raw.tell())
                if block is not None:
                    yield block
        else:
            if raw.peek(3)[:3] == b"\xef\xbb\xbf":
                raw.read(3)
            size = _FIRST_CHUNK_LINES
            read = 0
            while chunk := list(itertools.islice(raw, size)):
                read += len(chunk)
                size = CHUNK_LINES - read % CHUNK_LINES
                block = state.chunk(b"".join(chunk), len(chunk))
                if on_progress is not None and read % PROGRESS_EVERY_LINES == 0:
                    on_progress(raw.tell())
                if block is not None:
                    yield block
        if on_progress is not None:
            on_progress(raw.tell())
    if state.samples == 0:
        if state.dropped is not None:
            raise state.dropped
        raise InputError("no samples: the file has no data rows", file=file)


_NOT_CSV = re.compile(
    r"(\+-|\||=+|<\?xml|<nvidia_smi_log)|.*NVSMI LOG"
    r"|[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4}\s*\Z"
    r"|[A-Za-z][\w .()/-]*? +: "
)
"""The first line of nvidia-smi's table (its date line or a frame), of `-q` or `-q -x`."""


class _State:
    """What reading a file has found so far: the layout, the clock, the cards, the counts."""

    def __init__(self, *, file: str, reader: _Reader, ignore_unknown: bool) -> None:
        self.file = file
        self.reader = reader
        self.ignore_unknown = ignore_unknown
        self.layout = _DEFAULT_LAYOUT
        self.from_option = False
        self.header: bytes | None = None
        """The header line as the file writes it, for the fast path to skip its repeats."""
        self.line_no = 0
        self.samples = 0
        self.dropped: InputError | None = None
        self.content = False
        """Whether a non-blank line has been seen (the first one may show a table)."""

    def chunk(self, data: bytes, count: int) -> SampleBlock | None:
        """The block of `count` complete or final lines; fast when the lines are plain."""
        if self.content and data.endswith(b"\n"):
            fast = _fast_block(self, data, count)
            if fast is not None:
                self.line_no += count
                self.samples += len(fast)
                return fast
        text = data.decode("utf-8", errors="replace")
        return self.slow(io.StringIO(text, newline=""))

    def slow(self, lines: Iterable[str]) -> SampleBlock | None:
        """The row parser over lines; raises the `InputError` of the first bad one."""
        layout = self.layout
        reader = self.reader
        pairs: list[tuple[GpuRecord, GpuSample]] = []
        for line in lines:
            self.line_no += 1
            line_no = self.line_no
            if "\ufffd" in line:
                raise InputError("not text: bytes that are not UTF-8", file=self.file, line=line_no)
            complete = line.endswith(("\n", "\r"))
            body = line.rstrip("\r\n")
            if not body.strip():
                continue
            if not self.content:
                self.content = True
                if _NOT_CSV.match(body.lstrip()):
                    raise InputError(
                        "not a CSV: this looks like nvidia-smi's table or -q output; capture "
                        f"a CSV log with {CAPTURE_COMMAND}",
                        file=self.file,
                        line=line_no,
                    )
            cells = [c.strip() for c in body.split(",")]
            try:
                if _is_header(cells):
                    if not complete:
                        continue  # a header cut short adds nothing
                    if [_header_name(c) for c in cells] != list(layout.names):
                        layout = _header_layout(cells, ignore_unknown=self.ignore_unknown)
                        self.layout = layout
                        self.from_option = False
                    self.header = body.encode() if body.isascii() else None
                    continue
                if len(cells) != len(layout.names):
                    if not complete and len(cells) < len(layout.names):
                        continue  # an interrupted last write
                    raise _cell_count_error(layout, len(cells), from_option=self.from_option)
                pairs.append(reader.sample(cells, layout, line=line_no))
            except _BadCell as bad:
                field = bad.field
                if field is None and 0 <= bad.column < len(layout.names):
                    field = layout.names[bad.column]
                error = InputError(bad.message, file=self.file, line=line_no, field=field)
                if not complete and bad.column == len(layout.names) - 1:
                    self.dropped = error  # the last cell of an interrupted last write
                    continue
                raise error from None
        self.samples += len(pairs)
        return _pairs_block(pairs) if pairs else None


def _cell_count_error(layout: _Layout, found: int, *, from_option: bool = False) -> _BadCell:
    """A line with too few or too many cells, naming the first missing field if any."""
    expected = len(layout.names)
    message = f"expected {expected} cells as in the header, found {found}"
    if from_option:
        message = f"expected {expected} cells as --columns says, found {found}"
    elif layout is _DEFAULT_LAYOUT:
        message = (
            f"expected {expected} cells, found {found}; without a header line the columns "
            f"must be {', '.join(DEFAULT_FIELDS)}, or name them with --columns"
        )
    missing = layout.names[found] if found < expected else None
    return _BadCell(-1, message, field=missing)


# --- the fast path ------------------------------------------------------------------------

_UNPLAIN_BYTES = bytes([*range(0x0A), *range(0x0B, 0x20), 0x7F, ord('"')])
"""Bytes the fast path leaves to the row parser: controls (a tab among them), quotes."""
_MISSING_TOKENS = [
    "[N/A]",
    "[Not Supported]",
    "[Unknown Error]",
    "[Unknown]",
    "[Insufficient Permissions]",
    "[GPU requires reset]",
    "[GPU is lost]",
    "N/A",
]
_TS_WIDTH = 23
"""`YYYY/MM/DD HH:MM:SS.mmm`, the only timestamp form the fast path reads."""
_TS_DIGITS = np.array([i for i in range(_TS_WIDTH) if i not in (4, 7, 10, 13, 16, 19)])
_TS_SEPARATORS = np.array([4, 7, 10, 13, 16, 19])
_TS_SEPARATOR_BYTES = np.frombuffer(b"// ::.", np.uint8)
_NUMERIC: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("util", ("utilization.gpu",), "%"),
    ("memory_used_mib", ("memory.used",), "MiB"),
    ("memory_total_mib", _MEMORY_TOTAL, "MiB"),
    ("power_w", _POWER, "W"),
    ("sm_clock_mhz", _SM_CLOCK, "MHz"),
    ("temperature_c", _TEMPERATURE, "C"),
)


class _Slow(Exception):
    """The chunk is not plain: the row parser reads it."""


def _fast_block(state: _State, data: bytes, count: int) -> SampleBlock | None:
    """The chunk parsed vectorised, or None (and no state changed) to leave it to the
    row parser."""
    try:
        return _fast(state, data, count)
    except _Slow:
        return None


def _fast(state: _State, data: bytes, count: int) -> SampleBlock:
    layout = state.layout
    reader = state.reader
    if len(layout.uuid) > 1 or len(layout.pci) > 1 or len(layout.name) > 1:
        raise _Slow
    if len(layout.throttle) > 1 or len(layout.temperature) > 1:
        raise _Slow
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
        if b"\r" in data:
            raise _Slow
    if not data.isascii():
        raise _Slow
    body = b"\n" + data
    header = state.header
    if header is not None:
        line = b"\n" + header + b"\n"
        while line in body:
            body = body.replace(line, b"\n")
    while b"\n\n" in body:
        body = body.replace(b"\n\n", b"\n")
    body = body[1:]
    if not body:
        raise _Slow
    if len(body.translate(None, _UNPLAIN_BYTES)) != len(body):
        raise _Slow
    buf = np.frombuffer(body, np.uint8)
    ends = np.flatnonzero(buf == 10)
    n = len(ends)
    k = len(layout.names)
    commas: npt.NDArray[Any] = np.flatnonzero(buf == 44)
    if len(commas) != n * (k - 1):
        raise _Slow
    commas = commas.reshape(n, k - 1)
    if (
        k > 1
        and not (np.searchsorted(ends, commas[:, 0]) == np.searchsorted(ends, commas[:, -1])).all()
    ):
        raise _Slow
    if k > 1 and (commas[1:, 0] < ends[:-1]).any():
        raise _Slow
    starts = np.empty(n, np.intp)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    # cell j spans [cell_start[:, j], cell_end[:, j]): after ", " or ",", up to "," or "\n"
    cell_start = np.empty((n, k), np.intp)
    cell_end = np.empty((n, k), np.intp)
    cell_start[:, 0] = starts
    if k > 1:
        after = commas + 1
        cell_start[:, 1:] = after + (buf[after] == 32)
        cell_end[:, :-1] = commas
    cell_end[:, -1] = ends
    # empty cells, and cells with spaces the one after each comma does not explain
    if (cell_end <= cell_start).any() or (buf[cell_start] == 32).any():
        raise _Slow
    if (buf[cell_end - 1] == 32).any():
        raise _Slow

    numeric_columns: dict[int, str] = {}
    for _, names, unit in _NUMERIC:
        for name in names:
            column = layout.names.index(name) if name in layout.names else None
            if column is not None and column not in numeric_columns:
                numeric_columns[column] = unit
    text_columns = sorted(
        {
            c
            for c in (*layout.uuid, *layout.pci, *layout.name, *layout.throttle)
            if c not in numeric_columns
        }
        | ({layout.index} if layout.index is not None else set())
    )
    if layout.timestamp in numeric_columns or layout.timestamp in text_columns:
        raise _Slow
    values: dict[int, npt.NDArray[np.float64]] = {
        column: _fast_numbers(buf, cell_start[:, column], cell_end[:, column], unit=unit)
        for column, unit in numeric_columns.items()
    }
    util = values[layout.util]
    if (util > 100).any():
        raise _Slow
    ts_ms = _fast_timestamps(
        reader.clock, buf, cell_start[:, layout.timestamp], cell_end[:, layout.timestamp]
    )
    # GPU facts: one record per distinct combination of the identity cells
    key_columns = [*text_columns]
    throttle = layout.throttle[0] if layout.throttle else None
    id_columns = [c for c in key_columns if c != throttle]
    keys = [_cell_bytes(buf, cell_start[:, c], cell_end[:, c]) for c in id_columns]
    if layout.memory_total:
        keys.append(values[layout.memory_total[0]].view(np.uint8).reshape(n, 8))
    if keys:
        groups, firsts = _first_seen(np.hstack(keys) if len(keys) > 1 else keys[0])
    else:
        groups = np.zeros(n, np.intp)
        firsts = np.zeros(1, np.intp)
    row_lines: list[int] | None = None
    records: list[GpuRecord] = []
    cards = dict(reader._cards)
    lines_before = None if reader.gpu_lines is None else dict(reader.gpu_lines)
    try:
        for first_row in firsts.tolist():
            cells = [""] * k
            for c in text_columns:
                cells[c] = body[cell_start[first_row, c] : cell_end[first_row, c]].decode()
            total = values[layout.memory_total[0]][first_row] if layout.memory_total else math.nan
            index = _index(cells, layout.index)
            uuid, index = _identity(cells, layout, index, node=reader.node)
            model = _first_text(cells, layout.name)
            fact = (uuid, index, model, None if math.isnan(total) else float(total))
            record = reader._records.get(fact)
            if record is None:
                if row_lines is None:
                    row_lines = _data_lines(data, header, start=state.line_no + 1)
                    if len(row_lines) != n:
                        raise _Slow
                reader._check_card(uuid, index, model, line=row_lines[first_row], layout=layout)
                record = reader._record(fact)
            records.append(record)
    except (_BadCell, _Slow):
        reader._cards = cards
        if reader.gpu_lines is not None and lines_before is not None:
            reader.gpu_lines.clear()
            reader.gpu_lines.update(lines_before)
        raise _Slow from None
    columns: dict[str, npt.NDArray[Any]] = {}
    for sample_name, names, _ in _NUMERIC:
        present = [layout.names.index(n) for n in names if n in layout.names]
        if not present:
            continue
        value = values[present[0]].copy()
        for column in present[1:]:
            value = np.where(np.isnan(value), values[column], value)
        columns[sample_name] = value
    if throttle is not None:
        matrix = _cell_bytes(buf, cell_start[:, throttle], cell_end[:, throttle])
        texts, inverse = np.unique(matrix.view(f"S{matrix.shape[1]}").ravel(), return_inverse=True)
        reasons: list[str | None] = []
        for cell in (t.decode() for t in texts.tolist()):
            if _is_missing(cell):
                reasons.append(None)
            elif _HEX.fullmatch(cell):
                reasons.append(cell)
            else:
                raise _Slow
        columns["throttle_reasons"] = np.array(reasons, dtype=object)[inverse.ravel()]
    latest = int(ts_ms.max())
    if reader.clock.latest_ms is None or latest > reader.clock.latest_ms:
        reader.clock.latest_ms = latest
    return SampleBlock(records, groups.astype(np.intp), ts_ms, columns)


def _fast_numbers(
    buf: npt.NDArray[np.uint8],
    start: npt.NDArray[np.intp],
    end: npt.NDArray[np.intp],
    *,
    unit: str,
) -> npt.NDArray[np.float64]:
    """The values of number cells (`38 %`, `28.16 W`, `575`), NaN for a missing reading
    (`[...]`, `N/A`); `_Slow` for any other form: a sign, an exponent, more than 15
    digits. The value is the digits as an integer over a power of ten, both exact, so
    the division rounds as `float()` of the text does."""
    first = buf[start]
    last = len(buf) - 1
    missing = ((first == 91) & (buf[end - 1] == 93)) | (
        (end - start == 3)
        & (first == 78)
        & (buf[np.minimum(start + 1, last)] == 47)
        & (buf[np.minimum(start + 2, last)] == 65)
    )
    token = np.frombuffer(b" " + unit.encode(), np.uint8)
    at = end[:, None] - len(token) + np.arange(len(token))
    has_unit = (buf[at] == token).all(axis=1) & (end - len(token) > start)
    end = np.where(has_unit & ~missing, end - len(token), end)
    width = np.where(missing, 0, end - start)
    widest = int(width.max())
    if widest > 16:
        raise _Slow
    if widest == 0:
        return np.full(len(start), np.nan)
    # right-aligned: positions before the cell are leading zeros, which change nothing
    at = end[:, None] - widest + np.arange(widest)
    pad = at < (end - width)[:, None]
    chars = np.where(pad, 48, buf[np.maximum(at, 0)])
    is_dot = chars == 46
    digit = chars.astype(np.int64) - 48
    is_digit = (digit >= 0) & (digit <= 9)
    if not (is_digit | is_dot).all():
        raise _Slow
    dots = is_dot.sum(axis=1)
    digits = (is_digit & ~pad).sum(axis=1)
    if (dots > 1).any() or ((digits == 0) & ~missing).any() or (digits > 15).any():
        raise _Slow
    right = widest - 1 - np.arange(widest)  # places to the right of each position
    dot_at = np.where(dots > 0, widest - 1 - np.argmax(is_dot, axis=1), -1)
    decimals = np.maximum(dot_at, 0)
    places = right[None, :] - ((right[None, :] > dot_at[:, None]) & (dot_at >= 0)[:, None])
    mantissa = (np.where(is_dot, 0, digit) * 10**places).sum(axis=1)
    value: npt.NDArray[np.float64] = mantissa / (10.0**decimals)
    value[missing] = np.nan
    return value


def _cell_bytes(
    buf: npt.NDArray[np.uint8], start: npt.NDArray[np.intp], end: npt.NDArray[np.intp]
) -> npt.NDArray[np.uint8]:
    """The cells as rows of bytes, NUL-padded to the widest (a plain chunk has no NUL)."""
    width = end - start
    widest = int(width.max())
    at = np.arange(widest)
    if (width == widest).all():
        same: npt.NDArray[np.uint8] = buf[start[:, None] + at]
        return same
    inside = at < width[:, None]
    matrix: npt.NDArray[np.uint8] = np.where(
        inside, buf[np.where(inside, start[:, None] + at, 0)], 0
    )
    return matrix.astype(np.uint8)


def _first_seen(keys: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The group of each row of `keys` (rows of bytes), numbered in order of first
    appearance, and the first row of each group."""
    rows = np.ascontiguousarray(keys).view(np.dtype((np.void, keys.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.intp)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()], first[order]


def _data_lines(data: bytes, header: bytes | None, *, start: int) -> list[int]:
    """The file line of each data row of a plain chunk whose first line is `start`."""
    lines = data.split(b"\n")[:-1]
    return [start + i for i, line in enumerate(lines) if line and line != header]


def _fast_timestamps(
    clock: _LocalClock,
    buf: npt.NDArray[np.uint8],
    start: npt.NDArray[np.intp],
    end: npt.NDArray[np.intp],
) -> npt.NDArray[np.int64]:
    """Epoch ms UTC of `YYYY/MM/DD HH:MM:SS.mmm` cells, each minute's offset worked out
    once; `_Slow` for any other form, a time outside the clock's bounds, or a minute that
    is skipped or repeated by a change of the clocks (the row parser reads those)."""
    if ((end - start) != _TS_WIDTH).any():
        raise _Slow
    chars = buf[start[:, None] + np.arange(_TS_WIDTH)]
    if not (chars[:, _TS_SEPARATORS] == _TS_SEPARATOR_BYTES).all():
        raise _Slow
    d = chars[:, _TS_DIGITS].astype(np.int64) - 48
    if ((d < 0) | (d > 9)).any():
        raise _Slow
    year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
    key = year * 100_000_000 + (d[:, 4] * 10 + d[:, 5]) * 1_000_000
    key += (d[:, 6] * 10 + d[:, 7]) * 10_000 + (d[:, 8] * 10 + d[:, 9]) * 100
    key += d[:, 10] * 10 + d[:, 11]
    seconds = d[:, 12] * 10 + d[:, 13]
    if (seconds > 59).any():
        raise _Slow
    millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
    minutes, inverse = np.unique(key, return_inverse=True)
    utc_minute = np.empty(len(minutes), np.int64)
    for i, minute_key in enumerate(minutes.tolist()):
        offsets = clock.offsets(minute_key)
        if offsets is None:
            raise _Slow
        utc_minute[i] = offsets
    utc: npt.NDArray[np.int64] = utc_minute[inverse] + seconds * 1000 + millis
    if utc.min() < EARLIEST_MS or (
        clock.not_after_ms is not None and utc.max() > clock.not_after_ms
    ):
        raise _Slow
    return utc
