"""A seeded mutator for the fuzz tests: real input files, damaged the ways files get damaged.

`mutations(data, rng, hostile)` returns one damaged copy of `data`: a byte flipped, a slice
cut or doubled, the file cut short, a hostile token put in place of a value or anywhere.
The same seed gives the same cases, so a failure can be replayed by its case number.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from random import Random

JSON_HOSTILE: tuple[bytes, ...] = (
    b"{}",
    b"[]",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"1" * 5000,
    b"100000000000000000000000",
    b'"99999999999999999999"',
    b'"1' + b"0" * 23 + b'"',
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b'"a\\u0000b"',
    b'"' + b"x" * 20_000 + b'"',
    b'"=HYPERLINK(\\"http://x\\")"',
    b'"\\u001b]0;pwned\\u0007"',
    b'{"a":',
    b"[" * 50_000 + b"]" * 50_000,
    b'{"kind": {}, "items": []}',
    b'{"kind": "Pod"}',
    b'{"type": "ERROR", "object": {"code": 410}}',
    b'{"type": {}, "object": {}}',
    b'"2026-02-30T00:00:00Z"',
    b'"1970-01-01T00:00:00Z"',
    b'"9999-12-31T23:59:59Z"',
    b"\xff\xfe",
    b"\xed\xa0\x80",
)

CSV_HOSTILE: tuple[bytes, ...] = (
    b"",
    b"[N/A]",
    b"[Not Supported]",
    b"-1 %",
    b"150 %",
    b"1e999",
    b"nan",
    b"inf",
    b"-0",
    b"\x00",
    b"\x1b[2J",
    b"\xef\xbc\x99",
    b"9" * 10_000,
    b"0x-000000000000001",
    b"1970/01/01 00:00:00.000",
    b"2100/01/01 00:00:00.000",
    b"2026/02/30 00:00:00.000",
    b"2026/03/29 02:30:00.000",
    b",,,,",
    b'"',
    b"\r",
    b"\n",
    b"timestamp, index, utilization.gpu [%], memory.used [MiB]",
    b"GPU-" + b"a" * 300,
    b"\xff\xfe",
)

_JSON_VALUE = re.compile(rb':\s*("(?:[^"\\]|\\.)*"|-?\d[\d.eE+-]*|true|false|null)')
_CSV_CELL = re.compile(rb"(?<=[,\n])[^,\n]*")


def _flip(data: bytes, rng: Random, _hostile: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]


def _cut(data: bytes, rng: Random, _hostile: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randrange(1, 200))
    return data[:i] + data[j:]


def _double(data: bytes, rng: Random, _hostile: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randrange(1, 400))
    return data[:j] + data[i:j] + data[j:]


def _truncate(data: bytes, rng: Random, _hostile: Sequence[bytes]) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _insert(data: bytes, rng: Random, hostile: Sequence[bytes]) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.choice(hostile) + data[i:]


def _replace_value(data: bytes, rng: Random, hostile: Sequence[bytes]) -> bytes:
    """Put a hostile token in place of a JSON value or a CSV cell: the bad value reaches the
    field rules instead of stopping the parser."""
    pattern = _JSON_VALUE if data.lstrip()[:1] in (b"{", b"[") else _CSV_CELL
    found = list(pattern.finditer(data))
    if not found:
        return _insert(data, rng, hostile)
    m = rng.choice(found)
    group = 1 if pattern is _JSON_VALUE else 0
    return data[: m.start(group)] + rng.choice(hostile) + data[m.end(group) :]


MUTATORS: tuple[Callable[[bytes, Random, Sequence[bytes]], bytes], ...] = (
    _flip,
    _cut,
    _double,
    _truncate,
    _insert,
    _replace_value,
    _replace_value,
    _replace_value,
)


def mutate(data: bytes, rng: Random, hostile: Sequence[bytes]) -> bytes:
    """One to three mutations of `data`."""
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(MUTATORS)(data, rng, hostile)
    return data
