"""Which reader takes a kubectl file: YAML or JSON, and when its nodes were seen.

A file is YAML when its name ends in `.yaml` or `.yml`, or when its first character that
is not blank is neither `{` nor `[` (a JSON file is valid YAML too, but the JSON reader
streams it faster and names columns); anything else, an empty file included, goes to the
JSON reader. Node rows are stamped with the file's modification time: kubectl wrote the
file when it read the nodes, which is when they were seen (a copy that did not keep the
time makes it the time of the copy, no earlier than the capture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from auditor.collect.kubectl_json import read_kubectl_json
from auditor.collect.kubectl_shapes import KubectlRecord, check_file
from auditor.errors import InputError
from auditor.settings import Sharing, TeamRules

YAML_SUFFIXES = frozenset({".yaml", ".yml"})
_PROBE_BYTES = 1 << 16
_BLANK = " \t\r\n\ufeff"


def read_kubectl(
    path: Path,
    *,
    teams: TeamRules,
    node_ms: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    sharing: Sharing | None = None,
) -> Iterator[KubectlRecord]:
    """Every GPU pod observation and node of a kubectl JSON or YAML file, in file order.

    `node_ms` is when the nodes were seen; default the file's modification time."""
    name = check_file(path)
    try:
        seen_ms = int(path.stat().st_mtime * 1000) if node_ms is None else node_ms
        yaml = is_yaml(path)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=name) from e
    if yaml:
        from auditor.collect.kubectl_yaml import read_kubectl_yaml

        return read_kubectl_yaml(
            path, teams=teams, node_ms=seen_ms, on_progress=on_progress, sharing=sharing
        )
    return read_kubectl_json(
        path, teams=teams, node_ms=seen_ms, on_progress=on_progress, sharing=sharing
    )


def is_yaml(path: Path) -> bool:
    """Whether the file at `path` is read as YAML (see the module's docstring)."""
    if path.suffix.lower() in YAML_SUFFIXES:
        return True
    with path.open("rb") as f:
        while chunk := f.read(_PROBE_BYTES):
            text = chunk.decode("utf-8", errors="replace").lstrip(_BLANK)
            if text:
                return text[0] not in "{["
    return False
