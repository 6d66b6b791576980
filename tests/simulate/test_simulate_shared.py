"""The `shared` simulator preset (SPEC §7): real-format inputs for MIG, time-slicing, HAMi and
whole cards, and a truth that conserves each physical card.

The checks re-derive what they assert from the written files (node labels, pod resources and
annotations, dcgm labels) with the standard library, not from the generator's own records.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from promserver import binaries, serve_openmetrics
from sqlalchemy import text

from auditor import jobs
from auditor.model import CATEGORIES, PLATFORM_TEAM
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate
from auditor.simulate.sharedcluster import SharedResult
from auditor.simulate.sharedpreset import SHARED_SCENARIOS, simulate_shared

# sha256 over (relative path, bytes) of every file the preset writes, taken before the
# simulator learnt shared cards: the whole-card presets must not move by one byte. Taken
# again when the thresholds gained the cause knobs of SPEC §10 (scenario.json records the
# thresholds; every other file stayed byte-identical), and again for
# `checkpoint_min_samples` (the same: scenario.json gained one line).
WHOLE_CARD_DIGESTS = {
    "small": "db0a398a54959064c5449ba52bdeb073c71c2ebb08eb824b409e908d9d8b2f56",
    "demo": "448e9a36e4c678535e9e0633ccb708307cb7be017aec1d9f1092fa3d0f373a61",
}
HOURS = SHARED_SCENARIOS["shared"].hours
MIG_SLICES = 7
METRIC = re.compile(r"^(\w+)\{(.*)\} (\S+) (\d+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


CAUSE_FILES = frozenset({"signals.om.txt", "truth_causes.csv", "nodes.json", "pods-watch.json"})
"""Files the whole-card presets write since they simulate SPEC §10's causes, on a random
stream of their own: every file written before stays byte-identical, which the digests pin."""


def _digest(root: Path, *, skip: frozenset[str] = frozenset()) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and str(p.relative_to(root)) not in skip:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _ms(stamp: str) -> int:
    when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return int(when.timestamp()) * 1000


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> SharedResult:
    return simulate_shared(tmp_path_factory.mktemp("shared"), scenario=SHARED_SCENARIOS["shared"])


@pytest.mark.parametrize("name", ["small", pytest.param("demo", marks=pytest.mark.slow)])
def test_whole_card_presets_are_byte_identical(tmp_path: Path, name: str) -> None:
    simulate(tmp_path, scenario=SCENARIOS[name])
    assert _digest(tmp_path, skip=CAUSE_FILES) == WHOLE_CARD_DIGESTS[name]


def test_shared_preset_is_deterministic(tmp_path: Path, shared: SharedResult) -> None:
    again = simulate_shared(tmp_path, scenario=SHARED_SCENARIOS["shared"])
    assert _digest(tmp_path) == _digest(shared.out_dir)
    other = simulate_shared(tmp_path / "other", scenario=SHARED_SCENARIOS["shared"].with_seed(3))
    assert _digest(other.out_dir) != _digest(again.out_dir)


def test_the_simulate_command_writes_the_shared_preset(
    tmp_path: Path, shared: SharedResult
) -> None:
    stats = jobs.simulate(tmp_path, scenario="shared")
    assert "10 GPUs (shared)" in stats.summary
    assert _digest(tmp_path) == _digest(shared.out_dir)


def _nodes(result: SharedResult) -> dict[str, dict[str, Any]]:
    doc = json.loads(result.nodes_json.read_text())
    assert doc["kind"] == "List"
    return {n["metadata"]["name"]: n for n in doc["items"]}


def _pods(result: SharedResult) -> list[dict[str, Any]]:
    doc = json.loads(result.pods_json.read_text())
    return [p for p in doc["items"] if p["metadata"]["namespace"] != "kube-system"]


def _limits(pod: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in pod["spec"]["containers"]:
        out.update(c["resources"]["limits"])
    return out


def _card_memory(result: SharedResult) -> dict[str, int]:
    """GPU UUID -> memory.total, from the nvidia-smi CSVs."""
    out = {}
    for path in result.node_csvs.values():
        with path.open(newline="") as f:
            for row in csv.reader(f, skipinitialspace=True):
                if row[0] != "timestamp":
                    out[row[2]] = int(row[6].split()[0])
    return out


def _mig_instances(result: SharedResult) -> dict[tuple[str, str], str]:
    """(parent UUID, GPU_I_ID) -> profile, and the pods seen on each, from the OpenMetrics."""
    assert result.openmetrics is not None
    out = {}
    for line in result.openmetrics.read_text().splitlines():
        m = METRIC.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(2)))
            out[labels["UUID"], labels["GPU_I_ID"]] = labels["GPU_I_PROFILE"]
    return out


def _shares_from_files(result: SharedResult) -> dict[str, float]:
    """Pod uid -> share of one card, as SPEC §7's table reads it from the files."""
    nodes = _nodes(result)
    memory = _card_memory(result)
    shares = {}
    for pod in _pods(result):
        limits = _limits(pod)
        labels = nodes[pod["spec"]["nodeName"]]["metadata"]["labels"]
        mig = [k for k in limits if k.startswith("nvidia.com/mig-")]
        notes = pod["metadata"].get("annotations", {})
        if mig:
            slices = int(mig[0].removeprefix("nvidia.com/mig-").split("g.")[0])
            shares[pod["metadata"]["uid"]] = slices / MIG_SLICES
        elif "hami.io/vgpu-devices-allocated" in notes:
            device = notes["hami.io/vgpu-devices-allocated"].split(";")[0].split(":")[0]
            uuid, vendor, mem, cores = device.split(",")
            assert vendor == "NVIDIA"
            assert int(mem) == int(limits["nvidia.com/gpumem"])
            share = int(cores) / 100 if int(cores) else int(mem) / memory[uuid]
            shares[pod["metadata"]["uid"]] = share
        elif "nvidia.com/gpu.replicas" in labels:
            replicas = int(limits["nvidia.com/gpu"])
            shares[pod["metadata"]["uid"]] = replicas / int(labels["nvidia.com/gpu.replicas"])
        else:
            shares[pod["metadata"]["uid"]] = float(limits["nvidia.com/gpu"])
    return shares


def _held_ms(pod: dict[str, Any], window: tuple[int, int]) -> int:
    status = pod["status"]
    bound = next(
        _ms(c["lastTransitionTime"]) for c in status["conditions"] if c["type"] == "PodScheduled"
    )
    ends = [
        _ms(s["state"]["terminated"]["finishedAt"])
        for s in status.get("containerStatuses", [])
        if "terminated" in s["state"]
    ]
    finished = max(ends) if ends and len(ends) == len(status["containerStatuses"]) else None
    deleted = pod["metadata"].get("deletionTimestamp")
    release = min(
        [t for t in (finished, None if deleted is None else _ms(deleted)) if t is not None],
        default=window[1],
    )
    return max(0, min(release, window[1]) - max(bound, window[0]))


def test_nodes_carry_the_sharing_labels_and_resources(shared: SharedResult) -> None:
    nodes = _nodes(shared)
    ts = nodes["gpu-h100-ts-01"]
    assert ts["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert ts["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert ts["status"]["allocatable"]["nvidia.com/gpu"] == "16"
    mig = nodes["gpu-a100-mig-01"]
    assert mig["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"
    carved = {
        k: int(v) for k, v in mig["status"]["capacity"].items() if k.startswith("nvidia.com/mig-")
    }
    # the dcgm series show the same instances the node advertises
    profiles: dict[str, int] = defaultdict(int)
    for profile in _mig_instances(shared).values():
        profiles[f"nvidia.com/mig-{profile}"] += 1
    assert carved == dict(profiles)
    # card 0 carves all seven slices, card 1 leaves one uncarved
    per_card: dict[str, int] = defaultdict(int)
    for (uuid, _), profile in _mig_instances(shared).items():
        per_card[uuid] += int(profile.split("g.")[0])
    assert sorted(per_card.values()) == [6, 7]


def test_mig_cards_are_only_in_dcgm_and_the_rest_only_in_nvidia_smi(shared: SharedResult) -> None:
    in_smi = set(_card_memory(shared))
    in_dcgm = {uuid for uuid, _ in _mig_instances(shared)}
    assert len(in_smi) == 8
    assert len(in_dcgm) == 2
    assert not in_smi & in_dcgm
    assert shared.physical_cards == 10


def test_hami_annotation_names_a_card_of_its_node(shared: SharedResult) -> None:
    with shared.node_csvs["gpu-h100-hami-01"].open(newline="") as f:
        uuids = {row[2] for row in csv.reader(f, skipinitialspace=True) if row[0] != "timestamp"}
    hami = [
        p
        for p in _pods(shared)
        if "hami.io/vgpu-devices-allocated" in p["metadata"].get("annotations", {})
    ]
    assert len(hami) == 4
    for pod in hami:
        notes = pod["metadata"]["annotations"]
        assert re.fullmatch(
            r"GPU-[0-9a-f-]{36},NVIDIA,\d+,\d+:;", notes["hami.io/vgpu-devices-allocated"]
        )
        assert notes["hami.io/vgpu-devices-allocated"].split(",")[0] in uuids
        assert notes["hami.io/vgpu-node"] == pod["spec"]["nodeName"] == "gpu-h100-hami-01"
        assert _limits(pod)["nvidia.com/gpu"] == "1"
    # the node registers its two physical cards as HAMi's device plugin does
    register = _nodes(shared)["gpu-h100-hami-01"]["metadata"]["annotations"]
    cards = [d.split(",")[0] for d in register["hami.io/node-nvidia-register"].split(":") if d]
    assert set(cards) == uuids
    # one asks for memory only: its share is its memory over the card's
    assert sum("nvidia.com/gpucores" not in _limits(p) for p in hami) == 1


def test_every_pod_within_its_share_holds_share_times_time(shared: SharedResult) -> None:
    """A tenant that never uses more than its share (MIG, HAMi caps its cores, whole cards)
    has categories summing to share × held time (SPEC §7), the share read from the files as
    §7's table says, under the true and the estimated attribution alike."""
    window = (shared.window_start_ms, shared.window_end_ms)
    shares = _shares_from_files(shared)
    nodes = _nodes(shared)
    expected = {
        pod["metadata"]["uid"]: shares[pod["metadata"]["uid"]] * _held_ms(pod, window) / 1000
        for pod in _pods(shared)
        if "nvidia.com/gpu.replicas" not in nodes[pod["spec"]["nodeName"]]["metadata"]["labels"]
    }
    assert len(expected) == 11
    detail = shared.truth_detail[shared.truth_detail["pod_uid"] != ""]
    for how, part in detail.groupby("attribution"):
        got = part.groupby("pod_uid")["gpu_seconds"].sum()
        for uid, seconds in expected.items():
            assert got.get(uid, 0.0) == pytest.approx(seconds, rel=1e-9, abs=1e-6), (how, uid)


def test_time_sliced_tenants_borrow_from_each_other_not_from_the_card(
    shared: SharedResult,
) -> None:
    """A notebook computing on more than its replicas' share while the others are quiet is
    busy beyond share × time (§7: busy_i = u_i); the others' idle shrinks by as much, so
    each card still sums to its time, and the tenants of a card together hold at most it."""
    window = (shared.window_start_ms, shared.window_end_ms)
    shares = _shares_from_files(shared)
    ts_pods = [p for p in _pods(shared) if p["spec"]["nodeName"] == "gpu-h100-ts-01"]
    assert len(ts_pods) == 8
    assert {_limits(p)["nvidia.com/gpu"] for p in ts_pods} == {"1", "2"}
    detail = shared.truth_detail[shared.truth_detail["attribution"] == "true"]
    got = detail.groupby("pod_uid")["gpu_seconds"].sum()
    nominal = {
        p["metadata"]["uid"]: shares[p["metadata"]["uid"]] * _held_ms(p, window) / 1000
        for p in ts_pods
    }
    over = [uid for uid, s in nominal.items() if got[uid] > s + 1]
    under = [uid for uid, s in nominal.items() if got[uid] < s - 1]
    assert over
    assert under
    ts_cards = set(detail.loc[detail["node"] == "gpu-h100-ts-01", "gpu_uuid"])
    assert len(ts_cards) == 4
    held = sum(got[uid] for uid in nominal)
    assert held <= len(ts_cards) * HOURS * 3600


def test_truth_conserves_each_physical_card(shared: SharedResult) -> None:
    """Capacity is physical cards × time, never instances or replicas."""
    window_s = HOURS * 3600
    per_card = shared.truth_detail.groupby(["attribution", "gpu_uuid"])["gpu_seconds"].sum()
    assert len(per_card) == 2 * shared.physical_cards
    for value in per_card:
        assert value == pytest.approx(window_s, rel=1e-9)
    for table in (shared.truth, shared.truth_estimated):
        assert table["gpu_seconds"].sum() == pytest.approx(shared.physical_cards * window_s)
        assert (table["gpu_seconds"] >= -1e-9).all()


def test_free_and_uncarved_capacity_is_the_platforms(shared: SharedResult) -> None:
    detail = shared.truth_detail[shared.truth_detail["attribution"] == "true"]
    platform = detail[detail["team"] == PLATFORM_TEAM]
    assert set(platform["category"]) <= {"unallocated", "unobserved"}
    mig_cards = {uuid for uuid, _ in _mig_instances(shared)}
    free = platform[platform["gpu_uuid"].isin(mig_cards)].groupby("gpu_uuid")["gpu_seconds"].sum()
    # card 1's uncarved slice is free the whole window: at least 1/7 of it
    assert free.max() >= HOURS * 3600 / MIG_SLICES


def test_estimated_attribution_moves_time_between_tenants_not_cards(shared: SharedResult) -> None:
    """The estimate (card utilisation split by share) keeps each card's busy time and each
    pod's held time; it moves time between tenants and categories where they differ."""
    d = shared.truth_detail
    busy_sums = d[d["category"] == "busy"].groupby(["gpu_uuid", "attribution"])["gpu_seconds"]
    busy = busy_sums.sum().unstack()
    assert (busy["true"] - busy["estimated"]).abs().max() < 1e-6 * HOURS * 3600
    true_t = shared.truth.set_index(["team", "category"])["gpu_seconds"]
    est_t = shared.truth_estimated.set_index(["team", "category"])["gpu_seconds"]
    assert (true_t - est_t).abs().max() > 600  # the scenario does exercise the estimate


def test_pods_and_nodes_parse_with_the_importer(tmp_path: Path, shared: SharedResult) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    jobs.import_pods(url, shared.nodes_json, config=Config())
    jobs.import_pods(url, shared.pods_json, config=Config())
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        pods = pd.read_sql(text("SELECT uid, gpu_count, node FROM pods"), conn)
        nodes = pd.read_sql(text("SELECT name, labels FROM nodes"), conn)
    assert set(pods["uid"]) == set(_shares_from_files(shared))
    whole = [p["metadata"]["uid"] for p in _pods(shared) if p["spec"]["nodeName"] == "gpu-h100-01"]
    assert (pods.set_index("uid").loc[whole, "gpu_count"] == 1).all()
    assert set(nodes["name"]) == set(_nodes(shared))
    stored: Any = nodes.set_index("name").loc["gpu-h100-ts-01", "labels"]
    labels = json.loads(stored) if isinstance(stored, str) else stored
    assert labels["nvidia.com/gpu.replicas"] == "4"


def _audit_shared(tmp_path: Path, result: SharedResult) -> pd.DataFrame:
    """Every input of the preset into SQLite (the dcgm series through a real Prometheus),
    then an audit of the window and the report per team, in GPU-hours."""
    found = binaries()
    if isinstance(found, str):
        pytest.skip(found)
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    for node, path in sorted(result.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, result.nodes_json, config=Config())
    jobs.import_pods(url, result.pods_json, config=Config())
    assert result.openmetrics is not None
    server = serve_openmetrics(result.openmetrics, tmp_path / "prom")
    try:
        jobs.import_prometheus(
            url,
            prometheus_url=server.url,
            window=(result.data_start_ms, result.window_end_ms),
            step_s=result.period_s,
        )
    finally:
        server.stop()
    jobs.audit(url, window=(result.window_start_ms, result.window_end_ms), thresholds=Thresholds())
    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    audited = report.rows.set_index("team")[[f"{c.value}_gpu_hours" for c in CATEGORIES]]
    audited.columns = pd.Index([c.value for c in CATEGORIES])
    return audited.sort_index()


def _hours(truth: pd.DataFrame) -> pd.DataFrame:
    table = truth.pivot_table(
        index="team", columns="category", values="gpu_seconds", aggfunc="sum", fill_value=0.0
    ).reindex(columns=[c.value for c in CATEGORIES], fill_value=0.0)
    return (table / 3600.0).sort_index()


@pytest.mark.slow
def test_shared_audit_matches_truth(tmp_path: Path, shared: SharedResult) -> None:
    """The audit of the preset's files lands within 1 % of each team's held GPU-hours of the
    truth the inputs allow: the cards' utilisation is all nvidia-smi and dcgm give of the
    time-sliced and HAMi cards, so their tenants' activity is §7's estimate
    (`truth_estimated`); MIG instances and whole cards are exact in both."""
    audited = _audit_shared(tmp_path, shared)
    truth = _hours(shared.truth_estimated)
    capacity = shared.physical_cards * HOURS
    assert audited.to_numpy().sum() == pytest.approx(capacity, rel=1e-6)
    assert set(audited.index) == set(truth.index)
    for team in truth.index:
        held = truth.loc[team].sum()
        assert audited.loc[team].sum() == pytest.approx(held, rel=1e-6), team
        for cat in truth.columns:
            diff = abs(audited.loc[team, cat] - truth.loc[team, cat])
            assert diff <= 0.01 * held, (
                f"{team}/{cat}: audit {audited.loc[team, cat]:.3f} h, "
                f"truth {truth.loc[team, cat]:.3f} h, held {held:.2f} h"
            )
