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
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from functools import cache
from importlib import resources
from pathlib import Path

from auditor.errors import InputError, shown
from auditor.model import GpuRecord, GpuSample

REQUIRED_FIELDS: tuple[str, ...] = ("timestamp", "index", "utilization.gpu", "memory.used")
"""Fields every file must have; also the columns, in order, of a file without a header."""

PROGRESS_EVERY_LINES = 10_000
"""How often, in lines, `on_progress` is told how many bytes have been read."""

_UUID = ("uuid", "gpu_uuid")
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
    index: int
    util: int
    memory_used: int
    uuid: tuple[int, ...]
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
            index=first["index"],
            util=first["utilization.gpu"],
            memory_used=first["memory.used"],
            uuid=find(_UUID),
            name=find(_NAME),
            memory_total=find(_MEMORY_TOTAL),
            power=find(_POWER),
            sm_clock=find(_SM_CLOCK),
            throttle=find(_THROTTLE),
            temperature=find(_TEMPERATURE),
        )


_DEFAULT_LAYOUT = _Layout.of(REQUIRED_FIELDS)


def _header_name(cell: str) -> str:
    """The field a header cell names, without its unit: `memory.used [MiB]` → `memory.used`."""
    return _UNIT_IN_HEADER.sub("", cell) if cell.endswith("]") else cell


def _is_header(cells: Sequence[str]) -> bool:
    if cells[0][:1].isdigit():
        return False  # field names start with a letter; a timestamp or index does not
    if _header_name(cells[0]) in known_fields():
        return True
    return any(_header_name(c) in REQUIRED_FIELDS for c in cells if c.startswith(REQUIRED_FIELDS))


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
                f"{', '.join(REQUIRED_FIELDS)} "
                "(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used "
                "--format=csv -l 5)",
                field=required,
            )
    return _Layout.of(names)


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
        index_cell = cells[layout.index]
        index: int | None = None
        if not _is_missing(index_cell):
            if not index_cell.isdigit():
                raise _BadCell(
                    layout.index, f"expected a GPU index like 0, found {shown(index_cell)}"
                )
            index = int(index_cell)
        util = _number(cells, layout.util, unit="%")
        if util is not None and not 0 <= util <= 100:
            raise _BadCell(
                layout.util, f"utilization must be 0-100 %, found {shown(cells[layout.util])}"
            )
        memory_total = _first_number(cells, layout.memory_total, unit="MiB")
        uuid = _first_text(cells, layout.uuid)
        if uuid is None:
            if index is None:
                raise _BadCell(layout.index, "no uuid and no index: cannot tell which GPU this is")
            uuid = f"{self.node}/{index}"
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
                layout.index,
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


def read_nvidia_smi(
    path: Path,
    *,
    node: str,
    tz: tzinfo = UTC,
    ignore_unknown_columns: bool = False,
    on_progress: Callable[[int], None] | None = None,
    gpu_lines: dict[str, int] | None = None,
    not_after_ms: int | None = None,
) -> Iterator[tuple[GpuRecord, GpuSample]]:
    """Yield one (GPU, sample) per data row of an nvidia-smi CSV log, streaming the file.

    `node` names the machine the log came from; a GPU without a `uuid` column is
    `NODE/index`. `tz` is the node's time zone (nvidia-smi writes local time without one).
    `on_progress` receives the number of bytes read so far every `PROGRESS_EVERY_LINES`
    lines and at the end. Duplicate rows are yielded as they come. `gpu_lines`, if given,
    is filled in with the line where each GPU first appears (for errors found later, such
    as the store's conflict check). One GPU UUID showing two indexes or two models is an
    error on the line of the second. A time before 2000 or after `not_after_ms` (the
    caller's "now", with a margin) is refused: a node whose clock was reset writes 1970, and
    one such sample would stretch every audit of all data over decades. So is a local time
    that does not exist in `tz` (the hour skipped in spring).

    Raises `InputError` naming the file, line and field for bad input, including a file that
    cannot be read or holds no sample. Being a generator, it opens the file and raises only
    as it is iterated: a caller that must not act on part of a bad file (an import is one
    transaction) consumes it inside that transaction.
    """
    file = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise InputError(f"cannot read the file: {e.strerror or e}", file=file) from e
    with raw:
        text = io.TextIOWrapper(raw, encoding=_encoding(raw), errors="replace", newline="")
        layout = _DEFAULT_LAYOUT
        reader = _Reader(node=node, tz=tz, gpu_lines=gpu_lines, not_after_ms=not_after_ms)
        samples = 0
        dropped: InputError | None = None
        line_no = 0
        for line in text:
            line_no += 1
            if "\ufffd" in line:
                raise InputError("not text: bytes that are not UTF-8", file=file, line=line_no)
            if on_progress is not None and line_no % PROGRESS_EVERY_LINES == 0:
                on_progress(raw.tell())
            complete = line.endswith(("\n", "\r"))
            body = line.rstrip("\r\n")
            if not body.strip():
                continue
            cells = [c.strip() for c in body.split(",")]
            try:
                if _is_header(cells):
                    if not complete:
                        continue  # a header cut short adds nothing
                    if [_header_name(c) for c in cells] != list(layout.names):
                        layout = _header_layout(cells, ignore_unknown=ignore_unknown_columns)
                    continue
                if len(cells) != len(layout.names):
                    if not complete and len(cells) < len(layout.names):
                        continue  # an interrupted last write
                    raise _cell_count_error(layout, len(cells))
                yield reader.sample(cells, layout, line=line_no)
                samples += 1
            except _BadCell as bad:
                field = bad.field
                if field is None and 0 <= bad.column < len(layout.names):
                    field = layout.names[bad.column]
                error = InputError(bad.message, file=file, line=line_no, field=field)
                if not complete and bad.column == len(layout.names) - 1:
                    dropped = error  # the last cell of an interrupted last write
                    continue
                raise error from None
        if on_progress is not None:
            on_progress(raw.tell())
    if samples == 0:
        if dropped is not None:
            raise dropped
        raise InputError("no samples: the file has no data rows", file=file)


def _cell_count_error(layout: _Layout, found: int) -> _BadCell:
    """A line with too few or too many cells, naming the first missing field if any."""
    expected = len(layout.names)
    message = f"expected {expected} cells as in the header, found {found}"
    if layout is _DEFAULT_LAYOUT:
        message = (
            f"expected {expected} cells, found {found}; without a header line the columns "
            f"must be {', '.join(REQUIRED_FIELDS)}"
        )
    missing = layout.names[found] if found < expected else None
    return _BadCell(-1, message, field=missing)
