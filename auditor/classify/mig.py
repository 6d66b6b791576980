"""MIG (SPEC §7): what share of its physical card each instance holds.

A MIG-enabled card is one physical card; an instance holds its compute slices of it (7 on
the A100, H100, H200 and B200, 4 on the A30), read from the instance's profile (`3g.40gb`,
a compute instance `1c.3g.40gb`, or the profile in its device name). The slices no
instance was carved from stay the parent card's: its weight is what is left.
"""

from __future__ import annotations

import math
import re

import pandas as pd

_MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\b", re.IGNORECASE)


def mig_slices(model: str | None) -> int:
    """Compute slices of a MIG-capable card: 4 on an A30, 7 on the others (A100, H100...)."""
    return 4 if model is not None and re.search(r"\bA30\b", model) else 7


def mig_share(profile: str | None, model: str | None) -> float | None:
    """The share of its physical card a MIG instance of `profile` holds, or None where the
    profile names no slice count (`1g.10gb` → 1/7; `1c.3g.40gb`, a compute instance, → 1/7;
    on an A30, `2g.12gb` → 2/4)."""
    if not profile:
        return None
    found = _MIG_PROFILE.search(profile)
    if found is None:
        return None
    slices = int(found.group(1) or found.group(2))
    total = mig_slices(model)
    if slices <= 0 or slices > total:
        return None
    return slices / total


def _text(value: object) -> str | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def card_weights(cards: pd.DataFrame | None) -> tuple[dict[str, float], dict[str, list[str]]]:
    """(weight of each MIG instance and of each MIG parent's uncarved rest, parent → its
    instances). Cards that are neither weigh 1 and are not listed."""
    if cards is None or len(cards) == 0 or "parent_uuid" not in cards.columns:
        return {}, {}
    models = dict(
        zip(
            cards["uuid"].astype(str),
            cards["model"] if "model" in cards.columns else [None] * len(cards),
            strict=True,
        )
    )
    profiles = cards["mig_profile"] if "mig_profile" in cards.columns else [None] * len(cards)
    children: dict[str, list[str]] = {}
    weights: dict[str, float] = {}
    unknown: dict[str, list[str]] = {}
    for uuid, parent, profile in zip(
        cards["uuid"].astype(str), cards["parent_uuid"], profiles, strict=True
    ):
        parent_s = _text(parent)
        if parent_s is None:
            continue
        children.setdefault(parent_s, []).append(uuid)
        model = _text(models.get(parent_s)) or _text(models.get(uuid))
        share = mig_share(_text(profile) or _profile_in(_text(models.get(uuid))), model)
        if share is None:
            unknown.setdefault(parent_s, []).append(uuid)
        else:
            weights[uuid] = share
    for parent, kids in children.items():
        known = sum(weights[k] for k in kids if k in weights)
        rest = max(0.0, 1.0 - known)
        missing = unknown.get(parent, [])
        for k in missing:  # a profile we cannot read: an equal split of what is left
            weights[k] = rest / len(missing)
        weights[parent] = 0.0 if missing else rest
    return weights, children


def _profile_in(name: str | None) -> str | None:
    """The profile in a MIG device's name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`)."""
    if name is None:
        return None
    found = re.search(r"MIG\s+(\S+)", name)
    return None if found is None else found.group(1)
