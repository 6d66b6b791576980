"""Tenures on cards that no sample names: the pod held a card, nothing was measured.

A pod's exact mapping can name a card that the samples never name: HAMi's annotation and
pod-resources give UUIDs while a GPU log without a `uuid` column names its cards
`NODE/pci.bus_id`; a sampler that never ran on the node leaves no sample at all. The
classifier's capacity runs from a card's first to its last sample, so such a tenure would
vanish: no held time, no `unobserved`, no word. The pod held the card all the same: its
tenure, clipped to the window, is `unobserved` of the pod (its share's worth of a shared
card: an unknown share counts whole), and the card is named in the results so a report can
say which cards could not be joined to samples.

Pure: tenures and the sampled GPUs in, result rows out, in `pieces.empty_results`' columns.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from auditor.classify.pieces import empty_results
from auditor.model import WasteCategory, Window


def unsampled_pieces(
    tenures: pd.DataFrame,
    *,
    sampled: Collection[str],
    window: Window,
    cards: pd.DataFrame | None = None,
) -> pd.DataFrame | None:
    """The `unsampled_results` as pieces over time (`auditor.classify.pieces.piece_frame`'s
    columns): each tenure of an unsampled card, clipped to the window; None if none."""
    frame = _unsampled(tenures, sampled=sampled, window=window, cards=cards)
    if frame is None:
        return None
    return frame.assign(
        category=WasteCategory.UNOBSERVED.value,
        mid_ms=(frame["start_ms"] + frame["end_ms"]) // 2,
    )


def _unsampled(
    tenures: pd.DataFrame,
    *,
    sampled: Collection[str],
    window: Window,
    cards: pd.DataFrame | None = None,
) -> pd.DataFrame | None:
    """gpu, pod_uid, start_ms, end_ms, seconds of each tenure of a card with no sample."""
    if tenures.empty:
        return None
    known = set(sampled)
    if cards is not None and "parent_uuid" in cards.columns:
        parents = cards.dropna(subset=["parent_uuid"])
        pairs = list(
            zip(parents["uuid"].astype(str), parents["parent_uuid"].astype(str), strict=True)
        )
        # an instance of a sampled card, and a card one of whose instances is sampled: the
        # layout over time (`auditor.classify.mig`) accounts for both
        known |= {u for u, p in pairs if p in known} | {p for u, p in pairs if u in known}
    gpu = tenures["gpu"].astype(object)
    keep = gpu.notna() & tenures["pod_uid"].notna() & ~gpu.isin(list(known))
    if cards is not None:  # a card the inventory does not list is no card anybody held
        keep &= gpu.isin(list(cards["uuid"].astype(str)))
    held = tenures[keep]
    if held.empty:
        return None
    start = np.maximum(held["start_ms"].to_numpy(dtype=np.float64), window.start_ms)
    end = np.minimum(held["end_ms"].to_numpy(dtype=np.float64), window.end_ms)
    share = (
        held["share"].to_numpy(dtype=np.float64, na_value=np.nan)
        if "share" in held.columns
        else np.ones(len(held))
    )
    seconds = np.maximum(end - start, 0.0) / 1000.0 * np.where(np.isnan(share), 1.0, share)
    frame = pd.DataFrame(
        {
            "gpu": held["gpu"].astype(object).to_numpy(),
            "pod_uid": held["pod_uid"].astype(object).to_numpy(),
            "start_ms": start.astype(np.int64),
            "end_ms": end.astype(np.int64),
            "seconds": seconds,
        }
    )
    frame = frame[frame["seconds"] > 0]
    return frame if not frame.empty else None


def unsampled_results(
    tenures: pd.DataFrame,
    *,
    sampled: Collection[str],
    window: Window,
    cards: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """`unobserved` seconds of each (card, pod) whose card has no sample at all. A MIG
    instance whose physical card is sampled is not one: its layout (`auditor.classify.mig`)
    says when the instance existed (`cards`: uuid, parent_uuid)."""
    frame = _unsampled(tenures, sampled=sampled, window=window, cards=cards)
    if frame is None:
        return empty_results()
    out = frame.groupby(["gpu", "pod_uid"], sort=True, as_index=False)["seconds"].sum()
    return pd.DataFrame(
        {
            "gpu": out["gpu"].astype(object),
            "pod_uid": out["pod_uid"].astype(object),
            "category": WasteCategory.UNOBSERVED.value,
            "seconds": out["seconds"].astype(np.float64),
            "estimated": False,
        }
    )[list(empty_results().columns)]
