"""One cell of an nvidia-smi CSV line: what a missing reading is, and how numbers, GPU
indexes, text and bitmasks are read from cells, with the error a bad cell raises.

`BadCell` is the error of one cell (or of a whole line) without its file and line: the
reader adds those. Nothing here knows the header or the clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from auditor.errors import shown

HEX = re.compile(r"0[xX][0-9A-Fa-f]+")
"""A bitmask cell (`clocks_event_reasons.active`): `0x0000000000000001`."""


class BadCell(Exception):
    """A cell (or line) that does not parse; the caller adds the file and line.

    `column` is the cell's position, -1 for a fault of the whole line; `field` names the
    field where the column alone does not.
    """

    def __init__(self, column: int, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.column = column
        self.message = message
        self.field = field


def is_missing(cell: str) -> bool:
    """A reading the driver could not make: `[N/A]`, `[Not Supported]`, `[Unknown Error]`..."""
    return (cell.startswith("[") and cell.endswith("]")) or cell == "N/A"


def gpu_index(cells: Sequence[str], column: int | None) -> int | None:
    """The GPU index in `column` (none without one, or for a missing reading)."""
    if column is None:
        return None
    cell = cells[column]
    if is_missing(cell):
        return None
    if not (cell.isascii() and cell.isdigit()):
        raise BadCell(column, f"expected a GPU index like 0, found {shown(cell)}")
    if len(cell) > 6:  # int() of a 10,000-digit cell raises; no node has a million GPUs
        raise BadCell(column, f"GPU index out of range: {shown(cell)}")
    return int(cell)


def number(cells: Sequence[str], column: int, *, unit: str) -> float | None:
    """A number with or without its unit (`38 %` or `38`); `None` for a missing reading."""
    cell = cells[column]
    text = cell[: -len(unit)].rstrip() if cell.endswith(unit) else cell
    try:
        value = float(text)
    except ValueError:
        if is_missing(cell):
            return None
        if not cell:
            raise BadCell(
                column, "empty value (nvidia-smi writes [N/A] for a missing reading)"
            ) from None
        raise BadCell(column, f"expected a number in {unit}, found {shown(cell)}") from None
    if not math.isfinite(value) or "_" in text:
        raise BadCell(column, f"expected a number in {unit}, found {shown(cell)}")
    return value


def first_number(cells: Sequence[str], columns: tuple[int, ...], *, unit: str) -> float | None:
    """The first reading among equivalent columns (`power.draw`, `power.draw.instant`...)."""
    for column in columns:
        value = number(cells, column, unit=unit)
        if value is not None:
            if value < 0:
                raise BadCell(column, f"negative value {shown(cells[column])}")
            return value
    return None


def first_text(cells: Sequence[str], columns: tuple[int, ...]) -> str | None:
    """The first cell among equivalent columns that is neither empty nor missing."""
    for column in columns:
        cell = cells[column]
        if cell and not is_missing(cell):
            return cell
    return None


def first_hex(cells: Sequence[str], columns: tuple[int, ...]) -> str | None:
    """The first bitmask among equivalent columns; `BadCell` for one that is not hex."""
    for column in columns:
        cell = cells[column]
        if is_missing(cell):
            continue
        if not HEX.fullmatch(cell):
            raise BadCell(
                column,
                f"expected a hexadecimal bitmask like 0x0000000000000001, found {shown(cell)}",
            )
        return cell
    return None
