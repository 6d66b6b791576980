"""Read `kubectl get pods|nodes -o json` files, and `--watch` streams, into records.

One reader takes every shape kubectl writes (`auditor.collect.kubectl_shapes` walks them),
in constant memory:

- a list, `{"kind": "List" | "PodList" | "NodeList", "items": [...]}` (`kubectl get pods -A
  -o json`, `kubectl get pods,nodes -o json`); its items are decoded one at a time, never
  the whole document;
- a single Pod or Node (`kubectl get pod NAME -o json`);
- a stream of JSON objects back to back: watch events
  `{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR", "object": {...}}`
  (`--watch --output-watch-events`), or bare objects (`--watch` alone).

Every pod object is one observation (a `PodRecord`): the store merges observations of one
UID. Every Node object is a `nodes` row (`auditor.collect.nodes.node_row`) seen at
`node_ms`. Pods that request no GPU are dropped, BOOKMARK events and unknown event types
skipped. An ERROR
event (the API's `410 Gone` Status), text that is not JSON, JSON that is not pods or nodes, and a
field that cannot be read all raise `InputError` naming the file, the line and the field
(`items[3].metadata.uid`). A field's line is the line of its bad value where that value
can be found in the pod's text, else the line where the pod begins.

This module owns the tokenising: the decoder is the standard library's, applied to one
value at a time over a sliding window of the text, which is how it knows line numbers;
CRLF files read the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from auditor.collect.kubectl_shapes import MAPPING, Found, KubectlRecord, read_records, value_type
from auditor.errors import InputError, PodFieldError, shown
from auditor.model import PodRecord
from auditor.settings import Sharing, TeamRules

__all__ = ["CHUNK_CHARS", "KubectlRecord", "json_type", "read_kubectl_json", "read_kubectl_pods"]

CHUNK_CHARS = 1 << 20
"""How much text one read takes; the window holds about this much plus one pod."""
Where = tuple[int, int]
"""Where an object's text is in the window: its start and end."""


def read_kubectl_json(
    path: Path,
    *,
    teams: TeamRules,
    node_ms: int,
    on_progress: Callable[[int], None] | None = None,
    chunk_chars: int = CHUNK_CHARS,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    """Every GPU pod observation and every node in the file at `path`, in file order.

    Nodes are rows seen at `node_ms`. `on_progress` is called with the number of bytes read
    so far, after each read (a progress bar's total is the file's size). `chunk_chars` is
    how much one read takes. Raises `InputError` at once when the file does not exist, and
    while iterating for bad content.
    """

    def tokens(stream: TextIO, name: str, position: Callable[[], int]) -> _Tokens:
        window = _Window(
            stream,
            name=name,
            on_progress=on_progress,
            position=position,
            chunk_chars=max(1, chunk_chars),
        )
        return _Tokens(window, name=name)

    return read_records(path, tokens=tokens, teams=teams, node_ms=node_ms, sharing=sharing)


def read_kubectl_pods(
    path: Path,
    *,
    teams: TeamRules,
    on_progress: Callable[[int], None] | None = None,
    chunk_chars: int = CHUNK_CHARS,
) -> Iterator[PodRecord]:
    """The GPU pod observations of a JSON file, leaving out its nodes."""
    records = read_kubectl_json(
        path, teams=teams, node_ms=0, on_progress=on_progress, chunk_chars=chunk_chars
    )
    return (r for r in records if isinstance(r, PodRecord))


# ---------------------------------------------------------------------------------------------
# the tokens of the shapes


class _Tokens:
    """The JSON values of a text window, as the walk of kubectl's shapes takes them: one
    top-level object at a time, its keys one by one, a list's items one at a time."""

    format = "json"
    sequence = "an array"

    def __init__(self, text: _Window, *, name: str) -> None:
        self.name = name
        self.text = text
        self._first = True
        """Whether the next key is the mapping's first (no comma before it)."""

    def documents(self) -> Iterator[tuple[int, object]]:
        text = self.text
        while (c := text.peek()) != "":
            line = text.line_at(text.pos)
            yield line, (MAPPING if c == "{" else text.value())

    def open_mapping(self, head: dict[str, Any]) -> None:
        self.text.anchor = self.text.pos
        self.text.expect("{")
        self._first = True

    def key(self) -> str | None:
        text = self.text
        if self._first:
            self._first = False
            if text.peek() == "}":
                text.expect("}")
                return None
        elif text.peek() == ",":
            text.expect(",")
        else:
            text.expect("}")
            return None
        key = text.value()
        if not isinstance(key, str):
            raise text.error("not valid JSON: expected a property name in double quotes")
        text.expect(":")
        return key

    def at_sequence(self) -> bool:
        return self.text.peek() == "["

    def value(self, key: str) -> Any:
        return self.text.value()

    def items(self) -> Iterator[tuple[Any, int, Where]]:
        text = self.text
        text.anchor = None  # items can be far apart: let the window slide
        text.expect("[")
        if text.peek() == "]":
            text.expect("]")
            return
        while True:
            item = text.value()
            start = text.last_start
            yield item, text.line_at(start), (start, text.pos)
            if text.peek() == ",":
                text.expect(",")
                continue
            text.expect("]")
            return

    def close_mapping(self) -> Where:
        start, end = self.text.anchor, self.text.pos
        self.text.anchor = None
        return (end if start is None else start), end  # only a streamed list lets go of it

    def reached(self) -> None:
        pass  # the window tells the progress as it reads

    def field_error(self, found: Found[Where], e: PodFieldError) -> InputError:
        start, end = found.where
        line = self.text.line_of_value(e.value, start, end) or found.line
        return self.text.error(e.message, line=line, field=found.field_path(e.field))


def json_type(value: object) -> str:
    """What a JSON value is, as a message names it."""
    return value_type(value, sequence="an array")


# ---------------------------------------------------------------------------------------------
# the text window


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_MAYBE_CUT = 16
"""A decoding error this close to the end of the window may be a value cut by the read."""


class _Window:
    """A sliding window onto a text stream that decodes one JSON value at a time and knows
    each position's line. Memory stays at one read plus the value being decoded."""

    def __init__(
        self,
        stream: TextIO,
        *,
        name: str,
        on_progress: Callable[[int], None] | None,
        position: Callable[[], int],
        chunk_chars: int = CHUNK_CHARS,
    ) -> None:
        self._chunk_chars = chunk_chars
        self._stream = stream
        self._name = name
        self._on_progress = on_progress
        self._position = position
        self._decoder = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.last_start = 0
        """Where the value that `value()` decoded last begins."""
        self.anchor: int | None = None
        """While set, the window keeps the text from here on (the current top object)."""
        self._mark = 0
        self._mark_line = 1
        self._first_column = 1
        """Column of `buf[0]`, when the window was cut in the middle of a line."""

    # reading

    def _fill(self) -> None:
        keep = self.pos if self.anchor is None else min(self.pos, self.anchor)
        if keep > 0:
            self._first_column = self.column_at(keep)
            self._mark_line = self.line_at(keep)
            self._mark = 0
            self.buf = self.buf[keep:]
            self.pos -= keep
            if self.anchor is not None:
                self.anchor -= keep
        try:
            chunk = self._stream.read(max(self._chunk_chars, len(self.buf)))
        except UnicodeDecodeError as e:
            raise InputError(
                f"not UTF-8 text: {e.reason}", file=self._name, line=self.line_at(len(self.buf))
            ) from e
        if not chunk:
            self.eof = True
        self.buf += chunk
        if self._on_progress is not None:
            self._on_progress(self._position())

    def peek(self) -> str:
        """The next character that is not whitespace, or "" at the end of the text."""
        while True:
            m = _WHITESPACE.match(self.buf, self.pos)
            assert m is not None
            self.pos = m.end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._fill()

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            got = repr(found) if found else "the end of the file"
            raise self.error(f"not valid JSON: expected {char!r}, found {got}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the JSON value at the current position and move past it."""
        self.peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                cut = e.pos >= len(self.buf) - _MAYBE_CUT or e.msg.startswith("Unterminated")
                if cut and not self.eof:
                    self._fill()
                    continue
                raise self.error(f"not valid JSON: {e.msg}", at=e.pos) from e
            except RecursionError as e:
                raise self.error("not a pod file: JSON nested too deeply") from e
            except ValueError as e:  # an integer of more digits than Python converts
                raise self.error(f"not valid JSON: {shown(str(e), 60)}") from e
            if end == len(self.buf) and not self.eof:
                self._fill()  # a number may go on in the next read
                continue
            self.last_start, self.pos = self.pos, end
            return value

    # positions

    def line_at(self, index: int) -> int:
        """The 1-based line of `buf[index]`."""
        if index >= self._mark:
            self._mark_line += self.buf.count("\n", self._mark, index)
            self._mark = index
            return self._mark_line
        return self._mark_line - self.buf.count("\n", index, self._mark)

    def column_at(self, index: int) -> int:
        newline = self.buf.rfind("\n", 0, index)
        if newline < 0:
            return self._first_column + index
        return index - newline

    def line_of_value(self, value: object, start: int, end: int) -> int | None:
        """The line of the first occurrence of `value`, as JSON, in `buf[start:end]`."""
        if value is None or not 0 <= start < end <= len(self.buf):
            return None
        needle = json.dumps(value, ensure_ascii=False)
        found = self.buf.find(needle, start, end)
        return self.line_at(found) if found >= 0 else None

    def error(
        self,
        message: str,
        *,
        line: int | None = None,
        at: int | None = None,
        field: str | None = None,
    ) -> InputError:
        """An `InputError` at `line`, else at `buf[at]` (default: the current position)."""
        if line is None:
            index = self.pos if at is None else at
            line = self.line_at(index)
            message = f"{message} (column {self.column_at(index)})"
        return InputError(message, file=self._name, line=line, field=field)
