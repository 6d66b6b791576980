"""`auditor explain`: what happened on each card of a job or pod, as text.

`build_explanation` joins the classifier's output for the target's gang(s) with names,
ranks and nodes into an `Explanation`; `render_explain_text` draws each card as a strip of
the classifier's own categories over time (`auditor.report.timeline`: one character per
time slot, legend below), the findings with times and durations, what the gang waited on,
and the next steps. The HTML chart of the same `Explanation` is in `auditor.report.html`.
Every line is made `terminal_safe`, so a name with control or bidi characters shows them as
escapes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from auditor.classify.arrays import run_factorize
from auditor.classify.causes import IdleCause
from auditor.model import SCHEDULING_WASTE, WasteCategory, Window
from auditor.report.advice import next_step, throttle_names
from auditor.report.causes import FIRST_STEP
from auditor.report.text import terminal_safe
from auditor.report.timeline import CardTimeline

SYMBOLS = {
    "": " ",
    "busy": "█",
    "unallocated": "·",
    "reserved_idle": "R",
    "startup": "S",
    "teardown": "T",
    "checkpoint": "C",
    "straggler_wait": "W",
    "compute_idle": "i",
    "unobserved": "?",
}
"""One character per category in the text strips ('' = the pod did not hold the card)."""


DAY_MS = 86_400_000


@dataclass(frozen=True)
class Card:
    """One card of one pod of the target, with names and the classifier's totals."""

    timeline: CardTimeline
    pod: str
    namespace: str
    rank: int | None
    node: str
    totals: dict[str, float]
    """Seconds per category inside the explained span (the classifier's own numbers)."""


@dataclass(frozen=True)
class Explanation:
    target: str
    window: Window
    cards: list[Card]
    findings: pd.DataFrame
    """kind, pod, rank, node, gpu, start_ms, end_ms, seconds, detail; sorted by start."""
    workload: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)
    """(category, next step) for the categories that cost most, biggest first."""
    idle_causes: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Compute idle by cause and deciding signal (SPEC §10): cause, deciding, seconds,
    start_ms (of its first piece), end_ms (of its last); biggest first."""


def _text(value: object) -> str:
    """A cell as text; '' for None, NA and NaN."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def build_explanation(
    *,
    target: str,
    window: Window,
    timelines: list[CardTimeline],
    results: pd.DataFrame,
    findings: pd.DataFrame,
    pods: pd.DataFrame,
    gpus: pd.DataFrame,
    idle: pd.DataFrame | None = None,
) -> Explanation:
    """Join timelines, results (gpu, pod_uid, category, seconds) and findings with names;
    `idle`: the target's compute idle pieces by cause (`causes.split_compute_idle`)."""
    pod_by_uid = pods.drop_duplicates("uid").set_index("uid")
    node_of = dict(zip(gpus["uuid"], gpus["node"], strict=True))
    shown = {(t.gpu, t.pod_uid) for t in timelines}
    per: dict[tuple[str, str], dict[str, float]] = {}
    for g, u, c, sec in zip(
        results["gpu"], results["pod_uid"], results["category"], results["seconds"], strict=True
    ):
        key = (str(g), str(u))
        per.setdefault(key, {})[str(c)] = per.get(key, {}).get(str(c), 0.0) + float(sec)
    cards = []
    for t in timelines:
        p = pod_by_uid.loc[t.pod_uid]
        rank = p["rank"]
        totals = per.get((t.gpu, t.pod_uid), {})
        cards.append(
            Card(t, str(p["name"]), str(p["namespace"]), None if pd.isna(rank) else int(rank),
                 _text(node_of.get(t.gpu)), totals)
        )  # fmt: skip
    cards.sort(key=lambda c: (c.rank if c.rank is not None else -1, c.pod, c.node, c.timeline.gpu))
    f = findings.copy()
    uids = {u for _, u in shown}
    f = f[f["pod_uid"].isin(uids) | f["kind"].isin(["checkpoint", "straggler"])]
    f = f.assign(
        pod=[_text(pod_by_uid["name"].get(u)) if _text(u) else "" for u in f["pod_uid"]],
        rank=pd.array(
            [pod_by_uid["rank"].get(u) if _text(u) else None for u in f["pod_uid"]], dtype="Int64"
        ),
        node=[_text(node_of.get(g)) for g in f["gpu"]],
    ).sort_values(["start_ms", "kind"], kind="stable", na_position="last")
    workloads = pods[pods["uid"].isin(uids)]["workload"].dropna()
    workload = str(workloads.iloc[0]) if len(workloads) else None
    waste: dict[str, float] = {}
    for c in cards:
        for cat, s in c.totals.items():
            if cat not in ("busy", "unallocated"):
                waste[cat] = waste.get(cat, 0.0) + s
    causes = _idle_causes(idle)
    named = causes[causes["cause"] != IdleCause.UNEXPLAINED.value]
    steps: list[tuple[str, str]] = []
    straggler = _straggler_text(f)
    for cat, s in sorted(waste.items(), key=lambda kv: -kv[1]):
        if s >= 60 and len(steps) < 4:
            step = next_step(cat, workload=workload, straggler=straggler)
            if cat == WasteCategory.COMPUTE_IDLE.value and not named.empty:
                lead = str(named["cause"].iloc[0])  # the cause a signal named most often
                step = f"mostly {lead}: {FIRST_STEP[lead]}"
            steps.append((cat, step))
    return Explanation(target, window, cards, f.reset_index(drop=True), workload, steps, causes)


def _idle_causes(idle: pd.DataFrame | None) -> pd.DataFrame:
    cols = ["cause", "deciding", "seconds", "start_ms", "end_ms"]
    if idle is None or idle.empty:
        return pd.DataFrame(columns=cols)
    # grouped by one integer of the two columns' sorted codes, as a groupby of the two text
    # columns orders them (hashing every row's text cost more than the sums); the same
    # pandas sums over the same rows in the same order
    cause, causes = run_factorize(idle["cause"], sort=True)
    deciding, decidings = run_factorize(idle["deciding"], sort=True)
    width = max(len(decidings), 1)
    key = cause * width + deciding
    summed = (
        idle[["seconds", "start_ms", "end_ms"]]
        .groupby(key, sort=True)
        .agg({"seconds": "sum", "start_ms": "min", "end_ms": "max"})
    )
    at = summed.index.to_numpy(np.int64)
    per = pd.DataFrame(
        {
            "cause": causes[at // width],
            "deciding": decidings[at % width],
            "seconds": summed["seconds"].to_numpy(),
            "start_ms": summed["start_ms"].to_numpy(),
            "end_ms": summed["end_ms"].to_numpy(),
        }
    )
    by_cause = per.groupby("cause")["seconds"].transform("sum")
    ranked = per.assign(_c=by_cause).sort_values(
        ["_c", "cause", "seconds"], ascending=[False, True, False], kind="stable"
    )
    return ranked[cols].reset_index(drop=True)


def _straggler_text(findings: pd.DataFrame) -> str | None:
    s = findings[findings["kind"] == "straggler"].sort_values("seconds", ascending=False)
    if s.empty:
        return None
    r = s.iloc[0]
    text = f"{r['pod']} (rank {_rank(r['rank'])}) on {r['node']}, GPU {str(r['gpu'])[:16]}"
    reasons = throttle_names(_text(r["detail"]) or None)
    return text + (f", throttled: {', '.join(reasons)}" if reasons else "")


def _rank(value: object) -> str:
    text = _text(value)
    return str(int(float(text))) if text else "-"


def grouped_findings(findings: pd.DataFrame) -> pd.DataFrame:
    """Findings other than `straggler`, one row per kind and episode: the cards of a gang that
    started or stopped together (same minute) are one row with `cards` counting them."""
    f = findings[findings["kind"] != "straggler"]
    cols = ["kind", "start_ms", "end_ms", "seconds", "cards", "pods", "detail"]
    if f.empty:
        return pd.DataFrame(columns=cols)
    f = f.assign(
        a=f["start_ms"].fillna(-1).astype("int64") // 60_000,
        b=f["end_ms"].fillna(-1).astype("int64") // 60_000,
        detail=f["detail"].fillna(""),
        pod=f["pod"].replace("", "whole gang"),
    )
    g = f.groupby(["kind", "a", "b", "detail"], sort=False).agg(
        start_ms=("start_ms", "min"),
        end_ms=("end_ms", "max"),
        seconds=("seconds", "max"),
        cards=("gpu", "count"),
        pods=("pod", lambda x: ", ".join(dict.fromkeys(x))),
    )
    g = g.reset_index().sort_values(["start_ms", "kind"], kind="stable")
    return g[cols].reset_index(drop=True)


def when(ms: object) -> str:
    text = _text(ms)
    if not text:
        return "-"
    return datetime.fromtimestamp(float(text) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def text_strip(t: CardTimeline, width: int) -> str:
    """The card over `width` slots, one character each, in proportion to time: each
    category gets about its share of the characters, in the slots where it happened.

    Error diffusion along the strip: each slot adds its categories' shares of its held time
    to a running balance, draws the category with the largest balance (busy first on a
    tie) and takes one character's worth from it. A card 77 % busy and 23 % compute idle
    in every slot is drawn with about a quarter `i`, not all `█`."""
    names = ["busy", *(c for c in t.seconds if c != "busy")]
    stack = np.vstack([t.seconds[c] for c in names])
    idx = np.linspace(0, stack.shape[1], width + 1).astype(int)
    balance = np.zeros(len(names))
    chars = []
    for a, end in itertools.pairwise(idx):
        b = max(end, a + 1)
        slot = stack[:, a:b].sum(axis=1)
        held = float(slot.sum())
        if held <= 0:
            chars.append(" ")
            continue
        balance += slot / held
        pick = int(np.argmax(balance))
        balance[pick] -= 1.0
        chars.append(SYMBOLS[names[pick]])
    return "".join(chars)


def render_explain_text(ex: Explanation, *, width: int = 72) -> str:
    """The explanation for a terminal (module docstring)."""
    lo, hi = ex.window
    lines = [f"{ex.target}: {len(ex.cards)} card(s), {when(lo)} → {when(hi)} UTC", ""]
    cut = slice(5, 16) if hi - lo > DAY_MS else slice(11, 16)  # several days: MM-DD HH:MM
    axis = f"{when(lo)[cut]} UTC"
    lines.append(f"   {axis}{when(hi)[cut]:>{width - len(axis)}}")
    for c in ex.cards:
        held = sum(c.totals.values())
        busy = c.totals.get("busy", 0.0)
        waste = sum(c.totals.get(w.value, 0.0) for w in SCHEDULING_WASTE)
        rank = "" if c.rank is None else f" rank {c.rank}"
        lines.append(
            f"{c.pod}{rank} {c.node} {c.timeline.gpu[:16]}: busy {busy / held:.0%}, "
            f"scheduling waste {waste / held:.0%}, compute idle "
            f"{c.totals.get('compute_idle', 0.0) / held:.0%}"
            if held
            else f"{c.pod}{rank}: -"
        )
        lines.append(f"  |{text_strip(c.timeline, width)}|")
    legend = "  ".join(f"{s} {k}" for k, s in SYMBOLS.items() if k and k != "unallocated")
    lines += [f"  legend: {legend}", ""]
    lines.append("Findings (per card, or for the whole gang):")
    shown = grouped_findings(ex.findings)
    if shown.empty:
        lines.append("  none")
    for r in shown.to_dict("records"):
        cards = f"{r['cards']} card(s) of {r['pods']}" if r["cards"] else r["pods"]
        each = "each" if r["cards"] > 1 else "" if r["cards"] else "GPU-time"
        lines.append(
            f"  {r['kind']:<14} {when(r['start_ms'])} → {when(r['end_ms'])}  "
            f"{duration(float(r['seconds'])):>7} {each:<8} {cards}"
        )
        if r["detail"]:
            lines.append(f"  {'':<14} {r['detail']}")
    lines += ["", "What the others waited on:"]
    straggler = _straggler_text(ex.findings)
    waits = sum(c.totals.get(WasteCategory.STRAGGLER_WAIT.value, 0.0) for c in ex.cards)
    if straggler:
        lines.append(f"  {duration(waits)} of straggler wait; slowest card: {straggler}")
    else:
        lines.append("  nothing: no card waited for a slower rank")
    lines += ["", "Why the cards idled (compute idle by cause, and the signal that decided it):"]
    idle_total = float(ex.idle_causes["seconds"].sum()) if len(ex.idle_causes) else 0.0
    if idle_total <= 0:
        lines.append("  no compute idle")
    for r in ex.idle_causes.to_dict("records"):
        signal = r["deciding"] or "no signal held"
        lines.append(
            f"  {r['cause']:<14} {signal:<14} {duration(float(r['seconds'])):>7} "
            f"{float(r['seconds']) / idle_total:>4.0%}  {when(r['start_ms'])} → {when(r['end_ms'])}"
        )
    lines += ["", "Next steps:"]
    lines += [f"  {cat}: {step}" for cat, step in ex.steps] or ["  none: the cards were busy"]
    return "\n".join(terminal_safe(line) for line in lines) + "\n"
