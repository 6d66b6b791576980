"""The simulator as a command, and the demo: simulate, import, audit, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.audit import audit
from auditor.jobs.imports import import_nvidia_smi, import_pods
from auditor.jobs.reports import build_report
from auditor.jobs.signals import store_signal_rows
from auditor.settings import Config, Thresholds

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SimulateStats:
    out_dir: Path
    summary: str


def simulate(out_dir: Path, *, scenario: str, seed: int | None = None) -> SimulateStats:
    """Write a preset scenario's input files and ground truth into `out_dir`."""
    from dataclasses import replace

    from auditor.simulate import SCENARIOS
    from auditor.simulate import simulate as run_simulation
    from auditor.simulate.sharedpreset import SHARED_SCENARIOS, simulate_shared

    if scenario in SHARED_SCENARIOS:
        preset = SHARED_SCENARIOS[scenario]
        shared = preset if seed is None else preset.with_seed(seed)
        out_dir.mkdir(parents=True, exist_ok=True)
        made = simulate_shared(out_dir, scenario=shared)
        return SimulateStats(
            out_dir,
            f"{made.tenancies['node'].nunique()} nodes, {made.physical_cards} GPUs "
            f"(shared), {shared.hours:g} h, {len(made.node_csvs)} nvidia-smi files, "
            "dcgm.om.txt, pods.json, nodes.json, truth.csv, truth_estimated.csv",
        )
    if scenario not in SCENARIOS:
        known = ", ".join([*SCENARIOS, *SHARED_SCENARIOS])
        raise InputError(f"unknown scenario (known: {known})", field="--scenario")
    chosen = SCENARIOS[scenario] if seed is None else replace(SCENARIOS[scenario], seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_simulation(out_dir, scenario=chosen)
    gpus = chosen.nodes * chosen.gpus_per_node
    return SimulateStats(
        out_dir,
        f"{chosen.nodes} nodes, {gpus} GPUs, {chosen.hours:g} h, {len(result.node_csvs)} "
        "nvidia-smi files, pods.json, truth.csv",
    )


def demo(workdir: Path, *, scenario: str = "demo", log: Callable[[str], None]) -> str:
    """Simulate → import → audit → report on a fresh SQLite database in `workdir`.

    Ends with the team report and a check of the audit against the simulator's ground truth.
    """
    from auditor.report.render import render_table
    from auditor.report.summary import GroupBy
    from auditor.simulate import SCENARIOS
    from auditor.simulate import simulate as run_simulation

    started = time.perf_counter()
    chosen = SCENARIOS[scenario]
    data = workdir / "cluster"
    data.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'auditor.db'}"
    log(f"simulating {chosen.nodes} nodes × {chosen.gpus_per_node} GPUs for {chosen.hours:g} h ...")
    sim = run_simulation(data, scenario=chosen)
    samples = 0
    for node, path in sorted(sim.node_csvs.items()):
        samples += import_nvidia_smi(url, path, node=node).rows
    pods = import_pods(url, sim.pods_json, config=Config()).rows
    for extra in (sim.watch_json, sim.nodes_json):  # waits and the cordon (SPEC §10)
        if extra is not None:
            pods += import_pods(url, extra, config=Config()).rows
    log(f"imported {samples:,} samples and {pods} pod records into {url}")
    if sim.signals is not None:
        stored = store_signal_rows(url, sim.signals.pod_rows, sim.signals.card_rows)
        log(f"stored {stored.pod_rows:,} pod and {stored.card_rows:,} card signal rows")
    story = ab_story(url, workdir / "ab", log=log)
    stats = audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    log(f"audited {stats.gpus} GPUs in {stats.seconds:.1f}s")
    report = build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    text = render_table(report)
    text += "\n" + truth_check(report.rows, sim.truth)
    if sim.truth_causes is not None:
        text += "\n" + cause_check(report.rows, sim.truth_causes, sim.truth).text
    text += "\n" + story()
    log(f"demo finished in {time.perf_counter() - started:.1f}s")
    return text


def ab_story(url: str, out_dir: Path, *, log: Callable[[str], None]) -> Callable[[], str]:
    """Simulate, import and audit the A/B story (`auditor.simulate.ab`); returns what prints
    its two comparisons once the rest of the demo is done.

    Its windows are audited before the demo's own, so the demo's window stays the latest
    audited (what `auditor report` shows by default). Outputs come from the simulated
    servers' counters written as CSV and their latency histograms stored directly: the demo
    runs without Prometheus (the tests read the same counters through one)."""
    from auditor.jobs.outputs_and_compare import (
        compare,
        import_outputs_csv,
        store_latency_rows,
    )
    from auditor.report.compare import render_compare_table
    from auditor.simulate.ab import NODE, simulate_ab

    ab = simulate_ab(out_dir)
    import_nvidia_smi(url, ab.node_csv, node=NODE)
    import_pods(url, ab.pods_json, config=Config())
    for window in ab.windows.values():
        audit(url, window=window, thresholds=Thresholds())
    rows = (
        import_outputs_csv(url, ab.serving_csv).rows + import_outputs_csv(url, ab.training_csv).rows
    )
    store_latency_rows(url, ab.latency_rows)
    log(f"A/B story: 2 changes, {rows} output rows, audited before and after")

    def story() -> str:
        parts = ["A/B: did the change make the work cheaper?"]
        for what, title in (
            ("serving", "Serving abtest/chat: batch size 8 -> 32 (and 2 replicas -> 1)"),
            ("training", "Training abtest/resnet: DataLoader workers 2 -> 8"),
        ):
            result = compare(url, ab.selection(what, "A"), ab.selection(what, "B"))
            parts.append(f"\n{title}\n{render_compare_table(result)}")
        return "\n".join(parts)

    return story


def truth_check(rows: pd.DataFrame, truth: pd.DataFrame) -> str:
    """Audit vs simulator ground truth per category, fleet-wide, in GPU-hours."""
    from auditor.model import CATEGORIES

    audited = {c.value: float(rows[f"{c.value}_gpu_hours"].sum()) for c in CATEGORIES}
    true = truth.groupby("category")["gpu_seconds"].sum() / 3600.0
    lines = [
        "Audit vs the simulator's ground truth (GPU-hours):",
        f"  {'category':<16}{'truth':>10}{'audit':>10}",
    ]
    for c in CATEGORIES:
        lines.append(
            f"  {c.value:<16}{float(true.get(c.value, 0.0)):>10.2f}{audited[c.value]:>10.2f}"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class CauseCheck:
    """The audit's causes against the simulator's, per team × cause, in GPU-hours."""

    audited: pd.DataFrame
    """team × (category, cause)."""
    truth: pd.DataFrame
    off_pct: pd.DataFrame
    """|audit − truth| as a percentage of the team's held GPU-hours (the platform's: its
    unallocated and unobserved hours)."""
    text: str

    def worst(self, category: str | None = None) -> tuple[str, str, float]:
        """(team, category/cause, % of held hours) of the largest difference (within
        `category`'s causes, when given)."""
        off = self.off_pct
        if category is not None:
            off = off[[k for k in off.columns if k.startswith(f"{category}/")]]
        stacked = off.stack()
        team, cause = stacked.idxmax()  # type: ignore[misc]
        return str(team), str(cause), float(stacked.to_numpy().max())


def cause_check(rows: pd.DataFrame, truth_causes: pd.DataFrame, truth: pd.DataFrame) -> CauseCheck:
    """Audit vs simulator ground truth per cause: the fleet's table, and per split the
    worst team × cause difference as a share of that team's held hours (the platform's:
    its free and unobserved hours)."""
    import pandas as pd

    truth_causes = truth_causes.assign(key=truth_causes["category"] + "/" + truth_causes["cause"])
    keys = list(dict.fromkeys(truth_causes["key"]))
    true = (
        truth_causes.pivot_table(
            index="team", columns="key", values="gpu_seconds", aggfunc="sum", fill_value=0.0
        ).reindex(columns=keys, fill_value=0.0)
        / 3600.0
    )
    rows = rows.set_index("team")
    audited = pd.DataFrame(
        {k: rows[f"{k.replace('/', '_')}_gpu_hours"] for k in keys}, index=rows.index
    ).reindex(true.index, fill_value=0.0)
    held = truth.groupby("team")["gpu_seconds"].sum() / 3600.0
    off = (audited - true).abs().div(held.reindex(true.index), axis=0) * 100.0
    lines = [
        "Audit vs the simulator's ground truth per cause (GPU-hours):",
        f"  {'category/cause':<28}{'truth':>10}{'audit':>10}",
    ]
    for k in keys:
        lines.append(f"  {k:<28}{float(true[k].sum()):>10.2f}{float(audited[k].sum()):>10.2f}")
    check = CauseCheck(audited, true, off, "")
    for category in dict.fromkeys(truth_causes["category"]):
        team, cause, pct = check.worst(category)
        lines.append(
            f"  worst team × cause of {category}: {team} {cause}, {pct:.3f} % of held hours"
        )
    return CauseCheck(audited, true, off, "\n".join(lines) + "\n")
