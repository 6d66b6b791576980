"""The last guard before a write: does a row fit its table? One bad object, one clear error.

A value the database would refuse (an integer out of the column's range, text longer than
its `VARCHAR`, a NUL or a lone surrogate, a wrong type) fails the whole statement and the
transaction with it; in the watcher that was one pod stopping every write after it. So the
writers check each row against the schema first (`check_row`), and a failure names the
object and the column. The readers fit what they can beforehand (`auditor.limits`); what
reaches this guard is refused for that one object.

The checks follow the column types of `auditor.store.schema`, so a new column is checked
the day it is added.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, Table, Text

from auditor import limits
from auditor.errors import InputError

MAX_JSON_DEPTH = 64


class RowError(InputError):
    """A row that does not fit its table; `field` is `table.column`."""


def check_row(table: Table, row: Mapping[str, Any], *, what: str) -> None:
    """Raise `RowError` naming `what` (the object, e.g. `pod ml/a`) and the first column of
    `row` whose value the database would refuse."""
    for name, value in row.items():
        column = table.c.get(name)
        if column is None:
            continue
        problem = _problem(column.type, value, nullable=bool(column.nullable))
        if problem is not None:
            raise RowError(f"{what}: {problem}", field=f"{table.name}.{name}")


def is_data_error(error: BaseException | None) -> bool:
    """Did the database refuse a write for its data (a value, a constraint), rather than
    fail itself (down, locked, full)? Writing the other rows alone would then succeed.
    Deliberately narrow: a wrong answer here drops data, so a bare ValueError (a bug, a bad
    URL) is not one; OverflowError and UnicodeError are what the drivers raise for a value
    they cannot bind."""
    import sqlite3

    import psycopg
    from sqlalchemy.exc import DataError, IntegrityError

    return isinstance(
        error,
        DataError
        | IntegrityError
        | sqlite3.DataError
        | sqlite3.IntegrityError
        | psycopg.DataError
        | psycopg.IntegrityError  # the bulk path writes through the driver itself
        | InputError
        | OverflowError
        | UnicodeError,
    )


def _problem(ctype: Any, value: Any, *, nullable: bool) -> str | None:
    if value is None:
        return None if nullable else "missing"
    if isinstance(ctype, Boolean):
        return None if isinstance(value, bool) else f"must be true or false, got {_kind(value)}"
    if isinstance(ctype, Integer):  # BigInteger is an Integer
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_kind(value)}"
        low, high = (
            (limits.INT64_MIN, limits.INT64_MAX)
            if isinstance(ctype, BigInteger)
            else (limits.INT32_MIN, limits.INT32_MAX)
        )
        if not low <= value <= high:
            return f"integer out of range ({_short(str(value))})"
        return None
    if isinstance(ctype, Float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {_kind(value)}"
        return None if math.isfinite(value) else f"must be finite, got {value}"
    if isinstance(ctype, String | Text):
        if not isinstance(value, str):
            return f"must be text, got {_kind(value)}"
        if not limits.is_clean(value):
            return "text holds a NUL or an unpaired surrogate"
        length = getattr(ctype, "length", None)
        if length is not None and len(value) > length:
            return f"longer than {length} characters ({len(value)})"
        return None
    if isinstance(ctype, JSON):
        return _json_problem(value, depth=0)
    return None


def _json_problem(value: Any, *, depth: int) -> str | None:
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return None if limits.is_clean(value) else "text holds a NUL or an unpaired surrogate"
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str) or not limits.is_clean(k):
                return "a key is not clean text"
            found = _json_problem(v, depth=depth + 1)
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for v in value:
            found = _json_problem(v, depth=depth + 1)
            if found:
                return found
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "a number is not finite"
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if limits.INT64_MIN <= value <= limits.INT64_MAX else "an integer is too large"
    return f"cannot be stored as JSON: {_kind(value)}"


def _kind(value: Any) -> str:
    return type(value).__name__


def _short(text: str, keep: int = 24) -> str:
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text)} characters)"
