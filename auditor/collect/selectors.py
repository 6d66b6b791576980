"""Kubernetes label selectors, parsed and matched locally. Pure.

The watcher asks the API server for the pods of a selector; when a relist no longer shows
a pod, it closes that pod only if the selector could have shown it. This module answers
that question for the selector grammar `kubectl -l` accepts: `k=v`, `k==v`, `k!=v`,
`k in (a,b)`, `k notin (a,b)`, `k` and `!k`, joined by commas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from auditor.errors import InputError

Matcher = Callable[[Mapping[str, str]], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_CMP = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "in":
            return value in self.values
        if self.op == "notin":
            return value not in self.values
        if self.op == "exists":
            return value is not None
        return value is None  # "!exists"


def parse_selector(text: str | None) -> list[Requirement]:
    """The requirements of a selector; an empty or missing one selects everything."""
    if not text or not text.strip():
        return []
    out: list[Requirement] = []
    for part in _split(text):
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append(Requirement(m.group(1), m.group(2), values))
        elif m := _CMP.match(part):
            op = "notin" if m.group(2) == "!=" else "in"
            out.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
        elif m := _EXISTS.match(part):
            out.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
        else:
            raise InputError(
                f"cannot read label selector part {part.strip()!r}", field="--selector"
            )
    return out


def matcher(text: str | None) -> Matcher:
    """A predicate on a label map: does the selector `text` select it?"""
    reqs = parse_selector(text)
    return lambda labels: all(r.matches(labels) for r in reqs)


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]
