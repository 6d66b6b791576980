"""The watcher reads Dynamic Resource Allocation as `import pods` does (SPEC §12): the stand-in
API server serves the fixture cluster's Pods, ResourceClaims and ResourceSlices (list and
watch, `resource.k8s.io/v1`, or `v1beta1` alone as 1.32 and 1.33 clusters do), and the
store ends with the same exact assignments, whatever order the objects arrive in. A claim
or slice that cannot be read is counted and skipped; the others still map."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeapi import FakeApiServer, FakeCluster, wait_until
from sqlalchemy import select
from watchharness import Harness

from auditor.store.schema import gpu_assignments, gpus, pods

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pods" / "dra"
A0 = "GPU-5a1e0d3c-0000-4b7e-9c11-aa0000000000"
A1 = "GPU-5a1e0d3c-0001-4b7e-9c11-aa0000000001"
MIG_3G = "MIG-7d3b9e10-3g20-5c2a-8f00-bb0000000003"
EXACT = {
    ("pod-train-0", A0): 1.0,
    ("pod-infer-a", A1): 0.5,
    ("pod-infer-b", A1): 0.5,
    ("pod-mig-0", MIG_3G): 1.0,
}
KIND = {"Pod": "pods", "ResourceClaim": "resourceclaims", "ResourceSlice": "resourceslices"}


def _items(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text()
    doc = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    items: list[dict[str, Any]] = doc["items"]
    return items


def _exact(h: Harness) -> dict[tuple[str, str], float]:
    with h.engine.connect() as conn:
        by_id = {i: u for i, u in conn.execute(select(gpus.c.id, gpus.c.uuid))}
        return {
            (r.pod_uid, by_id[r.gpu_id]): r.share
            for r in conn.execute(select(gpu_assignments))
            if r.source == "dra"
        }


def _counts(h: Harness) -> dict[str, int]:
    with h.engine.connect() as conn:
        return {str(n): int(c) for n, c in conn.execute(select(pods.c.name, pods.c.gpu_count))}


@pytest.mark.parametrize(
    ("fixture", "versions"), [("cluster.json", ("v1", "v1beta1")), ("cluster.yaml", ("v1beta1",))]
)
def test_the_watcher_maps_claims_to_cards_as_the_import_does(
    db_url: str, tmp_path: Path, fixture: str, versions: tuple[str, ...]
) -> None:
    items = _items(fixture)
    cluster = FakeCluster(dra_versions=versions)
    for obj in items:  # claims and slices listed at the start, pods after
        if obj["kind"] != "Pod":
            cluster.put(KIND[obj["kind"]], obj)
    with FakeApiServer(cluster) as server:
        h = Harness(server, db_url, tmp_path)
        with h.running(dra=True):
            wait_until(lambda: h.count("relists") >= 3)
            assert _exact(h) == {}  # no pod stored yet: the claims wait for them
            for obj in items:
                if obj["kind"] == "Pod":
                    cluster.put("pods", obj)
            wait_until(lambda: _exact(h) == EXACT)
            # the waiting pod, stored after its claim, still waits for the one GPU it asks
            wait_until(lambda: _counts(h).get("queued-0") == 1)
        assert _counts(h) == {"train-0": 1, "mig-0": 1, "queued-0": 1, "infer-a": 0, "infer-b": 0}
        read = {p.split("?")[0] for p in cluster.requests if "/resource" in p.split("?")[0][20:]}
        assert {p.split("/")[3] for p in read} == {versions[0]}  # the first served wins


def test_a_claim_shared_later_and_a_bad_object_are_watched(db_url: str, tmp_path: Path) -> None:
    """Events after the list: a claim that becomes reserved for a second pod splits its card;
    an unreadable claim and an unreadable slice are counted and skipped."""
    items = _items("cluster.json")
    cluster = FakeCluster(dra_versions=("v1",))
    shared: dict[str, Any] = next(o for o in items if o["metadata"]["name"] == "shared-gpu")
    alone = copy.deepcopy(shared)
    alone["status"]["reservedFor"] = alone["status"]["reservedFor"][:1]
    for obj in items:
        if obj is not shared:
            cluster.put(KIND[obj["kind"]], obj)
    cluster.put("resourceclaims", alone)
    with FakeApiServer(cluster) as server:
        h = Harness(server, db_url, tmp_path)
        with h.running(dra=True):
            want = {k: v for k, v in EXACT.items() if k[0] != "pod-infer-b"}
            wait_until(lambda: _exact(h) == {**want, ("pod-infer-a", A1): 1.0})
            bad_claim = copy.deepcopy(alone)
            bad_claim["metadata"] = {**bad_claim["metadata"], "name": "bad", "uid": "claim-bad"}
            bad_claim["status"]["allocation"]["devices"]["results"] = "gpu-1"
            bad_slice: dict[str, Any] = copy.deepcopy(items[0])
            bad_slice["metadata"]["name"] = "bad-slice"
            del bad_slice["spec"]["driver"]
            cluster.put("resourceclaims", bad_claim)
            cluster.put("resourceslices", bad_slice)
            cluster.put("resourceclaims", shared)
            wait_until(lambda: _exact(h) == EXACT)
            wait_until(lambda: h.count("skipped_objects") >= 2)
        assert h.count("skipped_objects") == 2


def test_a_cluster_without_dra_is_not_asked(db_url: str, tmp_path: Path) -> None:
    from auditor.agents.watch import kube

    with FakeApiServer(FakeCluster()) as server:
        h = Harness(server, db_url, tmp_path)
        assert kube.dra_version(h.api) is None
