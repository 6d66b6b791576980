"""`auditor simulate`: deterministic, real-format files, first-fit placement, a conserved truth.

Everything here reads the written files with the standard library (csv, json), independently
of the generator's own code, and re-derives what it checks (placement, capacity, holds).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import time
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from auditor.model import CATEGORIES, PLATFORM_TEAM, WasteCategory
from auditor.simulate import SCENARIOS, Scenario, SimulationResult, simulate

HEADER = [
    "timestamp",
    "index",
    "uuid",
    "name",
    "utilization.gpu [%]",
    "memory.used [MiB]",
    "memory.total [MiB]",
    "power.draw [W]",
    "clocks.sm [MHz]",
    "temperature.gpu",
    "clocks_event_reasons.active",
]
ROW = re.compile(
    r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}, \d+, GPU-[0-9a-f-]{36}, NVIDIA H100 80GB HBM3, "
    r"\d{1,3} %, \d+ MiB, 81559 MiB, \d+\.\d{2} W, \d+ MHz, \d+, 0x[0-9A-F]{16}$"
)
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
OWNER_KINDS = {"Job", "PyTorchJob", "ReplicaSet", "StatefulSet", "DaemonSet"}


def _ms(stamp: str) -> int:
    return (
        int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()) * 1000
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    return simulate(tmp_path_factory.mktemp("small"), scenario=SCENARIOS["small"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    return simulate(tmp_path_factory.mktemp("demo"), scenario=SCENARIOS["demo"])


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


_SAMPLES: dict[Path, pd.DataFrame] = {}


def _samples(result: SimulationResult) -> pd.DataFrame:
    """Every data row of every node CSV, parsed with the csv module (cached per output)."""
    if result.out_dir in _SAMPLES:
        return _SAMPLES[result.out_dir]
    rows: list[tuple[str, int, str, str, int]] = []
    for node, path in result.node_csvs.items():
        with path.open(newline="", encoding="utf-8") as f:
            for cells in csv.reader(f, skipinitialspace=True):
                if cells[0] == "timestamp":
                    continue
                rows.append((node, int(cells[1]), cells[2], cells[0], int(cells[4].split()[0])))
    frame = pd.DataFrame(rows, columns=["node", "index", "uuid", "stamp", "util"])
    stamps = pd.to_datetime(frame["stamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True)
    frame["ts_ms"] = stamps.astype("datetime64[ms, UTC]").astype("int64")
    _SAMPLES[result.out_dir] = frame
    return frame


def _pods(result: SimulationResult) -> list[dict[str, Any]]:
    doc = json.loads(result.pods_json.read_text(encoding="utf-8"))
    assert doc["kind"] == "List"
    assert doc["apiVersion"] == "v1"
    items: list[dict[str, Any]] = doc["items"]
    return items


def _gpus(pod: dict[str, Any]) -> int:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return int(limits.get("nvidia.com/gpu", 0))


def _hold(pod: dict[str, Any]) -> tuple[int, int | None] | None:
    """(bound, released or None) by SPEC §2.2, read from the pod JSON alone."""
    scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    if not scheduled or scheduled[0]["status"] != "True":
        return None
    bound = _ms(scheduled[0]["lastTransitionTime"])
    states = [s["state"] for s in pod["status"].get("containerStatuses", [])]
    ends = []
    if states and all("terminated" in s for s in states):
        ends.append(max(_ms(s["terminated"]["finishedAt"]) for s in states))
    if "deletionTimestamp" in pod["metadata"]:
        ends.append(_ms(pod["metadata"]["deletionTimestamp"]))
    return bound, min(ends) if ends else None


# --- determinism -----------------------------------------------------------------------------


def test_same_seed_writes_identical_bytes(tmp_path: Path, small: SimulationResult) -> None:
    again = simulate(tmp_path / "again", scenario=SCENARIOS["small"])
    assert _files(again.out_dir) == _files(small.out_dir)


def test_another_seed_writes_other_files(tmp_path: Path, small: SimulationResult) -> None:
    other = simulate(tmp_path / "other", scenario=SCENARIOS["small"].with_seed(8))
    first, second = _files(small.out_dir), _files(other.out_dir)
    assert first["pods.json"] != second["pods.json"]
    assert all(first[k] != second[k] for k in first if k.startswith("nodes/"))


# --- the nvidia-smi CSV ----------------------------------------------------------------------


def test_node_csv_is_nvidia_smi_output(small: SimulationResult) -> None:
    scenario = SCENARIOS["small"]
    for path in small.node_csvs.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        header = next(csv.reader([lines[0]], skipinitialspace=True))
        assert header == HEADER
        data = [line for line in lines if not line.startswith("timestamp")]
        assert all(ROW.match(line) for line in data)
        cells = list(csv.reader(data, skipinitialspace=True))
        assert all(len(c) == len(HEADER) for c in cells)
        # A row per GPU at each tick, in index order.
        indices = [int(c[1]) for c in cells]
        g = scenario.gpus_per_node
        assert indices == list(range(g)) * (len(indices) // g)
        utils = [int(c[4].split()[0]) for c in cells]
        assert min(utils) >= 0
        assert max(utils) <= 100


def test_node_csv_timestamps_are_utc_ticks_with_jitter(small: SimulationResult) -> None:
    samples = _samples(small)
    scenario = SCENARIOS["small"]
    for _, gpu in samples.groupby("uuid"):
        ts = gpu["ts_ms"].to_numpy()
        spacing = np.diff(ts)
        assert (spacing > 0).all()
        assert float(np.median(spacing)) == pytest.approx(scenario.period_ms, abs=50)
        offset = (ts - scenario.data_start_ms) % scenario.period_ms
        assert offset.max() < 1000  # within a second after the nominal tick
    assert samples["ts_ms"].min() >= scenario.data_start_ms
    assert samples["ts_ms"].max() < scenario.end_ms


def test_outage_is_missing_rows_and_a_repeated_header(small: SimulationResult) -> None:
    assert small.outages
    samples = _samples(small)
    for outage in small.outages:
        rows = samples[samples["node"] == outage.node]
        inside = rows[(rows["ts_ms"] >= outage.start_ms) & (rows["ts_ms"] < outage.end_ms)]
        assert inside.empty
        spacing = np.diff(np.sort(rows[rows["index"] == 0]["ts_ms"].to_numpy()))
        assert spacing.max() >= outage.end_ms - outage.start_ms
        text = small.node_csvs[outage.node].read_text(encoding="utf-8")
        assert text.count("timestamp, index") == 2
    quiet = set(small.node_csvs) - {o.node for o in small.outages}
    for node in quiet:
        assert small.node_csvs[node].read_text(encoding="utf-8").count("timestamp, index") == 1


# --- the kubectl pod list --------------------------------------------------------------------


def test_pods_json_has_the_shapes_of_real_controllers(small: SimulationResult) -> None:
    pods = _pods(small)
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods] == sorted(
        (p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods
    )
    kinds: set[str] = set()
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        assert pod["kind"] == "Pod"
        assert RFC3339.match(meta["creationTimestamp"])
        for condition in status["conditions"]:
            assert RFC3339.match(condition["lastTransitionTime"])
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] in OWNER_KINDS
        assert owner["controller"] is True
        if not _gpus(pod):
            continue
        kinds.add(owner["kind"])
        labels = meta["labels"]
        assert labels["team"]
        if owner["kind"] == "PyTorchJob":
            assert owner["apiVersion"] == "kubeflow.org/v1"
            assert labels["training.kubeflow.org/job-name"] == owner["name"]
            assert labels["training.kubeflow.org/replica-type"] in {"master", "worker"}
            assert labels["training.kubeflow.org/replica-index"].isdigit()
        elif owner["kind"] == "ReplicaSet":
            assert owner["name"].endswith("-" + labels["pod-template-hash"])
            assert meta["name"].startswith(owner["name"] + "-")
        elif owner["kind"] == "StatefulSet":
            assert labels["notebook-name"] == owner["name"]
            assert meta["name"] == owner["name"] + "-0"
        elif owner["kind"] == "Job":
            assert labels["batch.kubernetes.io/job-name"] == owner["name"]
        if "nodeName" not in spec:
            assert status["phase"] == "Pending"
            continue
        bound, released = _hold(pod) or (None, None)
        assert bound is not None
        assert bound <= _ms(status["startTime"])
        assert _ms(meta["creationTimestamp"]) <= bound
        for cs in status["containerStatuses"]:
            state = cs["state"].get("running") or cs["state"]["terminated"]
            assert _ms(state["startedAt"]) >= bound
        if released is None:
            assert status["phase"] == "Running"
    assert kinds == {"Job", "PyTorchJob", "ReplicaSet", "StatefulSet"}


def test_uids_are_unique(small: SimulationResult) -> None:
    uids = [p["metadata"]["uid"] for p in _pods(small)]
    assert len(uids) == len(set(uids))


# --- placement -------------------------------------------------------------------------------


Holds = dict[tuple[str, int], list[tuple[int, float, str]]]


def _first_fit(pods: list[dict[str, Any]], gpus_per_node: int) -> Holds:
    """SPEC §2.2's rule, re-derived from the JSON: (node, index) -> [(bound, released, uid)]."""
    held: Holds = defaultdict(list)
    waiting = []
    for pod in pods:
        hold = _hold(pod)
        if not _gpus(pod) or hold is None:
            continue
        meta = pod["metadata"]
        released = float("inf") if hold[1] is None else hold[1]
        waiting.append(
            (
                hold[0],
                meta["namespace"],
                meta["name"],
                released,
                meta["uid"],
                pod["spec"]["nodeName"],
                _gpus(pod),
            )
        )
    for bound, _, _, released, uid, node, count in sorted(waiting):
        free = [
            i
            for i in range(gpus_per_node)
            if all(not (b <= bound < r) for b, r, _ in held[(node, i)])
        ]
        assert len(free) >= count, f"{uid} finds too few free GPUs"
        for i in free[:count]:
            held[(node, i)].append((bound, released, uid))
    return held


@pytest.mark.parametrize("name", ["small", "demo"])
def test_first_fit_mapping_matches_and_never_overlaps(
    name: str, small: SimulationResult, demo: SimulationResult
) -> None:
    result = {"small": small, "demo": demo}[name]
    held = _first_fit(_pods(result), SCENARIOS[name].gpus_per_node)
    for tenures in held.values():
        spans = sorted((b, r) for b, r, _ in tenures)
        assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(spans))
    inferred = {(uid, node, i) for (node, i), ts in held.items() for _, _, uid in ts}
    generated = set(
        zip(
            result.assignments["pod_uid"],
            result.assignments["node"],
            result.assignments["gpu_index"],
            strict=True,
        )
    )
    assert inferred == generated


def test_only_held_cards_compute(small: SimulationResult) -> None:
    held = _first_fit(_pods(small), SCENARIOS["small"].gpus_per_node)
    samples = _samples(small)
    busy = samples[samples["util"] > 5]
    for (node, index), rows in busy.groupby(["node", "index"]):
        spans = held.get((str(node), int(str(index))), [])
        ts = rows["ts_ms"].to_numpy()
        inside = np.zeros(ts.size, dtype=bool)
        for bound, released, _ in spans:
            inside |= (ts >= bound) & (ts < released)
        assert inside.all(), f"{node}/{index} computes while nobody holds it"


# --- the truth -------------------------------------------------------------------------------


def _capacity_seconds(result: SimulationResult, scenario: Scenario) -> float:
    """Per GPU, from its first to its last sample's coverage, clipped to the window."""
    total = 0.0
    for _, gpu in _samples(result).groupby("uuid"):
        ts = np.sort(gpu["ts_ms"].to_numpy())
        period = float(np.median(np.diff(ts)))
        start = max(ts[0], scenario.start_ms)
        end = min(ts[-1] + period, scenario.end_ms)
        total += (end - start) / 1000
    return total


@pytest.mark.parametrize("name", ["small", "demo"])
def test_truth_conserves_capacity(
    name: str, small: SimulationResult, demo: SimulationResult
) -> None:
    result, scenario = {"small": small, "demo": demo}[name], SCENARIOS[name]
    truth = pd.read_csv(result.truth_csv)
    assert list(truth.columns) == ["team", "category", "gpu_seconds"]
    assert set(truth["category"]) == {c.value for c in CATEGORIES}
    assert (truth["gpu_seconds"] >= 0).all()
    capacity = _capacity_seconds(result, scenario)
    assert truth["gpu_seconds"].sum() == pytest.approx(capacity, abs=1.0)
    assert capacity == pytest.approx(scenario.total_gpus * scenario.hours * 3600, rel=1e-5)
    # Per GPU as well: the detail sums to each card's whole window.
    per_gpu = result.truth_detail.groupby("gpu_uuid")["gpu_seconds"].sum()
    assert per_gpu.to_numpy() == pytest.approx(scenario.hours * 3600, abs=1.0)


@pytest.mark.parametrize("name", ["small", "demo"])
def test_each_team_sums_to_its_held_seconds(
    name: str, small: SimulationResult, demo: SimulationResult
) -> None:
    result, scenario = {"small": small, "demo": demo}[name], SCENARIOS[name]
    held: dict[str, float] = defaultdict(float)
    for pod in _pods(result):
        hold = _hold(pod)
        if not _gpus(pod) or hold is None:
            continue
        end = scenario.end_ms if hold[1] is None else min(hold[1], scenario.end_ms)
        seconds = max(0, end - max(hold[0], scenario.start_ms)) / 1000
        held[pod["metadata"]["labels"]["team"]] += seconds * _gpus(pod)
    truth = result.truth.groupby("team")["gpu_seconds"].sum()
    for team, seconds in held.items():
        assert truth[team] == pytest.approx(seconds, abs=1.0)
    platform = result.truth[result.truth["team"] == PLATFORM_TEAM]
    assert set(platform[platform["gpu_seconds"] > 0]["category"]) <= {
        WasteCategory.UNALLOCATED.value,
        WasteCategory.UNOBSERVED.value,
    }


@pytest.mark.parametrize("name", ["small", "demo"])
def test_every_category_appears(name: str, small: SimulationResult, demo: SimulationResult) -> None:
    truth = {"small": small, "demo": demo}[name].truth
    per_category = truth.groupby("category")["gpu_seconds"].sum()
    assert {c for c, s in per_category.items() if s > 60} == {c.value for c in CATEGORIES}
    teams = set(truth[truth["gpu_seconds"] > 0]["team"])
    assert teams == {"vision", "nlp", "recsys", "research", PLATFORM_TEAM}


def test_scenario_json_records_window_seed_and_knobs(small: SimulationResult) -> None:
    meta = json.loads(small.scenario_json.read_text(encoding="utf-8"))
    scenario = SCENARIOS["small"]
    assert meta["window"]["start_ms"] == scenario.start_ms == small.window_start_ms
    assert meta["window"]["end_ms"] == scenario.end_ms == small.window_end_ms
    assert meta["seed"] == scenario.seed
    assert meta["scenario"] == scenario.as_dict()
    assert meta["dropped_workloads"] == []
    assert len(meta["outages"]) == scenario.outages


def test_scenario_rejects_periods_that_do_not_tile_the_window() -> None:
    with pytest.raises(ValueError, match="hours"):
        replace(SCENARIOS["small"], hours=1.0001)
    with pytest.raises(ValueError, match="period_s"):
        replace(SCENARIOS["small"], period_s=0.0005)


@pytest.mark.slow
def test_large_generation_time(tmp_path: Path) -> None:
    started = time.perf_counter()
    result = simulate(tmp_path, scenario=SCENARIOS["large"])
    elapsed = time.perf_counter() - started
    print(
        f"\nsimulate large: {result.samples} samples of {SCENARIOS['large'].total_gpus} GPUs "
        f"in {elapsed:.2f} s"
    )
    assert result.samples > 1_000_000
