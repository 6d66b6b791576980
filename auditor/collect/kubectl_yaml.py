"""Read `kubectl get pods|nodes -o yaml` files, manifests and `--watch -o yaml` streams.

The same shapes as the JSON reader (`auditor.collect.kubectl_shapes` walks them for both),
in YAML documents separated by `---`: a `kind: List` (what `kubectl get pods -o yaml`
writes), one Pod or Node per document (`kubectl get pod a b -o yaml`, hand-written
manifests, a `--watch -o yaml` stream), or watch events (`--output-watch-events`). The
records are those the JSON reader gives for the same objects.

This module owns the tokenising: the text is read as a stream of parser events (libyaml's,
through PyYAML, when installed), never composed into a whole document: a list's items are
built one at a time, so memory stays at one item. A YAML file can be hostile in ways JSON
cannot, and each is refused with one line naming the file and the line:

- aliases (`*name`, the "billion laughs"): kubectl never writes them, so none is expanded;
  merge keys (`<<`) and tags other than YAML's own scalar, sequence and mapping tags too;
- an object of more than `MAX_NODES` values, or nested deeper than `MAX_DEPTH`;
- a key that is not a string (`1: x`, `on: x`, `[a]: x`).

YAML's implicit types are JSON's where they agree (unquoted `true`, `12`, `1e3`, `null`);
an unquoted timestamp stays the text it was, as in JSON. A value where a string belongs
that YAML read as a boolean or a number (`team: yes`, `version: 1.10`) is refused like
the JSON equivalent, naming the field, with a hint to quote it. A field error inside an
object names the field's own line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml  # type: ignore[import-untyped]

from auditor.collect.kubectl_shapes import MAPPING, Found, KubectlRecord, read_records, value_type
from auditor.errors import InputError, PodFieldError, shown
from auditor.settings import Sharing, TeamRules

Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (about ten times faster), else Python's."""

MAX_NODES = 200_000
"""Values in one object (a pod, a node, a watch event, or the head of a list). A pod is a
few hundred; a hand-written manifest a few thousand."""
MAX_DEPTH = 64
"""Nesting of mappings and sequences; a pod nests about ten deep."""

_TAG = "tag:yaml.org,2002:"
_COLLECTION_TAGS = frozenset({None, "!", _TAG + "map", _TAG + "seq"})
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
_INDEX = re.compile(r"\[(\d+)\]\.?")


def read_kubectl_yaml(
    path: Path,
    *,
    teams: TeamRules,
    node_ms: int,
    on_progress: Callable[[int], None] | None = None,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    """Every GPU pod observation and every node in the YAML file at `path`, in file order.

    Nodes are rows seen at `node_ms`. `on_progress` is called with the bytes read so far
    after each object. Raises `InputError` at once when the file does not exist, and while
    iterating for bad content.
    """

    def tokens(stream: TextIO, name: str, position: Callable[[], int]) -> _Tokens:
        return _Tokens(_Events(stream, name=name), on_progress=on_progress, position=position)

    return read_records(path, tokens=tokens, teams=teams, node_ms=node_ms, sharing=sharing)


# ---------------------------------------------------------------------------------------------
# the tokens of the shapes


@dataclass(slots=True)
class _Built:
    """A value built from events, with the line of each mapping key and sequence item (by
    the container's id) and the text of plain scalars YAML did not read as strings."""

    value: Any = None
    lines: dict[int, dict[object, int]] = field(default_factory=dict)
    plain: dict[tuple[int, object], str] = field(default_factory=dict)


class _Tokens:
    """The documents of a YAML event stream, as the walk of kubectl's shapes takes them:
    one top-level mapping at a time, its keys one by one, a list's items one at a time,
    each value built with the line of every key and item (`_Built`)."""

    format = "yaml"
    sequence = "a sequence"

    def __init__(
        self,
        events: _Events,
        *,
        on_progress: Callable[[int], None] | None,
        position: Callable[[], int],
    ) -> None:
        self.name = events.name
        self.events = events
        self._on_progress = on_progress
        self._position = position
        self._head: dict[str, Any] = {}
        self._built = _Built(self._head)
        self._counter = _Counter(events)
        self._key_line = 1

    def documents(self) -> Iterator[tuple[int, object]]:
        """Every document's first line and value; an empty one (a stray `---`) is skipped."""
        events = self.events
        events.expect(yaml.StreamStartEvent)
        while not isinstance(events.peek(), yaml.StreamEndEvent):
            events.expect(yaml.DocumentStartEvent)
            first = events.peek()
            line = events.line(first)
            if isinstance(first, yaml.MappingStartEvent):
                yield line, MAPPING
            else:
                built = _build(events)
                if built.value is not None:
                    yield line, built.value
            events.expect(yaml.DocumentEndEvent)
        events.expect(yaml.StreamEndEvent)

    def open_mapping(self, head: dict[str, Any]) -> None:
        self.events.expect(yaml.MappingStartEvent)
        self._head = head
        self._built = _Built(head)
        self._counter = _Counter(self.events)

    def key(self) -> str | None:
        event = self.events.peek()
        if isinstance(event, yaml.MappingEndEvent):
            return None
        self._key_line = self.events.line(event)
        return _key(self.events, prefix="")

    def at_sequence(self) -> bool:
        return isinstance(self.events.peek(), yaml.SequenceStartEvent)

    def value(self, key: str) -> Any:
        value = _value(self.events, self._built, self._counter, depth=1)
        self._built.lines.setdefault(id(self._head), {})[key] = self._key_line
        return value

    def items(self) -> Iterator[tuple[Any, int, _Built]]:
        events = self.events
        events.expect(yaml.SequenceStartEvent)
        while not isinstance(events.peek(), yaml.SequenceEndEvent):
            line = events.line(events.peek())
            built = _Built()
            built.value = _value(events, built, _Counter(events), depth=2)
            yield built.value, line, built
        events.expect(yaml.SequenceEndEvent)

    def close_mapping(self) -> _Built:
        self.events.expect(yaml.MappingEndEvent)
        return self._built

    def reached(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self._position())

    def field_error(self, found: Found[_Built], e: PodFieldError) -> InputError:
        """The error at the field's line where it can be found, with a hint when YAML read
        an unquoted value as a boolean or a number."""
        line, plain = _locate(found.where, found.obj, e.field or "")
        message = e.message
        if plain is not None and isinstance(e.value, bool | int | float):
            message += (
                f" (YAML reads the unquoted {shown(plain, 30)} as {_yaml_type(e.value)}: quote it)"
            )
        return self.events.error(message, line=line or found.line, field=found.field_path(e.field))


def _cut(text: object, limit: int) -> str:
    """Parser text for a message: one line, at most `limit` characters."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _yaml_type(value: object) -> str:
    return value_type(value, sequence="a sequence")


# ---------------------------------------------------------------------------------------------
# building values from events


class _Counter:
    """Counts the values of one object against `MAX_NODES`."""

    def __init__(self, events: _Events) -> None:
        self.events = events
        self.left = MAX_NODES

    def take(self, event: yaml.Event) -> None:
        self.left -= 1
        if self.left < 0:
            raise self.events.error(
                f"an object of more than {MAX_NODES} values: not a kubectl object",
                line=self.events.line(event),
            )


def _build(events: _Events) -> _Built:
    built = _Built()
    built.value = _value(events, built, _Counter(events), depth=1)
    return built


def _value(events: _Events, built: _Built, counter: _Counter, *, depth: int) -> Any:
    """The value whose events start here, built without recursion on the Python stack."""
    event = events.next()
    counter.take(event)
    if isinstance(event, yaml.ScalarEvent):
        return _scalar(events, event)[0]
    root, _ = _start_collection(events, event, depth)
    stack: list[tuple[Any, object]] = [(root, None)]
    while stack:
        container, _ = stack[-1]
        if isinstance(container, dict):
            if isinstance(events.peek(), yaml.MappingEndEvent):
                events.next()
                stack.pop()
                continue
            key_line = events.line(events.peek())
            slot: object = _key(events, prefix=None)
            built.lines.setdefault(id(container), {})[slot] = key_line
        else:
            if isinstance(events.peek(), yaml.SequenceEndEvent):
                events.next()
                stack.pop()
                continue
            slot = len(container)
            built.lines.setdefault(id(container), {})[slot] = events.line(events.peek())
        event = events.next()
        counter.take(event)
        if isinstance(event, yaml.ScalarEvent):
            value, plain = _scalar(events, event)
            if plain is not None:
                built.plain[(id(container), slot)] = plain
        else:
            value, _ = _start_collection(events, event, depth + len(stack))
            stack.append((value, slot))
        if isinstance(container, dict):
            container[slot] = value
        else:
            container.append(value)
    return root


def _start_collection(events: _Events, event: yaml.Event, depth: int) -> tuple[Any, None]:
    if isinstance(event, yaml.AliasEvent):
        raise events.error(
            f"YAML aliases (*{_cut(event.anchor, 40)}) are not accepted: kubectl never writes "
            "them, and expanding them can take any amount of memory",
            line=events.line(event),
        )
    if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
        if event.tag not in _COLLECTION_TAGS:
            raise events.error(
                f"the YAML tag {shown(event.tag, 60)} is not accepted", line=events.line(event)
            )
        if depth > MAX_DEPTH:
            raise events.error(
                f"nested more than {MAX_DEPTH} deep: not a kubectl object", line=events.line(event)
            )
        return ({} if isinstance(event, yaml.MappingStartEvent) else []), None
    raise events.error(  # pragma: no cover - the parser only gives these inside a document
        f"unexpected {type(event).__name__}", line=events.line(event)
    )


def _scalar(events: _Events, event: yaml.ScalarEvent) -> tuple[Any, str | None]:
    """A scalar's value, and its text when it was plain and YAML did not read a string."""
    tag = event.tag
    plain = bool(event.implicit[0]) and tag in (None, "!")
    if tag is None or tag == "!":
        tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
    if tag == _TAG + "str" or tag == _TAG + "timestamp":
        return event.value, None
    node = yaml.ScalarNode(tag, event.value)
    try:
        if tag == _TAG + "null":
            value: Any = None
        elif tag == _TAG + "bool":
            value = _CONSTRUCTOR.construct_yaml_bool(node)
        elif tag == _TAG + "int":
            value = _CONSTRUCTOR.construct_yaml_int(node)
        elif tag == _TAG + "float":
            value = _CONSTRUCTOR.construct_yaml_float(node)
        elif tag == _TAG + "merge":
            raise events.error("YAML merge keys (<<) are not accepted", line=events.line(event))
        else:
            raise events.error(
                f"the YAML tag {shown(tag, 60)} is not accepted", line=events.line(event)
            )
    except ValueError as e:  # an explicit !!int of text that is not one
        raise events.error(f"not a YAML {tag.removeprefix(_TAG)}: {shown(str(e), 60)}") from e
    return value, (event.value if plain else None)


def _key(events: _Events, *, prefix: str | None) -> str:
    """A mapping key: a scalar that YAML reads as a string."""
    event = events.next()
    if not isinstance(event, yaml.ScalarEvent):
        raise events.error("a key must be a string, got a sequence or mapping")
    value, plain = _scalar(events, event)
    if not isinstance(value, str):
        text = shown(plain if plain is not None else value, 40)
        raise events.error(
            f"a key must be a string: YAML reads the unquoted key {text} as "
            f"{_yaml_type(value)}; quote it",
            line=events.line(event),
            field=prefix or None,
        )
    return value


# ---------------------------------------------------------------------------------------------
# the event stream


class _Events:
    """PyYAML's parser events with one of look-ahead; parser errors become `InputError`."""

    def __init__(self, stream: TextIO, *, name: str) -> None:
        self.name = name
        self._parser = Loader(stream)
        self._last_line = 1

    def peek(self) -> yaml.Event:
        try:
            event = self._parser.peek_event()
        except yaml.YAMLError as e:
            raise self._parse_error(e) from e
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text: {e.reason}", file=self.name) from e
        if event is None:  # pragma: no cover - the parser ends with StreamEndEvent
            raise self.error("not valid YAML: the text ends early")
        self._last_line = self.line(event)
        return event

    def next(self) -> yaml.Event:
        event = self.peek()
        self._parser.get_event()
        return event

    def expect(self, kind: type[yaml.Event]) -> yaml.Event:
        event = self.next()
        if not isinstance(event, kind):  # pragma: no cover - the parser keeps the grammar
            raise self.error(f"not valid YAML: unexpected {type(event).__name__}")
        return event

    def line(self, event: yaml.Event) -> int:
        mark = event.start_mark
        return int(mark.line) + 1 if mark is not None else self._last_line

    def error(
        self, message: str, *, line: int | None = None, field: str | None = None
    ) -> InputError:
        return InputError(
            message, file=self.name, line=self._last_line if line is None else line, field=field
        )

    def _char_at(self, mark: Any) -> str:
        """The character at a parser mark, read again from the file (errors only)."""
        if mark is None:
            return ""
        try:
            with open(self.name, encoding="utf-8-sig", errors="replace") as f:
                for i, text in enumerate(f):
                    if i == mark.line:
                        return text[mark.column : mark.column + 1]
        except OSError:
            return ""
        return ""

    def _parse_error(self, e: yaml.YAMLError) -> InputError:
        if isinstance(e, yaml.MarkedYAMLError):
            problem = str(e.problem or e.context or "bad syntax")
            mark = e.problem_mark or e.context_mark
            line = int(mark.line) + 1 if mark is not None else self._last_line
            if "\t" in problem or self._char_at(mark) == "\t":
                problem = "a tab character where YAML allows only spaces (indent with spaces)"
            elif e.context and e.problem:
                problem = f"{problem} ({e.context})"
            return InputError(f"not valid YAML: {_cut(problem, 160)}", file=self.name, line=line)
        if isinstance(e, yaml.reader.ReaderError):
            return InputError(
                f"not valid YAML: {_cut(e.reason, 80)} (character #x{e.character:04x})"
                if isinstance(e.character, int)
                else f"not valid YAML: {_cut(e.reason, 80)}",
                file=self.name,
            )
        return InputError(f"not valid YAML: {_cut(e, 160)}", file=self.name)


# ---------------------------------------------------------------------------------------------
# where a field is


def _locate(built: _Built, obj: Any, path: str) -> tuple[int | None, str | None]:
    """The line of the value at `path` (`metadata.labels.a.b/c`, `spec.containers[0].name`)
    inside `obj`, or of the deepest part of it found, and the plain text of that value."""
    line: int | None = None
    plain: str | None = None
    cur, rest = obj, path
    while rest:
        if isinstance(cur, list):
            m = _INDEX.match(rest)
            if m is None or int(m.group(1)) >= len(cur):
                break
            slot: object = int(m.group(1))
            rest = rest[m.end() :]
        elif isinstance(cur, dict):
            keys = [
                k
                for k in cur
                if isinstance(k, str) and (rest == k or rest.startswith((k + ".", k + "[")))
            ]
            if not keys:
                break
            slot = max(keys, key=len)
            rest = rest[len(str(slot)) :].removeprefix(".")
        else:
            break
        line = built.lines.get(id(cur), {}).get(slot, line)
        plain = built.plain.get((id(cur), slot)) if not rest else None
        cur = cur[slot]
    return line, plain
