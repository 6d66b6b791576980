"""MIG (SPEC §7): what share of its physical card each instance holds, and when.

A MIG-enabled card is one physical card; an instance holds its compute slices of it (7 on
the A100, H100, H200 and B200, 4 on the A30), read from the instance's profile (`3g.40gb`,
a compute instance `1c.3g.40gb`, or the profile in its device name). The slices no
instance was carved from stay the parent card's: its weight is what is left.

The layout is a function of time, read from the samples (`layouts`): MIG mode goes on and
off, instances are carved and destroyed while the card is observed. At each instant the
instances present are the ones reporting then; where none is, the card is a whole card and
weighs 1. A card's capacity is therefore one card-second per second of its observed span
whatever happened to its layout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.classify.arrays import BoolArr, FloatArr, IntArr
from auditor.classify.coverage import SampleTable

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


def instance_shares(
    cards: pd.DataFrame | None,
) -> tuple[dict[str, float | None], dict[str, list[str]]]:
    """(share of its physical card each MIG instance's profile says, None where it says
    none; physical card → its instances). Cards that are not MIG instances are not listed."""
    if cards is None or len(cards) == 0 or "parent_uuid" not in cards.columns:
        return {}, {}
    uuids = cards["uuid"].astype(str).tolist()
    models = dict(zip(uuids, _column(cards, "model"), strict=True))
    shares: dict[str, float | None] = {}
    children: dict[str, list[str]] = {}
    for uuid, parent, profile in zip(
        uuids, cards["parent_uuid"], _column(cards, "mig_profile"), strict=True
    ):
        parent_s = _text(parent)
        if parent_s is None:
            continue
        children.setdefault(parent_s, []).append(uuid)
        model = _text(models.get(parent_s)) or _text(models.get(uuid))
        shares[uuid] = mig_share(_text(profile) or _profile_in(_text(models.get(uuid))), model)
    return shares, children


def _column(frame: pd.DataFrame, name: str) -> list[object]:
    return frame[name].tolist() if name in frame.columns else [None] * len(frame)


@dataclass(frozen=True)
class Layout:
    """One physical card's division over time, in stretches `[points[j], points[j+1])` (the
    last ends at `end`), from its first observation to the end of its last one."""

    card: str
    points: IntArr
    end: int
    kids: list[str]
    """Its instances that report in the samples, in the order of `weight`'s rows."""
    weight: FloatArr
    """(instance, stretch): the share of the card the instance holds; 0 where it is absent."""
    rest: FloatArr
    """Per stretch: the card's own share, 1 − Σ instances (uncarved slices; the whole card
    where no instance is present)."""
    own: BoolArr
    """Per stretch: a sample of the card itself covers it."""
    covered: BoolArr
    """Per stretch: a sample of the card or of a present instance covers it."""


def state(st: SampleTable, g: int, bounds: IntArr, at: IntArr) -> tuple[IntArr, BoolArr, BoolArr]:
    """For card `g` at each instant of `at`: its sample (-1 before its first), whether the
    instant lies in its span, and whether that sample covers it."""
    a, b = int(bounds[g]), int(bounds[g + 1])
    j = np.searchsorted(st.ts[a:b], at, side="right").astype(np.int64) - 1
    k = a + np.maximum(j, 0)
    in_span = (j >= 0) & (at < st.last_end[g])
    covered = in_span & (at < st.cov_end[k])
    return np.where(j >= 0, k, -1), in_span, covered


def _edges(st: SampleTable, g: int, bounds: IntArr) -> IntArr:
    """Where card `g`'s coverage starts or stops: its first sample, the end of its span, and
    both ends of every gap."""
    a, b = int(bounds[g]), int(bounds[g + 1])
    gapped = st.cov_end[a:b] < st.span_end[a:b]
    return np.concatenate(
        [
            st.ts[a : a + 1],
            st.last_end[g : g + 1],
            st.cov_end[a:b][gapped],
            st.span_end[a:b][gapped],
        ]
    ).astype(np.int64)


def layouts(st: SampleTable, cards: pd.DataFrame | None) -> dict[str, Layout]:
    """The layout of each physical card that has MIG instances in the samples (SPEC §7).

    At each instant an instance is present where one of its samples covers the instant, or
    inside a gap of its own where the card does not report as a whole card (a readable
    utilisation of the card's own: MIG is off, nothing is carved). A present instance holds
    its profile's slices; instances whose profile says none split what the others leave;
    shares adding up to more than the card are scaled to it. The card itself holds the rest:
    the slices not carved, all of it where no instance is present.
    """
    shares, children = instance_shares(cards)
    if not children or st.ts.size == 0:
        return {}
    index = {str(u): i for i, u in enumerate(st.uuids.tolist())}
    starts = np.flatnonzero(np.r_[True, st.gpu[1:] != st.gpu[:-1]]).astype(np.int64)
    bounds = np.append(starts, st.ts.size).astype(np.int64)
    out: dict[str, Layout] = {}
    for card, all_kids in children.items():
        kids = [k for k in all_kids if k in index]
        if not kids:
            continue
        g_card = index.get(card)
        mine = [index[k] for k in kids] + ([] if g_card is None else [g_card])
        lo = int(min(st.first[g] for g in mine))
        hi = int(max(st.last_end[g] for g in mine))
        edges = [_edges(st, g, bounds) for g in mine]
        if g_card is not None:
            edges.append(st.ts[int(bounds[g_card]) : int(bounds[g_card + 1])])
        points = np.unique(np.concatenate([np.array([lo], dtype=np.int64), *edges]))
        points = points[(points >= lo) & (points < hi)]
        m = points.size
        own = np.zeros(m, dtype=np.bool_)
        whole = np.zeros(m, dtype=np.bool_)
        if g_card is not None:
            sample, _, own = state(st, g_card, bounds, points)
            whole = own & ~np.isnan(st.util[np.maximum(sample, 0)])
        present = np.zeros((len(kids), m), dtype=np.bool_)
        covered = own.copy()
        for i, k in enumerate(kids):
            _, in_span, cov = state(st, index[k], bounds, points)
            present[i] = cov | (in_span & ~whole)
            covered |= cov
        known = np.array([shares[k] is not None for k in kids], dtype=np.bool_)
        slices = np.array([shares[k] or 0.0 for k in kids], dtype=np.float64)
        carved = (present & known[:, None]) * slices[:, None]
        unknown = present & ~known[:, None]
        n_unknown = unknown.sum(axis=0)
        left = np.maximum(0.0, 1.0 - carved.sum(axis=0)) / np.maximum(n_unknown, 1)
        raw = carved + unknown * left[None, :]
        total = raw.sum(axis=0)
        weight = raw / np.where(total > 1.0, total, 1.0)[None, :]
        rest = np.maximum(0.0, 1.0 - weight.sum(axis=0))
        out[card] = Layout(card, points, hi, kids, weight, rest, own, covered)
    return out


def weight_at(layout: Layout, row: int | None, at: IntArr) -> FloatArr:
    """The share instance `row` of `layout.kids` (None: the card itself) holds at `at`."""
    j = np.clip(np.searchsorted(layout.points, at, side="right") - 1, 0, layout.points.size - 1)
    values = layout.rest if row is None else layout.weight[row]
    out: FloatArr = values[j]
    return out


def _profile_in(name: str | None) -> str | None:
    """The profile in a MIG device's name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`)."""
    if name is None:
        return None
    found = re.search(r"MIG\s+(\S+)", name)
    return None if found is None else found.group(1)
