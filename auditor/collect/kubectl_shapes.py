"""The shapes of kubectl output, walked once for the JSON and the YAML reader.

kubectl writes, in one file or stream of values (JSON) or documents (YAML):

- a list, `{"kind": "List" | "PodList" | "NodeList", "items": [...]}`, whose items are
  taken one at a time, never the whole list;
- a single Pod or Node (a Pod may have no `kind` when it has a pod spec: a raw API list's
  items); ResourceClaims and ResourceSlices (`kubectl get pods,resourceclaims,resourceslices
  -A -o json`, their own lists included) are read beside them;
- watch events `{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR",
  "object": {...}}`: BOOKMARK and unknown types are skipped; an ERROR with the API's
  `410 Gone` Status ends the watch (the events before it stand), any other ERROR is an
  error;
- several of these back to back.

`read_records` opens the file, walks these shapes (`objects`) over a tokeniser, and turns
each Pod or Node found into a record (`to_record`). The tokeniser (`Tokens`: the JSON
reader's stream decoder, the YAML reader's parser events) decodes the values and says
where they are: the line of each object, and its own record of positions (`Found.where`)
for the line of a field it cannot read. Everything else, the errors of each shape
included, is here, once.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TextIO, TypeVar

from auditor.collect import dra
from auditor.collect.nodes import node_row
from auditor.collect.pod_records import pod_record
from auditor.errors import InputError, PodFieldError, shown
from auditor.model import PodRecord
from auditor.settings import Sharing, TeamRules

LIST_KINDS = frozenset({"List", "PodList", "NodeList"}) | dra.LIST_KINDS
OBJECT_KINDS = frozenset({"Pod", "Node"}) | dra.CLAIM_KINDS | dra.SLICE_KINDS
CHANGE_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})
"""Watch event types that carry an object; BOOKMARK and unknown ones are skipped."""
EXPECTED = "expected a Pod, a Node, a List of them or a watch event"
NodeRow = dict[str, Any]
KubectlRecord = PodRecord | NodeRow | dra.DraClaim | dra.DraSlice
"""What a kubectl file gives: a pod observation, a `nodes` row, or a ResourceClaim or
ResourceSlice (Dynamic Resource Allocation, `auditor.collect.dra`)."""
MAPPING: Final = object()
"""What `Tokens.documents` gives for a top-level mapping, for the walk to take key by key."""

W = TypeVar("W")
"""What a tokeniser records of where an object is, to find a field's line in it."""


@dataclass(frozen=True, slots=True)
class Found(Generic[W]):
    """A Pod or Node object found in the text, with where it is."""

    obj: dict[str, Any]
    kind: str
    prefix: str
    """Path from the document to the object: `items[3]`, `object`, or empty."""
    line: int
    where: W
    deleted: bool = False

    def field_path(self, field: str | None) -> str | None:
        """A field of the object as a path from the document: `items[3].metadata.uid`."""
        return f"{self.prefix}.{field}" if self.prefix else field


class Tokens(Protocol[W]):
    """A reader's tokeniser: the values of a file, one top-level mapping at a time."""

    name: str
    """The file's name, for messages."""
    format: str
    """`json` or `yaml`, as `kubectl get pods -A -o FORMAT` writes it."""
    sequence: str
    """What a message calls a list: `an array` (JSON), `a sequence` (YAML)."""

    def documents(self) -> Iterator[tuple[int, object]]:
        """Each top-level value's line and either `MAPPING` (to be walked with the methods
        below before the next is asked for) or the value (not a mapping)."""
        ...

    def open_mapping(self, head: dict[str, Any]) -> None:
        """Enter the top-level mapping whose keys and values will be put in `head`."""
        ...

    def key(self) -> str | None:
        """The mapping's next key, or None at its end."""
        ...

    def at_sequence(self) -> bool:
        """Whether the value after the key just read is a sequence (an array)."""
        ...

    def value(self, key: str) -> Any:
        """The value of `key`, decoded whole."""
        ...

    def items(self) -> Iterator[tuple[Any, int, W]]:
        """The elements of the sequence after the key just read, one at a time, each with
        its line and where it is."""
        ...

    def close_mapping(self) -> W:
        """Leave the mapping; where it was."""
        ...

    def reached(self) -> None:
        """An object was found (the YAML reader tells its progress here)."""
        ...

    def field_error(self, found: Found[W], e: PodFieldError) -> InputError:
        """The error of a field of `found`, at the field's line where it can be found."""
        ...


def check_file(path: Path) -> str:
    """The file's name for messages; `InputError` when it is missing or not a file."""
    name = str(path)
    if not path.exists():
        raise InputError("file does not exist", file=name)
    if not path.is_file():
        raise InputError("not a regular file", file=name)
    return name


def read_records(
    path: Path,
    *,
    tokens: Callable[[TextIO, str, Callable[[], int]], Tokens[W]],
    teams: TeamRules,
    node_ms: int,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    """The records of every Pod and Node of the file at `path`, read by the tokeniser that
    `tokens` makes of its text, its name and its byte position. Raises `InputError` at
    once when the file does not exist, and while iterating for bad content."""
    name = check_file(path)
    return _records(path, name=name, tokens=tokens, teams=teams, node_ms=node_ms, sharing=sharing)


def _records(
    path: Path,
    *,
    name: str,
    tokens: Callable[[TextIO, str, Callable[[], int]], Tokens[W]],
    teams: TeamRules,
    node_ms: int,
    sharing: Sharing | None,
) -> Iterator[KubectlRecord]:
    try:
        raw = path.open("rb")
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=name) from e
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None) as stream:
        source = tokens(stream, name, raw.tell)
        for found in objects(source):
            source.reached()
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
                raise source.field_error(found, e) from e
            if record is not None:
                yield record


def to_record(
    obj: dict[str, Any],
    *,
    kind: str,
    teams: TeamRules,
    deleted: bool,
    node_ms: int,
    sharing: Sharing | None = None,
) -> KubectlRecord | None:
    """The record of one Pod, Node, ResourceClaim or ResourceSlice object; `PodFieldError`
    for a field it cannot read."""
    if kind == "Node":
        return node_row(obj, at_ms=node_ms, exact=False)
    if kind in dra.CLAIM_KINDS:
        return dra.read_claim(obj)
    if kind in dra.SLICE_KINDS:
        return dra.DraSlice(tuple(dra.read_slice(obj)))
    return pod_record(obj, teams=teams, deleted=deleted, sharing=sharing, seen_ms=node_ms)


def objects(tokens: Tokens[W]) -> Iterator[Found[W]]:
    """The Pods and Nodes of every top-level value, in order. A file without one is
    refused: it is what a failed `kubectl ... > file` leaves, not a cluster without pods
    (that is a List with no items)."""
    mappings = 0
    for line, value in tokens.documents():
        if value is not MAPPING:
            raise _error(tokens, f"{EXPECTED}, got {_type(tokens, value)}", line=line)
        mappings += 1
        yield from _mapping(tokens, line)
    if mappings == 0:
        raise _error(
            tokens,
            f"the file is empty: expected the output of `kubectl get pods -A -o {tokens.format}`",
            line=1,
        )


def _mapping(tokens: Tokens[W], line: int) -> Iterator[Found[W]]:
    """One top-level mapping. A list's `items` are taken one by one; anything else (a pod,
    a watch event, the list's own keys) is small and decoded whole."""
    head: dict[str, Any] = {}
    streamed = False
    tokens.open_mapping(head)
    while (key := tokens.key()) is not None:
        if key == "items" and not streamed and tokens.at_sequence():
            kind = kind_of(head)
            if kind is not None and kind not in LIST_KINDS:
                raise _error(tokens, f"{EXPECTED}, got kind={kind}", line=line, field="kind")
            streamed = True
            for i, (item, item_line, where) in enumerate(tokens.items()):
                yield _as_object(tokens, item, prefix=f"items[{i}]", line=item_line, where=where)
        else:
            head[key] = tokens.value(key)
    where = tokens.close_mapping()
    kind = kind_of(head)
    if streamed or kind in LIST_KINDS or "items" in head:
        if kind is not None and kind not in LIST_KINDS:
            raise _error(tokens, f"{EXPECTED}, got kind={kind}", line=line, field="kind")
        if head.get("items") is not None:
            raise _error(tokens, "must be a list", line=line, field="items")
        return
    if "type" in head and "object" in head:
        event = event_type(head)
        obj = head["object"]
        if event == "ERROR" and not _expired(obj):
            raise _error(tokens, watch_error(obj), line=line, field="object")
        if event == "ERROR":  # 410: the server ended the watch; what came before holds
            return
        if event in CHANGE_EVENTS:  # BOOKMARK carries no object; unknown types are skipped
            yield _as_object(
                tokens, obj, prefix="object", line=line, where=where, deleted=event == "DELETED"
            )
        return
    yield _as_object(tokens, head, prefix="", line=line, where=where)


def _as_object(
    tokens: Tokens[W], obj: object, *, prefix: str, line: int, where: W, deleted: bool = False
) -> Found[W]:
    """`obj` if it is a Pod or a Node (`kind: Pod|Node`, or no kind but a pod spec)."""
    if not isinstance(obj, dict):
        got = _type(tokens, obj)
        raise _error(tokens, f"{EXPECTED}, got {got}", line=line, field=prefix or None)
    try:
        kind = object_kind(obj, prefix=prefix)
    except InputError as e:
        raise _error(tokens, e.message, line=line, field=e.field) from None
    return Found(obj, kind, prefix, line, where, deleted)


def _error(tokens: Tokens[W], message: str, *, line: int, field: str | None = None) -> InputError:
    return InputError(message, file=tokens.name, line=line, field=field)


def _type(tokens: Tokens[W], value: object) -> str:
    return value_type(value, sequence=tokens.sequence)


def kind_of(obj: dict[str, Any]) -> str | None:
    """The `kind` of an object, shown as text when it is not a string (never unhashable)."""
    kind = obj.get("kind")
    if kind is None:
        return None
    return kind[:60] if isinstance(kind, str) else shown(kind)


def event_type(event: dict[str, Any]) -> str:
    """A watch event's `type`, shown as text when it is not a string."""
    kind = event["type"]
    return kind if isinstance(kind, str) else shown(kind)


def _expired(obj: object) -> bool:
    """A watch's `410 Gone`/`Expired` Status: the server ended the stream (its
    resourceVersion grew too old), as every long `kubectl get -w` ends; not bad data."""
    return isinstance(obj, dict) and obj.get("code") == 410


def watch_error(obj: object) -> str:
    """The message for a watch stream's ERROR event (the API's Status, e.g. 410 Gone)."""
    status = obj if isinstance(obj, dict) else {}
    reason = " ".join(str(status[k])[:40] for k in ("code", "reason") if status.get(k))
    message = str(status.get("message") or "no message")[:160]
    return f"the watch stream reported an error: {reason + ': ' if reason else ''}{message}"


def object_kind(obj: dict[str, Any], *, prefix: str) -> str:
    """`Pod`, `Node`, `ResourceClaim` or `ResourceSlice`, else `InputError` (with only a
    message and a field) saying what it is. An object without a kind is a Pod when it has a
    pod spec."""
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


def value_type(value: object, *, sequence: str) -> str:
    """What a decoded value is, as a message names it, a list being `sequence` (`an array`
    in JSON's words, `a sequence` in YAML's)."""
    if isinstance(value, list):
        return sequence
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
