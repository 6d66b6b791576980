"""Read `kubectl get pods|nodes -o json` files, and `--watch` streams, into records.

One reader takes every shape kubectl writes, in constant memory:

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

The decoder is the standard library's, applied to one value at a time over a sliding
window of the text, which is how it knows line numbers; CRLF files read the same.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from auditor.collect.nodes import node_row
from auditor.collect.pod_records import pod_record
from auditor.errors import InputError, PodFieldError, shown
from auditor.model import PodRecord
from auditor.settings import Sharing, TeamRules

LIST_KINDS = frozenset({"List", "PodList", "NodeList"})
OBJECT_KINDS = frozenset({"Pod", "Node"})
EXPECTED = "expected a Pod, a Node, a List of them or a watch event"
NodeRow = dict[str, Any]
KubectlRecord = PodRecord | NodeRow
"""What a kubectl file gives: a pod observation, or a `nodes` row."""
CHUNK_CHARS = 1 << 20
"""How much text one read takes; the window holds about this much plus one pod."""


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
    name = check_file(path)
    return _records(
        path,
        name=name,
        teams=teams,
        node_ms=node_ms,
        on_progress=on_progress,
        chunk_chars=max(1, chunk_chars),
        sharing=sharing,
    )


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


def check_file(path: Path) -> str:
    """The file's name for messages; `InputError` when it is missing or not a file."""
    name = str(path)
    if not path.exists():
        raise InputError("file does not exist", file=name)
    if not path.is_file():
        raise InputError("not a regular file", file=name)
    return name


def to_record(
    obj: dict[str, Any],
    *,
    kind: str,
    teams: TeamRules,
    deleted: bool,
    node_ms: int,
    sharing: Sharing | None = None,
) -> KubectlRecord | None:
    """The record of one Pod or Node object; `PodFieldError` for a field it cannot read."""
    if kind == "Node":
        return node_row(obj, at_ms=node_ms)
    return pod_record(obj, teams=teams, deleted=deleted, sharing=sharing)


def _records(
    path: Path,
    *,
    name: str,
    teams: TeamRules,
    node_ms: int,
    on_progress: Callable[[int], None] | None,
    chunk_chars: int,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    try:
        raw = path.open("rb")
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=name) from e
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None) as stream:
        text = _Window(
            stream, name=name, on_progress=on_progress, position=raw.tell, chunk_chars=chunk_chars
        )
        for found in _pod_objects(text):
            try:
                record = to_record(
                    found.pod,
                    kind=found.kind,
                    teams=teams,
                    deleted=found.deleted,
                    node_ms=node_ms,
                    sharing=sharing,
                )
            except PodFieldError as e:
                field = f"{found.prefix}.{e.field}" if found.prefix else e.field
                line = text.line_of_value(e.value, found.start, found.end) or found.line
                raise InputError(e.message, file=name, line=line, field=field) from e
            if record is not None:
                yield record


# ---------------------------------------------------------------------------------------------
# the shapes of kubectl output


@dataclass(frozen=True, slots=True)
class _Found:
    """A Pod or Node object found in the text, with where it is."""

    pod: dict[str, Any]
    prefix: str
    """Path from the document to the object: `items[3]`, `object`, or empty."""
    line: int
    start: int
    end: int
    deleted: bool = False
    kind: str = "Pod"


def _pod_objects(text: _Window) -> Iterator[_Found]:
    """The pods of every top-level value of the text, in order. An empty file is refused:
    it is what a failed `kubectl ... > file` leaves, not a cluster without pods (that is a
    List with no items)."""
    values = 0
    while (c := text.peek()) != "":
        line = text.line_at(text.pos)
        if c != "{":
            value = text.value()
            raise text.error(f"{EXPECTED}, got {json_type(value)}", line=line)
        values += 1
        yield from _top_object(text, line)
    if values == 0:
        raise text.error(
            "the file is empty: expected the output of `kubectl get pods -A -o json`", line=1
        )


def _top_object(text: _Window, line: int) -> Iterator[_Found]:
    """One top-level object. Its keys are decoded one by one so that a list's `items` can be
    streamed; anything else (a pod, a watch event) is small and kept whole."""
    text.anchor = text.pos
    head: dict[str, Any] = {}
    streamed = False
    text.expect("{")
    if text.peek() == "}":
        text.expect("}")
    else:
        while True:
            key = text.value()
            if not isinstance(key, str):
                raise text.error("not valid JSON: expected a property name in double quotes")
            text.expect(":")
            if key == "items" and not streamed and text.peek() == "[":
                kind = kind_of(head)
                if kind is not None and kind not in LIST_KINDS:
                    raise text.error(f"{EXPECTED}, got kind={kind}", line=line, field="kind")
                streamed = True
                text.anchor = None  # items can be far apart: let the window slide
                yield from _items(text)
            else:
                head[key] = text.value()
            if text.peek() == ",":
                text.expect(",")
                continue
            text.expect("}")
            break
    start, end = text.anchor, text.pos
    text.anchor = None
    kind = kind_of(head)
    if streamed or kind in LIST_KINDS or "items" in head:
        if kind is not None and kind not in LIST_KINDS:
            raise text.error(f"{EXPECTED}, got kind={kind}", line=line, field="kind")
        if head.get("items") is not None:
            raise text.error("must be a list", line=line, field="items")
        return
    if start is None:  # pragma: no cover - only a streamed list lets go of its start
        start = end
    if "type" in head and "object" in head:
        event = _watch_event(text, head, line=line, start=start, end=end)
        if event is not None:
            yield event
        return
    yield _as_pod(text, head, prefix="", line=line, start=start, end=end)


def _items(text: _Window) -> Iterator[_Found]:
    """The elements of a list's `items` array, decoded one at a time."""
    text.expect("[")
    if text.peek() == "]":
        text.expect("]")
        return
    i = 0
    while True:
        item = text.value()
        start = text.last_start
        line = text.line_at(start)
        yield _as_pod(text, item, prefix=f"items[{i}]", line=line, start=start, end=text.pos)
        i += 1
        if text.peek() == ",":
            text.expect(",")
            continue
        text.expect("]")
        return


def kind_of(obj: dict[str, Any]) -> str | None:
    """The `kind` of an object, shown as text when it is not a string (never unhashable)."""
    kind = obj.get("kind")
    if kind is None:
        return None
    return kind[:60] if isinstance(kind, str) else shown(kind)


def _watch_event(
    text: _Window, event: dict[str, Any], *, line: int, start: int, end: int
) -> _Found | None:
    kind = event_type(event)
    obj = event["object"]
    if kind == "ERROR":
        raise text.error(watch_error(obj), line=line, field="object")
    if kind not in CHANGE_EVENTS:
        return None  # BOOKMARK carries no pod; unknown types are skipped, as the API asks
    return _as_pod(
        text, obj, prefix="object", line=line, start=start, end=end, deleted=kind == "DELETED"
    )


def _as_pod(
    text: _Window,
    obj: object,
    *,
    prefix: str,
    line: int,
    start: int,
    end: int,
    deleted: bool = False,
) -> _Found:
    """`obj` if it is a Pod or a Node (`kind: Pod|Node`, or no kind but a pod spec: a raw
    API list's items)."""
    if not isinstance(obj, dict):
        raise text.error(f"{EXPECTED}, got {json_type(obj)}", line=line, field=prefix or None)
    try:
        kind = object_kind(obj, prefix=prefix)
    except InputError as e:
        raise text.error(e.message, line=line, field=e.field) from None
    return _Found(obj, prefix, line, start, end, deleted, kind)


CHANGE_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})
"""Watch event types that carry an object; BOOKMARK and unknown ones are skipped."""


def event_type(event: dict[str, Any]) -> str:
    """A watch event's `type`, shown as text when it is not a string."""
    kind = event["type"]
    return kind if isinstance(kind, str) else shown(kind)


def watch_error(obj: object) -> str:
    """The message for a watch stream's ERROR event (the API's Status, e.g. 410 Gone)."""
    status = obj if isinstance(obj, dict) else {}
    reason = " ".join(str(status[k])[:40] for k in ("code", "reason") if status.get(k))
    message = str(status.get("message") or "no message")[:160]
    return f"the watch stream reported an error: {reason + ': ' if reason else ''}{message}"


def object_kind(obj: dict[str, Any], *, prefix: str) -> str:
    """`Pod` or `Node`, else `InputError` (with only a message and a field) saying what it
    is. An object without a kind is a Pod when it has a pod spec."""
    field = f"{prefix}.kind" if prefix else "kind"
    kind = kind_of(obj)
    if kind is None:
        spec = obj.get("spec")
        if not (isinstance(spec, dict) and "containers" in spec):
            raise InputError(f"{EXPECTED}, got an object without a kind", field=field)
        return "Pod"
    if kind not in OBJECT_KINDS:
        raise InputError(f"{EXPECTED}, got kind={kind}", field=field)
    return kind


def json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


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
