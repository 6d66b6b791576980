"""The fast path: a chunk of plain lines parsed vectorised, column by column, with numpy.

Plain lines are those nvidia-smi writes: ASCII, one space after each comma, units where the
header says, timestamps `YYYY/MM/DD HH:MM:SS.mmm`, the header repeated as it was. Anything
else, a bad cell included, makes `fast_block` give the chunk up (`Slow`), with the book of
cards as it was, for the row parser to read from the same state: it gives the same values
or the one-line error with its line and field. The layout, clock and book of cards are
the caller's, given as arguments.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.collect.nvidia_smi.blocks import SampleBlock
from auditor.collect.nvidia_smi.cells import HEX, BadCell, first_text, gpu_index, is_missing
from auditor.collect.nvidia_smi.clock import EARLIEST_MS, LocalClock
from auditor.collect.nvidia_smi.layout import MEMORY_TOTAL, POWER, SM_CLOCK, TEMPERATURE, Layout
from auditor.collect.nvidia_smi.rows import Cards, identity
from auditor.model import GpuRecord

_TS_WIDTH = 23
"""`YYYY/MM/DD HH:MM:SS.mmm`, the only timestamp form the fast path reads."""
_TS_DIGITS = np.array([i for i in range(_TS_WIDTH) if i not in (4, 7, 10, 13, 16, 19)])
_TS_SEPARATORS = np.array([4, 7, 10, 13, 16, 19])
_TS_SEPARATOR_BYTES = np.frombuffer(b"// ::.", np.uint8)
_NUMERIC: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("util", ("utilization.gpu",), "%"),
    ("memory_used_mib", ("memory.used",), "MiB"),
    ("memory_total_mib", MEMORY_TOTAL, "MiB"),
    ("power_w", POWER, "W"),
    ("sm_clock_mhz", SM_CLOCK, "MHz"),
    ("temperature_c", TEMPERATURE, "C"),
)


class Slow(Exception):
    """The chunk is not plain: the row parser reads it."""


def fast_block(
    data: bytes,
    *,
    layout: Layout,
    header: bytes | None,
    first_line: int,
    clock: LocalClock,
    cards: Cards,
) -> SampleBlock:
    """The complete lines `data`, whose first is file line `first_line`, parsed vectorised
    under `layout`, with the header line `header` (as the file writes it) skipped where it
    is repeated; `Slow`, with `clock` and `cards` as they were, to leave them to the row
    parser."""
    if len(layout.uuid) > 1 or len(layout.pci) > 1 or len(layout.name) > 1:
        raise Slow
    if len(layout.throttle) > 1 or len(layout.temperature) > 1:
        raise Slow
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
        if b"\r" in data:
            raise Slow
    if not data.isascii():
        raise Slow
    body = data
    buf = np.frombuffer(body, np.uint8)
    ends = np.flatnonzero(buf == 10)
    blank = len(ends) > 0 and (ends[0] == 0 or bool((np.diff(ends) == 1).any()))
    if blank or (header is not None and header in body):  # (`in` is slow for b"\n\n")
        body = b"\n" + body  # copies of the 1 MiB chunk only where there is a line to drop
        if header is not None:
            line = b"\n" + header + b"\n"
            while line in body:
                body = body.replace(line, b"\n")
        while b"\n\n" in body:
            body = body.replace(b"\n\n", b"\n")
        body = body[1:]
        buf = np.frombuffer(body, np.uint8)
        ends = np.flatnonzero(buf == 10)
    if not body:
        raise Slow
    if b'"' in body or b"\x7f" in body:  # quotes and controls are the row parser's
        raise Slow
    n = len(ends)
    if np.count_nonzero(buf < 32) != n:  # a control byte other than the newlines: a tab
        raise Slow
    k = len(layout.names)
    commas: npt.NDArray[Any] = np.flatnonzero(buf == 44)
    if len(commas) != n * (k - 1):
        raise Slow
    commas = commas.reshape(n, k - 1)
    if (
        k > 1
        and not (np.searchsorted(ends, commas[:, 0]) == np.searchsorted(ends, commas[:, -1])).all()
    ):
        raise Slow
    if k > 1 and (commas[1:, 0] < ends[:-1]).any():
        raise Slow
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
        raise Slow
    if (buf[cell_end - 1] == 32).any():
        raise Slow

    starts_of = np.ascontiguousarray(cell_start.T)  # column by column: each one contiguous,
    ends_of = np.ascontiguousarray(cell_end.T)  # which a column's gathers are 3x faster for
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
        raise Slow
    values: dict[int, npt.NDArray[np.float64]] = {
        column: _fast_numbers(buf, starts_of[column], ends_of[column], unit=unit)
        for column, unit in numeric_columns.items()
    }
    util = values[layout.util]
    if (util > 100).any():
        raise Slow
    columns = _coalesced(values, layout)
    if (
        "memory_total_mib" in columns
        and (columns["memory_used_mib"] > columns["memory_total_mib"]).any()
    ):  # NaN compares False: a missing reading is no contradiction
        raise Slow
    ts_ms = _fast_timestamps(clock, buf, starts_of[layout.timestamp], ends_of[layout.timestamp])
    # GPU facts: one record per distinct combination of the identity cells
    key_columns = [*text_columns]
    throttle = layout.throttle[0] if layout.throttle else None
    id_columns = [c for c in key_columns if c != throttle]
    totals = [values[layout.memory_total[0]]] if layout.memory_total else []
    spans = [(starts_of[c], ends_of[c]) for c in id_columns]
    seen = _first_seen_words(buf, spans, totals)
    if seen is not None:
        groups, firsts = seen
    elif spans or totals:
        keys = [_cell_bytes(buf, start, end) for start, end in spans]
        keys += [t.view(np.uint8).reshape(n, 8) for t in totals]
        groups, firsts = _first_seen(np.hstack(keys) if len(keys) > 1 else keys[0])
    else:
        groups = np.zeros(n, np.intp)
        firsts = np.zeros(1, np.intp)
    row_lines: list[int] | None = None
    records: list[GpuRecord] = []
    checkpoint = cards.checkpoint()
    try:
        for first_row in firsts.tolist():
            cells = [""] * k
            for c in text_columns:
                cells[c] = body[cell_start[first_row, c] : cell_end[first_row, c]].decode()
            total = values[layout.memory_total[0]][first_row] if layout.memory_total else math.nan
            index = gpu_index(cells, layout.index)
            uuid, index = identity(cells, layout, index, node=cards.node)
            model = first_text(cells, layout.name)
            fact = (uuid, index, model, None if math.isnan(total) else float(total))
            record = cards.known(fact)
            if record is None:
                if row_lines is None:
                    row_lines = _data_lines(data, header, start=first_line)
                    if len(row_lines) != n:
                        raise Slow
                record = cards.admit(fact, line=row_lines[first_row], layout=layout)
            records.append(record)
    except (BadCell, Slow):
        cards.roll_back(checkpoint)
        raise Slow from None
    if throttle is not None:
        matrix = _cell_bytes(buf, starts_of[throttle], ends_of[throttle])
        texts, inverse = np.unique(matrix.view(f"S{matrix.shape[1]}").ravel(), return_inverse=True)
        reasons: list[str | None] = []
        for cell in (t.decode() for t in texts.tolist()):
            if is_missing(cell):
                reasons.append(None)
            elif HEX.fullmatch(cell):
                reasons.append(cell)
            else:
                raise Slow
        columns["throttle_reasons"] = np.array(reasons, dtype=object)[inverse.ravel()]
    latest = int(ts_ms.max())
    if clock.latest_ms is None or latest > clock.latest_ms:
        clock.latest_ms = latest
    return SampleBlock(records, groups.astype(np.intp), ts_ms, columns)


def _coalesced(
    values: dict[int, npt.NDArray[np.float64]], layout: Layout
) -> dict[str, npt.NDArray[Any]]:
    """Each sample field of `_NUMERIC` the layout has, from its first column with a reading
    in each row (as the row parser's `first_number`)."""
    columns: dict[str, npt.NDArray[Any]] = {}
    for sample_name, names, _ in _NUMERIC:
        present = [layout.names.index(n) for n in names if n in layout.names]
        if not present:
            continue
        value = values[present[0]].copy()
        for column in present[1:]:
            value = np.where(np.isnan(value), values[column], value)
        columns[sample_name] = value
    return columns


def _fast_numbers(
    buf: npt.NDArray[np.uint8],
    start: npt.NDArray[np.intp],
    end: npt.NDArray[np.intp],
    *,
    unit: str,
) -> npt.NDArray[np.float64]:
    """The values of number cells (`38 %`, `28.16 W`, `575`), NaN for a missing reading
    (`[...]`, `N/A`); `Slow` for any other form: a sign, an exponent, more than 15
    digits. The value is the digits as an integer over a power of ten, both exact, so
    the division rounds as `float()` of the text does."""
    first = buf[start]
    last = len(buf) - 1
    if ((first == 91) | (first == 78)).any():  # some cell starts as [N/A] or N/A does
        missing = ((first == 91) & (buf[end - 1] == 93)) | (
            (end - start == 3)
            & (first == 78)
            & (buf[np.minimum(start + 1, last)] == 47)
            & (buf[np.minimum(start + 2, last)] == 65)
        )
    else:
        missing = np.zeros(len(start), np.bool_)
    token = b" " + unit.encode()
    has_unit = end - len(token) > start
    for i, byte in enumerate(token):  # byte by byte: a reduction along rows of 3 is slow
        has_unit &= buf[np.maximum(end - len(token) + i, 0)] == byte
    end = np.where(has_unit & ~missing, end - len(token), end)
    width = np.where(missing, 0, end - start)
    widest = int(width.max())
    if widest > 16:
        raise Slow
    if widest == 0:
        return np.full(len(start), np.nan)
    if widest <= 8 and len(buf) >= 8:
        return _short_numbers(buf, end, width, missing)
    # right-aligned, one row per place (each place's characters contiguous): places
    # before the cell are leading zeros, which change nothing
    at = end[None, :] - widest + np.arange(widest)[:, None]
    pad = at < (end - width)[None, :]
    chars = buf[np.maximum(at, 0)]
    chars[pad] = 48
    digit = chars - np.uint8(48)  # below '0' wraps past 9
    is_digit = digit <= 9
    is_dot = chars == 46
    if not (is_digit | is_dot).all():
        raise Slow
    dots = is_dot.sum(axis=0)
    digits = width - dots  # every character of a cell is a digit or a dot
    if (dots > 1).any() or ((digits == 0) & ~missing).any() or (digits > 15).any():
        raise Slow
    dot_at = np.where(dots > 0, widest - 1 - np.argmax(is_dot, axis=0), -1)
    decimals = np.maximum(dot_at, 0)
    mantissa = np.zeros(len(start), np.int64)
    for j in range(widest):  # the digits left to right, the dot skipped: one pass a place
        mantissa = np.where(is_digit[j], mantissa * 10 + digit[j], mantissa)
    value: npt.NDArray[np.float64] = mantissa / (10.0**decimals)
    value[missing] = np.nan
    return value


_WORD = np.uint64
_ZERO_CHARS = _WORD(0x3030303030303030)
_LOW_SEVEN_BITS = _WORD(0x7F7F7F7F7F7F7F7F)
_HIGH_NIBBLES = _WORD(0xF0F0F0F0F0F0F0F0)
_KEEP = np.array([0] + [2**64 - 2 ** (8 * (8 - w)) for w in range(1, 9)], np.uint64)
"""Per cell width 0 to 8, the bytes of a word that a cell ending at its top byte spans."""
_FILL = ~_KEEP & _ZERO_CHARS
"""Per cell width, a '0' in each byte of the word below the cell: leading zeros."""
_BELOW = np.array([2 ** (8 * p) - 1 for p in range(9)], np.uint64)
"""Per byte 0 to 8, the bytes of a word below it."""
_POWERS_OF_TEN = 10.0 ** np.arange(8)
"""10.0**k as the general path computes it, for k decimals."""


def _short_numbers(
    buf: npt.NDArray[np.uint8],
    end: npt.NDArray[np.intp],
    width: npt.NDArray[np.intp],
    missing: npt.NDArray[np.bool_],
) -> npt.NDArray[np.float64]:
    """`_fast_numbers` of cells `[end - width, end)` of at most 8 bytes (and a buffer of 8
    or more), eight bytes at a time: each cell is read as one little-endian word ending at
    its last byte, the bytes before it made leading '0's, its dot taken out, its digits
    checked and summed in a few word operations (as fast_float's eight-digit parse). The
    value is the same integer over the same power of ten as the general path's."""
    n = len(end)
    words: npt.NDArray[np.uint64] = np.ndarray((len(buf) - 7,), "<u8", buffer=buf, strides=(1,))
    at = end - 8
    word = words[np.maximum(at, 0)].astype(np.uint64)
    early = at < 0  # a cell within the buffer's first 8 bytes: its word starts at 0
    if early.any():
        word[early] <<= (8 * -at[early]).astype(np.uint64)
    x = (word & _KEEP[width]) | _FILL[width]
    dots = x ^ _WORD(0x2E2E2E2E2E2E2E2E)  # a zero byte where x has a '.'
    dot = ~(((dots & _LOW_SEVEN_BITS) + _LOW_SEVEN_BITS) | dots | _LOW_SEVEN_BITS)
    dot[missing] = 0  # 0x80 in the byte of each '.', exactly: no carry crosses a byte
    if (dot & (dot - _WORD(1))).any():
        raise Slow  # two dots
    dotted = dot != 0
    if (dotted & (width == 1)).any():
        raise Slow  # a dot without digits
    decimals = np.zeros(n, np.intp)
    if dotted.any():  # the bytes below the dot move up one: the digits without it
        place = ((dot >> _WORD(7)) * _WORD(0x0001020304050607) >> _WORD(56)).astype(np.intp)
        below = _BELOW[place]  # place: the dot's byte (its 0x01 times bytes 7, 6... 0)
        x = np.where(dotted, (x & ~_BELOW[place + 1]) | ((x & below) << _WORD(8)) | _WORD(0x30), x)
        decimals = np.where(dotted, 7 - place, 0)
    digits = (x & _HIGH_NIBBLES) | (((x + _WORD(0x0606060606060606)) & _HIGH_NIBBLES) >> _WORD(4))
    if (digits != _WORD(0x3333333333333333))[~missing].any():
        raise Slow  # a byte that is no digit
    x -= _ZERO_CHARS
    x = x * _WORD(10) + (x >> _WORD(8))
    x = (
        (x & _WORD(0x000000FF000000FF)) * _WORD(100 + (1_000_000 << 32))
        + ((x >> _WORD(16)) & _WORD(0x000000FF000000FF)) * _WORD(1 + (10_000 << 32))
    ) >> _WORD(32)
    mantissa = (x & _WORD(0xFFFFFFFF)).astype(np.int64)
    value: npt.NDArray[np.float64] = mantissa / _POWERS_OF_TEN[decimals]
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


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _first_seen_words(
    buf: npt.NDArray[np.uint8],
    spans: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]],
    numbers: list[npt.NDArray[np.float64]],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """`_first_seen` of the rows' cells `spans` and `numbers`, without sorting rows of bytes:
    each cell is read as 8-byte words (bytes past its end zeroed, its width a word too),
    the words of a row hashed to one, the hashes grouped, and every row's words compared
    with its group's first row's, so a collision of hashes gives None (and the caller the
    exact `_first_seen`), never a wrong group. None too for a cell within 8 bytes of the
    buffer's end, or when there is nothing to group."""
    if not spans and not numbers:
        return None
    last = len(buf) - 8
    if last < 0:
        return None
    words: npt.NDArray[np.uint64] = np.ndarray((last + 1,), "<u8", buffer=buf, strides=(1,))
    key: list[npt.NDArray[np.uint64]] = []
    for start, end in spans:
        width = end - start
        key.append(width.astype(np.uint64))
        for k in range(0, int(width.max()), 8):
            if int(start.max()) + k > last:
                return None
            key.append(words[start + k] & _BELOW[np.clip(width - k, 0, 8)])
    key += [t.view(np.uint64) for t in numbers]
    mixed = np.zeros(len(key[0]), np.uint64)
    for word in key:
        mixed = (mixed ^ word) * _MIX
        mixed ^= mixed >> np.uint64(29)
    _, first, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    leader = first[inverse]
    if not all(bool((word == word[leader]).all()) for word in key):
        return None  # two different rows of one hash
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.intp)
    rank[order] = np.arange(len(order))
    return rank[inverse], first[order]


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
    clock: LocalClock,
    buf: npt.NDArray[np.uint8],
    start: npt.NDArray[np.intp],
    end: npt.NDArray[np.intp],
) -> npt.NDArray[np.int64]:
    """Epoch ms UTC of `YYYY/MM/DD HH:MM:SS.mmm` cells, each minute's offset worked out
    once; `Slow` for any other form, a time outside the clock's bounds, or a minute that
    is skipped or repeated by a change of the clocks (the row parser reads those)."""
    if ((end - start) != _TS_WIDTH).any():
        raise Slow
    chars = buf[start[:, None] + np.arange(_TS_WIDTH)]
    if not (chars[:, _TS_SEPARATORS] == _TS_SEPARATOR_BYTES).all():
        raise Slow
    d = chars[:, _TS_DIGITS].astype(np.int64) - 48
    if ((d < 0) | (d > 9)).any():
        raise Slow
    year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
    key = year * 100_000_000 + (d[:, 4] * 10 + d[:, 5]) * 1_000_000
    key += (d[:, 6] * 10 + d[:, 7]) * 10_000 + (d[:, 8] * 10 + d[:, 9]) * 100
    key += d[:, 10] * 10 + d[:, 11]
    seconds = d[:, 12] * 10 + d[:, 13]
    if (seconds > 59).any():
        raise Slow
    millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
    minutes, inverse = np.unique(key, return_inverse=True)
    utc_minute = np.empty(len(minutes), np.int64)
    for i, minute_key in enumerate(minutes.tolist()):
        offsets = clock.offsets(minute_key)
        if offsets is None:
            raise Slow
        utc_minute[i] = offsets
    utc: npt.NDArray[np.int64] = utc_minute[inverse] + seconds * 1000 + millis
    if utc.min() < EARLIEST_MS or (
        clock.not_after_ms is not None and utc.max() > clock.not_after_ms
    ):
        raise Slow
    return utc
