"""The ground truth of the causes inside `compute_idle` (SPEC §10), from the simulated
signals (`simulate.signals`): each `compute_idle` second of a card goes to the cause of the
readings in effect for its pod and card at that second, the first of SPEC §10's order that
holds; an interval in which a reading changes is split in proportion to time. It is computed
from the plan's flags, not by the auditor's rules, so the auditor's causes are checked
against something they did not make.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.model import WasteCategory
from auditor.simulate.plan import PodPlan
from auditor.simulate.signals import IDLE_CAUSES, STALE_MS, Signals
from auditor.simulate.truth import Pieces

_CODE = {c: i for i, c in enumerate(IDLE_CAUSES)}


def _in_effect(times: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per time in `at`: the index of the latest reading at or before it, and whether it is
    recent enough to stand (`STALE_MS`)."""
    i = np.searchsorted(times, at, side="right") - 1
    ok = i >= 0
    ok[ok] = at[ok] - times[i[ok]] < STALE_MS
    return np.maximum(i, 0), ok


def idle_cause_truth(
    *,
    pieces: list[Pieces],
    signals: Signals,
    pods: list[PodPlan],
    uuids: list[str],
) -> pd.DataFrame:
    """Seconds per (pod index, cause) of every card's `compute_idle` pieces (module doc)."""
    rows = signals.pod_rows
    cad = {u: f for u, f in rows[rows["source"] == "cadvisor"].groupby("pod_uid")}
    srv = {u: f for u, f in rows[rows["source"] == "serving"].groupby("pod_uid")}
    cards = {u: f for u, f in signals.card_rows.groupby("gpu_uuid")}
    multi = {st.pod: st.multi_card for st in signals.stories}
    out: list[pd.DataFrame] = []
    for c, got in enumerate(pieces):
        idle = got.of(WasteCategory.COMPUTE_IDLE)
        if idle.seconds.size == 0:
            continue
        card = cards[uuids[c]]
        for j in np.unique(idle.pod).tolist():
            mine = idle.pod == j
            a = idle.start_ms[mine]
            b = a + idle.length_ms[mine]
            secs = idle.seconds[mine]
            pc = cad.get(pods[j].uid)
            ps = srv.get(pods[j].uid)
            times = [card["ts_ms"].to_numpy(np.int64)]
            times += [f["ts_ms"].to_numpy(np.int64) for f in (pc, ps) if f is not None]
            edges = np.concatenate([*times, *(x + STALE_MS for x in times)]).astype(np.float64)
            lo, hi = float(a.min()), float(b.max())
            edges = np.unique(np.concatenate([edges[(edges > lo) & (edges < hi)], [lo, hi]]))
            x = edges[:-1]
            ci, cok = _in_effect(times[0].astype(np.float64), x)
            pcie = cok & card["pcie"].to_numpy(bool)[ci]
            nvlink = cok & card["nvlink"].to_numpy(bool)[ci]
            input_ = np.zeros(x.size, dtype=bool)
            network = np.zeros(x.size, dtype=bool)
            serving = np.zeros(x.size, dtype=bool)
            queued = np.zeros(x.size, dtype=bool)
            if pc is not None:
                i, ok = _in_effect(pc["ts_ms"].to_numpy(np.float64), x)
                input_ = ok & pc["input"].to_numpy(bool)[i]
                network = ok & pc["network"].to_numpy(bool)[i]
            if ps is not None:
                i, ok = _in_effect(ps["ts_ms"].to_numpy(np.float64), x)
                serving = ok
                queued = ok & ps["queued"].to_numpy(bool)[i]
            gang = multi[j]
            code = np.full(x.size, _CODE["unexplained"])
            for cause, holds in reversed(
                [
                    ("input_bound", input_),
                    ("host_transfer", pcie),
                    ("communication", gang & (nvlink | network)),
                    ("batching", serving & queued),
                    ("low_demand", serving & ~queued),
                ]
            ):
                code = np.where(holds, _CODE[cause], code)
            step = np.diff(edges)
            for cause, q in _CODE.items():
                cum = np.concatenate([[0.0], np.cumsum(np.where(code == q, step, 0.0))])
                share = (np.interp(b, edges, cum) - np.interp(a, edges, cum)) / (b - a)
                got_s = float((secs * share).sum())
                if got_s > 0:
                    out.append(pd.DataFrame({"pod": [j], "cause": [cause], "sec": [got_s]}))
    if not out:
        return pd.DataFrame({"pod": [], "cause": [], "sec": []})
    summed = pd.concat(out).groupby(["pod", "cause"], as_index=False).agg(sec=("sec", "sum"))
    return summed
