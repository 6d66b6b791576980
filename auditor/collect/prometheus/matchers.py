"""Label matchers every query of a store holding several clusters carries (SPEC §11): with
`--cluster-label cluster --cluster east`, each series selector the readers build names
`cluster="east"`, so a Thanos or Mimir over many clusters answers with that one's series."""

from __future__ import annotations

import re
from collections.abc import Mapping

from auditor.errors import InputError

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""A Prometheus label name."""


def label_matchers(labels: Mapping[str, str], *, field: str = "--cluster-label") -> str:
    """`name="value",...` of `labels` (values escaped as PromQL strings), in name order; a
    name that is no label name is an InputError naming `field`."""
    parts = []
    for name, value in sorted(labels.items()):
        if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise InputError(f"not a label name: {name[:80]!r}", field=field)
        text = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{name}="{text}"')
    return ",".join(parts)


def selector(metric: str, *matchers: str) -> str:
    """The series selector of `metric` with `matchers` (each `a="b",...` or empty)."""
    inside = ",".join(m for m in matchers if m)
    return f"{metric}{{{inside}}}" if inside else metric
