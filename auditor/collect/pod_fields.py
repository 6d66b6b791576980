"""Reading a pod's JSON: the typed accessors every part of a pod is read through.

Each takes the parent object, the key, and the field's dotted path as the error names it
(`spec.containers[0].resources`), and raises `PodFieldError` (an `InputError`) for a value
of the wrong shape, so that every reader of pods refuses bad input in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from auditor import limits
from auditor.errors import PodFieldError, shown


def mapping_at(
    parent: Mapping[str, Any], key: str, field: str, *, required: bool = True
) -> Mapping[str, Any]:
    """The JSON object at `key`; {} where it is absent and not `required`."""
    value = parent.get(key)
    if value is None:
        if required:
            raise PodFieldError("missing", field=field)
        return {}
    if not isinstance(value, Mapping):
        raise PodFieldError(f"must be a JSON object, got {type(value).__name__}", field=field)
    return value


def list_at(parent: Mapping[str, Any], key: str, field: str) -> Sequence[Any]:
    """The JSON list at `key`; [] where it is absent."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodFieldError(f"must be a list, got {type(value).__name__}", field=field)
    return value


def required_str(parent: Mapping[str, Any], key: str, field: str, *, limit: int) -> str:
    """The text at `key`, present, at most `limit` characters, storable as it is."""
    value = parent.get(key)
    if value is None or value == "":
        raise PodFieldError("missing", field=field)
    if not isinstance(value, str):
        raise PodFieldError(
            f"must be a string, got {type(value).__name__}", field=field, value=value
        )
    if len(value) > limit:
        raise PodFieldError(f"longer than {limit} characters", field=field, value=value)
    if not limits.is_clean(value):
        raise PodFieldError("holds a NUL or an unpaired surrogate", field=field, value=value)
    return value


def optional_str(parent: Mapping[str, Any], key: str) -> str | None:
    """The text at `key` where it is a non-empty string, else None (never an error)."""
    value = parent.get(key)
    return value if isinstance(value, str) and value else None


def str_map(parent: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
    """The object of strings at `key` (labels, annotations); {} where it is absent."""
    value = mapping_at(parent, key, field, required=False)
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise PodFieldError(
                f"values must be strings, got {shown(v)}", field=f"{field}.{k}", value=v
            )
        out[k] = v
    return out
