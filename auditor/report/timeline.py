"""Per-card timelines for `auditor explain`: utilisation over time with categories shaded.

Pure pandas/numpy, no I/O, and no classification rule of its own: the input is the
classifier's pieces over time (`Classification.pieces`, asked for with
`classify(..., keep_pieces=True)`: gpu, pod_uid, start_ms, end_ms, category, seconds).
`bucketise` spreads each piece's seconds evenly over its `[start_ms, end_ms)` and integrates
them exactly over at most `buckets` equal time buckets per card (piecewise-linear
cumulative sums, so a long piece splits across buckets in proportion to time). Nothing is
added or lost on the way: a card's seconds per category, summed over its buckets, are the
classifier's results for that card, up to floating-point rounding.

How a bucket is drawn is the renderers' choice (`auditor.report.explain` for text,
`auditor.report.svg` for HTML); `CardTimeline.dominant_share` is the usual one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt
import pandas as pd

from auditor.classify.arrays import order_by, run_factorize, starts_of
from auditor.model import CATEGORIES, WasteCategory, Window

FloatArr = npt.NDArray[np.float64]
CATEGORY_NAMES = [c.value for c in CATEGORIES]


@dataclass(frozen=True)
class CardTimeline:
    """One card of one pod over `edges` (ms, `len = buckets + 1`)."""

    gpu: str
    pod_uid: str
    edges: npt.NDArray[np.int64]
    util: FloatArr
    """Mean utilisation (percent) over each bucket's observed time; NaN where none."""
    seconds: dict[str, FloatArr]
    """Seconds per category per bucket; held time only."""

    def dominant(self) -> list[str]:
        """Per bucket: the biggest non-busy category ('' where the pod held none of it)."""
        return self.dominant_share()[0]

    def dominant_share(self) -> tuple[list[str], FloatArr]:
        """Per bucket: the biggest non-busy category and its share of the held time."""
        idle = [c for c in CATEGORY_NAMES if c != WasteCategory.BUSY.value]
        stack = np.vstack([self.seconds[c] for c in idle])
        total = stack.sum(axis=0) + self.seconds[WasteCategory.BUSY.value]
        best = np.argmax(stack, axis=0)
        top = np.max(stack, axis=0)
        share: FloatArr = np.where(total > 0, top / np.where(total > 0, total, 1.0), 0.0)
        names = ["" if t <= 0 else idle[int(b)] for b, t in zip(best, total, strict=True)]
        return names, share


def _integral(starts: FloatArr, ends: FloatArr, amount: FloatArr, edges: FloatArr) -> FloatArr:
    """Per bucket of `edges`: the part of each `amount` spread evenly over its disjoint,
    sorted `[start, end)` that falls in the bucket."""
    xp = np.column_stack([starts, ends]).ravel()
    cum = np.cumsum(amount)
    fp = np.column_stack([np.concatenate([[0.0], cum[:-1]]), cum]).ravel()
    at = np.interp(edges, xp, fp, left=0.0, right=float(fp[-1]) if fp.size else 0.0)
    out: FloatArr = np.diff(at)
    return out


def bucketise(pieces: pd.DataFrame, *, span: Window, buckets: int = 600) -> list[CardTimeline]:
    """Per (card, pod) of the held `pieces`: seconds per category and mean utilisation per
    bucket of `span`, which should hold every piece (module docstring). Cards are sorted by
    gpu and pod_uid; pieces nobody held (pod_uid None) are left out."""
    lo, hi = span
    n = max(1, min(buckets, (hi - lo) // 1000))
    edges = np.linspace(lo, hi, n + 1).round().astype(np.int64)
    fe = edges.astype(np.float64)
    # whole columns as codes, one sort, then a walk over the runs of (card, pod, category):
    # grouping strings in pandas per card cost more than the integrals. The pods' run codes
    # also tell the held pieces (-1: nobody held the card).
    pod, pods = run_factorize(pieces["pod_uid"], sort=True)
    rows = np.flatnonzero(pod >= 0)
    if rows.size == 0:
        return []
    card, cards = run_factorize(pieces["gpu"].iloc[rows], sort=True)
    cat, cats = pd.factorize(pieces["category"].to_numpy(dtype=object)[rows])
    at = pieces["start_ms"].to_numpy(dtype=np.int64)[rows]
    order = order_by(card, pod[rows], cat, at - at.min())
    take = rows[order]
    card, pod, cat = card[order], pod[take], cat[order]
    starts = pieces["start_ms"].to_numpy(dtype=np.float64)[take]
    ends = pieces["end_ms"].to_numpy(dtype=np.float64)[take]
    amounts = pieces["seconds"].to_numpy(dtype=np.float64)[take]
    bounds = [*np.flatnonzero(starts_of(card, pod, cat)).tolist(), card.size]
    out: list[CardTimeline] = []
    sec: dict[str, FloatArr] = {}
    for a, b in pairwise(bounds):
        if not sec:
            sec = {c: np.zeros(n) for c in CATEGORY_NAMES}
        sec[str(cats[cat[a]])] = _integral(starts[a:b], ends[a:b], amounts[a:b], fe)
        if b == card.size or card[b] != card[a] or pod[b] != pod[a]:
            seen = [v for c, v in sec.items() if c != WasteCategory.UNOBSERVED.value]
            observed = sum(seen, np.zeros(n))
            with np.errstate(invalid="ignore", divide="ignore"):
                util = np.where(observed > 0, 100.0 * sec["busy"] / observed, np.nan)
            out.append(CardTimeline(str(cards[card[a]]), str(pods[pod[a]]), edges, util, sec))
            sec = {}
    return out
