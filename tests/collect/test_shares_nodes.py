"""Nodes of shared GPUs (SPEC §7): the card count is of physical cards wherever the node says
it, the sharing labels are kept whole, and `read_nodes` gives them back."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from auditor.collect.kubectl_files import read_kubectl
from auditor.collect.nodes import node_row
from auditor.settings import TeamRules
from auditor.store import reads
from auditor.store.writes import upsert_nodes

HAMI_REGISTER = (
    "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,"
    "hami-core:GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,"
    "0,true,1,hami-core:"
)


def node(
    capacity: dict[str, str],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-node-1",
            "labels": {"kubernetes.io/hostname": "gpu-node-1", **(labels or {})},
            "annotations": annotations or {},
            "resourceVersion": "812",
        },
        "spec": {},
        "status": {"capacity": {"cpu": "96", **capacity}, "allocatable": capacity},
    }


CASES = {
    "whole cards": (node({"nvidia.com/gpu": "8"}), 8),
    "time-slicing, 4 replicas, GFD count": (
        node(
            {"nvidia.com/gpu": "32"},
            {
                "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
                "nvidia.com/gpu.count": "8",
            },
        ),
        8,
    ),
    "time-slicing renamed, no GFD count": (
        node({"nvidia.com/gpu.shared": "16"}, {"nvidia.com/gpu.replicas": "4"}),
        4,
    ),
    "MPS, 2 replicas": (
        node(
            {"nvidia.com/gpu": "8"},
            {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps"},
        ),
        4,
    ),
    "MIG mixed: instances as before": (
        node(
            {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
            {"nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.strategy": "mixed"},
        ),
        9,
    ),
    "MIG mixed with GFD's count: the physical cards": (
        node(
            {"nvidia.com/mig-1g.10gb": "3", "nvidia.com/mig-2g.20gb": "2"},
            {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "1"},
        ),
        1,
    ),
    "MIG single: instances as nvidia.com/gpu, GFD's count of cards": (
        node(
            {"nvidia.com/gpu": "14"},
            {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "2"},
        ),
        2,
    ),
    "HAMi vgpu, registered cards": (
        node(
            {"nvidia.com/vgpu": "20"}, annotations={"hami.io/node-nvidia-register": HAMI_REGISTER}
        ),
        2,
    ),
    "HAMi as nvidia.com/gpu, registered cards": (
        node({"nvidia.com/gpu": "20"}, annotations={"hami.io/node-nvidia-register": HAMI_REGISTER}),
        2,
    ),
    "HAMi vgpu, GFD count": (node({"nvidia.com/vgpu": "40"}, {"nvidia.com/gpu.count": "4"}), 4),
    "gpu-milli with gpu-count": (
        node({"alibabacloud.com/gpu-milli": "8000", "alibabacloud.com/gpu-count": "8"}),
        8,
    ),
    "gpu-milli alone": (node({"alibabacloud.com/gpu-milli": "2000"}), 2),
    "no GPUs": (node({"memory": "512Gi"}), 0),
    "bad replicas label counts as none": (
        node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu.replicas": "lots"}),
        8,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_physical_card_count(case: str) -> None:
    obj, cards = CASES[case]
    row = node_row(obj, at_ms=1)
    assert (row["gpu_capacity"], row["gpu_allocatable"]) == (cards, cards)


def test_an_openb_node_of_the_trace_is_two_p100s() -> None:
    """A node as Alibaba's OpenB trace ships it (realdata/openb_node_list_gpu_node.yaml)."""
    obj = node(
        {"alibabacloud.com/gpu-count": "2", "alibabacloud.com/gpu-milli": "2000"},
        {"alibabacloud.com/gpu-card-model": "P100"},
    )
    row = node_row(obj, at_ms=1)
    assert (row["gpu_model"], row["gpu_capacity"]) == ("P100", 2)


def test_sharing_labels_round_trip_through_read_nodes(engine: Engine) -> None:
    obj, _ = CASES["time-slicing, 4 replicas, GFD count"]
    with engine.begin() as conn:
        upsert_nodes(conn, [node_row(obj, at_ms=5)])
    with engine.connect() as conn:
        got = reads.read_nodes(conn)
    (labels,) = got["labels"].tolist()
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert got["name"].tolist() == ["gpu-node-1"]


def _realdata() -> Path:
    env = os.environ.get("AUDITOR_REALDATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "realdata"


OPENB = _realdata() / "alibaba-gpu-v2023-openb"


@pytest.mark.skipif(
    not (OPENB / "openb_node_list_gpu_node.yaml").exists(),
    reason="the OpenB trace (../shared/realdata/alibaba-gpu-v2023-openb) is not beside the repo",
)
def test_the_real_openb_nodes_count_the_traces_cards() -> None:
    """Every GPU node of Alibaba's OpenB trace, through the kubectl YAML reader: the cards
    and models the trace's CSV lists for it."""
    listed = {
        row["sn"]: (int(row["gpu"]), row["model"])
        for row in csv.DictReader((OPENB / "openb_node_list_gpu_node.csv").open())
    }
    rows = [
        r
        for r in read_kubectl(OPENB / "openb_node_list_gpu_node.yaml", teams=TeamRules(), node_ms=1)
        if isinstance(r, dict)
    ]
    got = {r["name"]: (r["gpu_capacity"], r["gpu_model"]) for r in rows}
    assert got == listed
    assert sum(c for c, _ in got.values()) == sum(c for c, _ in listed.values()) > 1000
