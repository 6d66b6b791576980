"""SPEC §10's causes in the simulator: the demo cluster's audit splits `compute_idle` as the
simulator's truth does (per team × cause within 1 % of held hours), the signal file is
OpenMetrics whose counters give back the stored ratios, the free-card story (a cordon, pods
waiting) is in the kubectl files, and the category truth is what it was before any of it.

The files are read with the standard library and prometheus_client's OpenMetrics parser,
independently of the simulator's own code."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from auditor import jobs
from auditor.jobs.demo import CauseCheck, cause_check
from auditor.jobs.signals import store_signal_rows
from auditor.model import PLATFORM_TEAM
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, SimulationResult, simulate

TRUTH_SHA256 = {
    # truth.csv and truth_detail.csv as the simulator wrote them before it simulated causes
    ("small", "truth.csv"): "7ff15b063b85192e454a680165b24e3accd11aedbb3422fd59fcc011c2e0c4be",
    ("small", "truth_detail.csv"): (
        "e8d0c67a7a0ae43261bcec0bae5097da5b20421d3e06de139a14343f38a45e49"
    ),
    ("demo", "truth.csv"): "c1717f5008c0db4215157562f4efb2e0487f6da383bd9a3cb443898634d14ee8",
    ("demo", "truth_detail.csv"): (
        "0602c57113d59eb61e95115a8e3dbdeabde98f30d86867d631d5e0caf9a84ec6"
    ),
}


def _ms(stamp: str) -> int:
    return (
        int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()) * 1000
    )


def _pipeline(out: Path, name: str) -> tuple[SimulationResult, CauseCheck]:
    """Simulate, import (samples, pods, the waits, the nodes), store the signal rows, audit."""
    sim = simulate(out / "cluster", scenario=SCENARIOS[name])
    url = f"sqlite:///{out / 'a.db'}"
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    for path in (sim.pods_json, sim.watch_json, sim.nodes_json):
        assert path is not None
        jobs.import_pods(url, path, config=Config())
    assert sim.signals is not None
    assert sim.truth_causes is not None
    store_signal_rows(url, sim.signals.pod_rows, sim.signals.card_rows)
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    return sim, cause_check(report.rows, sim.truth_causes, sim.truth)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulationResult, CauseCheck]:
    return _pipeline(tmp_path_factory.mktemp("small-causes"), "small")


@pytest.fixture(scope="module")
def hour(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    """The small cluster for an hour: its signal file parses in a second or two."""
    scenario = replace(SCENARIOS["small"], hours=1.0, lead_in_minutes=10.0)
    return simulate(tmp_path_factory.mktemp("hour"), scenario=scenario)


# --- the done-when: audit and truth agree per team × cause -------------------------------------


def _agrees(check: CauseCheck, *, every_cause: bool) -> None:
    idle = [k for k in check.truth.columns if k.startswith("compute_idle/")]
    off = check.off_pct[idle].drop(index=PLATFORM_TEAM)
    team, cause, pct = check.worst("compute_idle")
    print(f"\nworst compute_idle team x cause: {team} {cause} {pct:.4f} % of held hours")
    assert (off <= 1.0).all().all(), off.round(3).to_dict()
    if every_cause:  # every cause of compute_idle is somewhere, and the audit sees it there
        assert (check.truth[idle].sum() > 0.1).all()
        assert (check.audited[idle].sum() > 0.1).all()


def test_the_audit_splits_compute_idle_as_the_truth_does(
    small: tuple[SimulationResult, CauseCheck],
) -> None:
    _agrees(small[1], every_cause=False)


@pytest.mark.slow
def test_the_demo_audit_splits_compute_idle_as_the_truth_does(tmp_path: Path) -> None:
    _agrees(_pipeline(tmp_path, "demo")[1], every_cause=True)


def test_the_causes_of_a_category_sum_to_it(small: tuple[SimulationResult, CauseCheck]) -> None:
    sim, check = small
    cats = sim.truth.pivot_table(index="team", columns="category", values="gpu_seconds") / 3600
    for category in ("compute_idle", "unallocated"):
        mine = [k for k in check.truth.columns if k.startswith(f"{category}/")]
        truth_sum = check.truth[mine].sum(axis=1)
        audit_sum = check.audited[mine].sum(axis=1)
        np.testing.assert_allclose(truth_sum, cats.loc[truth_sum.index, category], atol=1e-6)
        np.testing.assert_allclose(audit_sum, truth_sum, atol=0.01)


def test_the_free_card_story_is_in_the_truth(small: tuple[SimulationResult, CauseCheck]) -> None:
    sim, check = small
    free = check.truth.loc[PLATFORM_TEAM]
    assert free["unallocated/unavailable"] > 1.0
    assert free["unallocated/blocked"] > 1.0
    assert free["unallocated/no_demand"] > 1.0
    # unavailable: at most the cordoned node's cards for the cordon's length
    assert sim.cordon is not None
    hours = (sim.window_end_ms - sim.cordon.start_ms) / 3.6e6
    assert free["unallocated/unavailable"] <= SCENARIOS["small"].gpus_per_node * hours


# --- the category truth stays what it was ------------------------------------------------------


def test_the_category_truth_is_unchanged(
    tmp_path: Path, small: tuple[SimulationResult, CauseCheck]
) -> None:
    demo = simulate(tmp_path / "demo", scenario=SCENARIOS["demo"])
    for (name, file), want in TRUTH_SHA256.items():
        out = small[0].out_dir if name == "small" else demo.out_dir
        assert hashlib.sha256((out / file).read_bytes()).hexdigest() == want, (name, file)


# --- the signal file ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(hour: SimulationResult) -> pd.DataFrame:
    """Every sample of the hour's signal file, parsed by prometheus_client."""
    return _samples(hour)


def _samples(result: SimulationResult) -> pd.DataFrame:
    assert result.signals_om is not None
    rows: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(result.signals_om.read_text(encoding="utf-8")):
        for s in family.samples:
            assert s.timestamp is not None
            rows.append(
                {
                    "family": family.name,
                    "type": family.type,
                    "name": s.name,
                    "value": s.value,
                    "t_ms": round(float(s.timestamp) * 1000),
                    **s.labels,
                }
            )
    return pd.DataFrame(rows)


def test_the_signal_file_is_openmetrics_of_the_exporters(samples: pd.DataFrame) -> None:
    got = samples
    kinds = got.groupby("name")["type"].first().to_dict()
    for counter in (
        "container_cpu_usage_seconds_total",
        "container_cpu_cfs_periods_total",
        "container_cpu_cfs_throttled_periods_total",
        "container_pressure_cpu_waiting_seconds_total",
        "container_pressure_io_waiting_seconds_total",
        "container_network_receive_bytes_total",
        "container_network_transmit_bytes_total",
    ):
        assert kinds[counter] == "counter", counter
    for gauge in (
        "container_spec_cpu_quota",
        "container_spec_cpu_period",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert kinds[gauge] == "gauge", gauge
    cpu = got[got["name"] == "container_cpu_usage_seconds_total"]
    assert cpu[["namespace", "pod", "container"]].notna().all().all()
    dcgm = got[got["name"] == "DCGM_FI_PROF_PCIE_RX_BYTES"]
    assert dcgm[["UUID", "gpu", "Hostname"]].notna().all().all()
    # counters never go down within a series
    keys = ["name", "namespace", "pod", "container", "interface"]
    for _, s in got[got["type"] == "counter"].groupby(keys, dropna=False):
        assert (np.diff(s.sort_values("t_ms")["value"].to_numpy()) >= 0).all()


def _rates(got: pd.DataFrame, name: str, by: list[str]) -> pd.DataFrame:
    """Per series and scrape after the first: the counter's increase and the time since."""
    s = got[got["name"] == name].sort_values([*by, "t_ms"])
    g = s.groupby(by, dropna=False)
    return s.assign(inc=g["value"].diff(), dt_s=g["t_ms"].diff() / 1000.0).dropna(subset=["inc"])


def test_the_counters_give_back_the_rows(hour: SimulationResult, samples: pd.DataFrame) -> None:
    assert hour.signals is not None
    got = samples
    pods = json.loads(hour.pods_json.read_text(encoding="utf-8"))["items"]
    uid = {(p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"] for p in pods}
    rows = hour.signals.pod_rows
    cad = rows[rows["source"] == "cadvisor"].set_index(["pod_uid", "ts_ms"])
    by = ["namespace", "pod"]

    def keyed(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(
            pod_uid=[uid[(n, p)] for n, p in zip(frame["namespace"], frame["pod"], strict=True)]
        ).set_index(["pod_uid", "t_ms"])

    usage = keyed(_rates(got, "container_cpu_usage_seconds_total", by))
    quota = got[got["name"] == "container_spec_cpu_quota"]["value"].unique()
    period = got[got["name"] == "container_spec_cpu_period"]["value"].unique()
    assert quota.size == period.size == 1
    ratio = usage["inc"] / usage["dt_s"] / (quota[0] / period[0])
    assert len(ratio) == len(cad) > 0
    np.testing.assert_allclose(ratio.reindex(cad.index), cad["cpu_limit_ratio"], rtol=1e-9)
    periods = keyed(_rates(got, "container_cpu_cfs_periods_total", by))
    throttled = keyed(_rates(got, "container_cpu_cfs_throttled_periods_total", by))
    np.testing.assert_allclose(
        (throttled["inc"] / periods["inc"]).reindex(cad.index), cad["throttled_ratio"], rtol=1e-9
    )
    for name, column in (
        ("container_pressure_cpu_waiting_seconds_total", "cpu_pressure"),
        ("container_pressure_io_waiting_seconds_total", "io_pressure"),
    ):
        psi = keyed(_rates(got, name, by))
        np.testing.assert_allclose(
            (psi["inc"] / psi["dt_s"]).reindex(cad.index), cad[column], rtol=1e-9, atol=1e-12
        )
    rx = keyed(_rates(got, "container_network_receive_bytes_total", by))
    tx = keyed(_rates(got, "container_network_transmit_bytes_total", by))
    net = (rx["inc"] + tx["inc"]) / rx["dt_s"]
    np.testing.assert_allclose(net.reindex(cad.index), cad["net_bytes_s"], rtol=1e-9)
    # cAdvisor gives no serving gauges, vLLM nothing but them
    assert cad[["requests_running", "requests_waiting"]].isna().all().all()
    srv = rows[rows["source"] == "serving"].set_index(["pod_uid", "ts_ms"])
    assert srv[["cpu_limit_ratio", "net_bytes_s"]].isna().all().all()
    running = keyed(got[got["name"] == "vllm:num_requests_running"])
    np.testing.assert_array_equal(running["value"].reindex(srv.index), srv["requests_running"])
    # dcgm-exporter: PCIe rx + tx, NVLink rx + tx per card and scrape
    cards = hour.signals.card_rows.set_index(["gpu_uuid", "ts_ms"])
    for prefix, column in (("PCIE", "pcie_bytes_s"), ("NVLINK", "nvlink_bytes_s")):
        both = got[got["name"].isin([f"DCGM_FI_PROF_{prefix}_RX_BYTES",
                                     f"DCGM_FI_PROF_{prefix}_TX_BYTES"])]  # fmt: skip
        summed = both.groupby(["UUID", "t_ms"])["value"].sum()
        np.testing.assert_array_equal(summed.reindex(cards.index), cards[column])


def test_every_scrape_is_well_inside_the_stale_limit(hour: SimulationResult) -> None:
    assert hour.signals is not None
    for frame, key in (
        (hour.signals.pod_rows, ["pod_uid", "source"]),
        (hour.signals.card_rows, ["gpu_uuid"]),
    ):
        spacing = frame.sort_values("ts_ms").groupby(key)["ts_ms"].diff().dropna()
        assert spacing.median() == 30_000
        assert spacing.max() <= 10 * 60_000  # one node's kubelet was not scraped for a while
    # a pod cAdvisor misses has no rows at all, and a training pod no serving rows
    stories = {hour.signals.stories[i].story for i in range(len(hour.signals.stories))}
    assert "unrecorded" in stories


# --- the kubectl files of the free-card story ---------------------------------------------------


def test_the_cordon_and_the_waits_are_in_the_kubectl_files(
    small: tuple[SimulationResult, CauseCheck],
) -> None:
    hour = small[0]
    assert hour.nodes_json is not None
    assert hour.watch_json is not None
    nodes = json.loads(hour.nodes_json.read_text(encoding="utf-8"))["items"]
    cordoned = [n for n in nodes if n["spec"].get("unschedulable")]
    assert len(cordoned) == 1
    (taint,) = cordoned[0]["spec"]["taints"]
    assert taint["key"] == "node.kubernetes.io/unschedulable"
    since = _ms(taint["timeAdded"])
    assert hour.cordon is not None
    assert since == hour.cordon.start_ms
    # nothing is bound to the cordoned node while it is cordoned
    pods = json.loads(hour.pods_json.read_text(encoding="utf-8"))["items"]
    for pod in pods:
        if pod["spec"].get("nodeName") != cordoned[0]["metadata"]["name"]:
            continue
        scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert _ms(scheduled[0]["lastTransitionTime"]) < since
    # still-pending pods: Unschedulable with the scheduler's message, on no node
    pending = [p for p in pods if p["status"]["phase"] == "Pending"]
    assert pending
    for pod in pending:
        (cond,) = pod["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert cond["message"].startswith(f"0/{len(nodes)} nodes are available: ")
        assert "nodeName" not in pod["spec"]
    # the watch stream: every wait ADDED Pending, Unschedulable
    text = hour.watch_json.read_text(encoding="utf-8")
    decoder, pos, events = json.JSONDecoder(), 0, []
    while pos < len(text.rstrip()):
        obj, end = decoder.raw_decode(text, pos)
        events.append(obj)
        pos = end + 1
    assert len(events) == len(hour.waits)
    assert all(e["type"] == "ADDED" and e["object"]["status"]["phase"] == "Pending" for e in events)
