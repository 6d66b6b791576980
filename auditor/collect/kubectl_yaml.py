"""Read `kubectl get pods|nodes -o yaml` files, manifests and `--watch -o yaml` streams.

The same shapes as the JSON reader (`auditor.collect.kubectl_json`), in YAML documents
separated by `---`: a `kind: List` (what `kubectl get pods -o yaml` writes), one Pod or Node
per document (`kubectl get pod a b -o yaml`, hand-written manifests, a `--watch -o yaml`
stream), or watch events (`--output-watch-events`). The records are those the JSON reader
gives for the same objects.

The text is read as a stream of parser events (libyaml's, through PyYAML, when installed),
never composed into a whole document: a list's items are built one at a time, so memory
stays at one item. A YAML file can be hostile in ways JSON cannot, and each is refused with
one line naming the file and the line:

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

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from auditor.collect.kubectl_json import (
    CHANGE_EVENTS,
    EXPECTED,
    LIST_KINDS,
    KubectlRecord,
    check_file,
    event_type,
    kind_of,
    object_kind,
    to_record,
    watch_error,
)
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
    name = check_file(path)
    return _records(
        path, name=name, teams=teams, node_ms=node_ms, on_progress=on_progress, sharing=sharing
    )


def _records(
    path: Path,
    *,
    name: str,
    teams: TeamRules,
    node_ms: int,
    on_progress: Callable[[int], None] | None,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    try:
        raw = path.open("rb")
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=name) from e
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None) as stream:
        events = _Events(stream, name=name)
        for found in _objects(events):
            if on_progress is not None:
                on_progress(raw.tell())
            try:
                record = to_record(
                    found.obj,
                    kind=found.kind,
                    teams=teams,
                    deleted=found.deleted,
                    node_ms=node_ms,
                    sharing=sharing,
                )
            except PodFieldError as e:
                raise _field_error(found, e, name=name) from e
            if record is not None:
                yield record


# ---------------------------------------------------------------------------------------------
# the shapes of kubectl output


@dataclass(slots=True)
class _Built:
    """A value built from events, with the line of each mapping key and sequence item (by
    the container's id) and the text of plain scalars YAML did not read as strings."""

    value: Any = None
    lines: dict[int, dict[object, int]] = field(default_factory=dict)
    plain: dict[tuple[int, object], str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Found:
    obj: dict[str, Any]
    kind: str
    prefix: str
    line: int
    built: _Built
    deleted: bool = False


def _objects(events: _Events) -> Iterator[_Found]:
    """The Pods and Nodes of every document, in order. A file without a document is refused,
    as the JSON reader refuses an empty file; an empty document (a stray `---`) is skipped."""
    documents = 0
    events.expect(yaml.StreamStartEvent)
    while not isinstance(events.peek(), yaml.StreamEndEvent):
        events.expect(yaml.DocumentStartEvent)
        first = events.peek()
        line = events.line(first)
        if isinstance(first, yaml.MappingStartEvent):
            documents += 1
            yield from _top_mapping(events, line)
        else:
            built = _build(events)
            if built.value is not None:
                got = _yaml_type(built.value)
                raise InputError(f"{EXPECTED}, got {got}", file=events.name, line=line)
        events.expect(yaml.DocumentEndEvent)
    events.expect(yaml.StreamEndEvent)
    if documents == 0:
        raise InputError(
            "the file is empty: expected the output of `kubectl get pods -A -o yaml`",
            file=events.name,
            line=1,
        )


def _top_mapping(events: _Events, line: int) -> Iterator[_Found]:
    """One document's mapping. A list's `items` are built and yielded one by one; anything
    else (a pod, a watch event, the list's own keys) is small and built whole."""
    events.expect(yaml.MappingStartEvent)
    head: dict[str, Any] = {}
    built = _Built(head)
    counter = _Counter(events)
    streamed = False
    while not isinstance(events.peek(), yaml.MappingEndEvent):
        key_line = events.line(events.peek())
        key = _key(events, prefix="")
        if key == "items" and not streamed and isinstance(events.peek(), yaml.SequenceStartEvent):
            kind = kind_of(head)
            if kind is not None and kind not in LIST_KINDS:
                raise events.error(f"{EXPECTED}, got kind={kind}", line=line, field="kind")
            streamed = True
            yield from _items(events)
            continue
        head[key] = _value(events, built, counter, depth=1)
        built.lines.setdefault(id(head), {})[key] = key_line
    events.expect(yaml.MappingEndEvent)
    kind = kind_of(head)
    if streamed or kind in LIST_KINDS or "items" in head:
        if kind is not None and kind not in LIST_KINDS:
            raise events.error(f"{EXPECTED}, got kind={kind}", line=line, field="kind")
        if head.get("items") is not None:
            raise events.error("must be a list", line=line, field="items")
        return
    if "type" in head and "object" in head:
        event = _watch_event(events, head, built, line=line)
        if event is not None:
            yield event
        return
    yield _as_object(events, head, built, prefix="", line=line)


def _items(events: _Events) -> Iterator[_Found]:
    events.expect(yaml.SequenceStartEvent)
    i = 0
    while not isinstance(events.peek(), yaml.SequenceEndEvent):
        line = events.line(events.peek())
        built = _Built()
        built.value = _value(events, built, _Counter(events), depth=2)
        yield _as_object(events, built.value, built, prefix=f"items[{i}]", line=line)
        i += 1
    events.expect(yaml.SequenceEndEvent)


def _watch_event(
    events: _Events, event: dict[str, Any], built: _Built, *, line: int
) -> _Found | None:
    kind = event_type(event)
    obj = event["object"]
    if kind == "ERROR":
        raise events.error(watch_error(obj), line=line, field="object")
    if kind not in CHANGE_EVENTS:
        return None  # BOOKMARK carries no object; unknown types are skipped, as the API asks
    found = _as_object(events, obj, built, prefix="object", line=line)
    return _Found(found.obj, found.kind, found.prefix, line, built, deleted=kind == "DELETED")


def _as_object(events: _Events, obj: object, built: _Built, *, prefix: str, line: int) -> _Found:
    if not isinstance(obj, dict):
        got = _yaml_type(obj)
        raise events.error(f"{EXPECTED}, got {got}", line=line, field=prefix or None)
    try:
        kind = object_kind(obj, prefix=prefix)
    except InputError as e:
        raise events.error(e.message, line=line, field=e.field) from None
    return _Found(obj, kind, prefix, line, built)


def _cut(text: object, limit: int) -> str:
    """Parser text for a message: one line, at most `limit` characters."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _yaml_type(value: object) -> str:
    if isinstance(value, list):
        return "a sequence"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


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

    def __init__(self, stream: io.TextIOWrapper, *, name: str) -> None:
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
# where a field error is


def _field_error(found: _Found, e: PodFieldError, *, name: str) -> InputError:
    """The error of a field inside an object, at the field's line where it can be found,
    with a hint when YAML read an unquoted value as a boolean or a number."""
    field_path = f"{found.prefix}.{e.field}" if found.prefix else e.field
    line, plain = _locate(found.built, found.obj, e.field or "")
    message = e.message
    if plain is not None and isinstance(e.value, bool | int | float):
        message += (
            f" (YAML reads the unquoted {shown(plain, 30)} as {_yaml_type(e.value)}: quote it)"
        )
    return InputError(message, file=name, line=line or found.line, field=field_path)


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
