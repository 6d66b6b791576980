"""Dynamic Resource Allocation through `auditor import pods` (SPEC §12, §7): pods whose GPUs
come from ResourceClaims, joined to the ResourceSlices' devices, audited to hand-computed
GPU-hours on SQLite and PostgreSQL.

The fixtures are one cluster in the shapes the API writes: `cluster.json` in
`resource.k8s.io/v1` (requests under `exactly`, devices' attributes flat), `cluster.yaml`
the same objects in `v1beta1` (flat requests, attributes under `basic`). Node `dra-a` has two
H100s; `dra-m` an A100 carved into MIG instances (3g.20gb, 1g.5gb) and an IMEX channel,
which is not a card. Window 08:00-09:00:

- train-0: a claim from a template, the whole card gpu-0, bound 08:00, done 08:30: 0.5 h;
- infer-a, infer-b: one claim (`resourceClaimName: shared-gpu`) reserved for both, card
  gpu-1, both running from 08:00: half of the card each for 1 h, 0.5 h each;
- mig-0: a 3g.20gb instance from 08:15: 45 min x 3/7 of the A100 = 0.3214 h;
- spare-1g: a claim allocated the 1g.5gb instance but reserved for no pod: nobody holds it;
- queued-0: still waiting, its claim not allocated: holds nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.collect import dra
from auditor.errors import PodFieldError
from auditor.model import GpuSample
from auditor.store.connection import make_engine
from auditor.store.schema import gpu_assignments, gpus, pods

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pods" / "dra"
runner = CliRunner()

A0 = "GPU-5a1e0d3c-0000-4b7e-9c11-aa0000000000"
A1 = "GPU-5a1e0d3c-0001-4b7e-9c11-aa0000000001"
M0 = "GPU-8c2f1a77-0000-4d3e-a1b2-bb0000000000"
MIG_3G = "MIG-7d3b9e10-3g20-5c2a-8f00-bb0000000003"
MIG_1G = "MIG-7d3b9e10-1g05-5c2a-8f00-bb0000000001"
T0 = int(datetime(2026, 11, 23, 8, 0, tzinfo=UTC).timestamp() * 1000)
HELD_HOURS = {"train-0": 0.5, "infer-a": 0.5, "infer-b": 0.5, "mig-0": 0.75 * 3 / 7}
EXACT = {
    ("pod-train-0", A0): 1.0,
    ("pod-infer-a", A1): 0.5,
    ("pod-infer-b", A1): 0.5,
    ("pod-mig-0", MIG_3G): 1.0,  # the instance whole; its 3/7 of the card is the classifier's
}


def invoke(db: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", db, *args])
    return result.exit_code, result.output


@pytest.fixture
def db(db_url: str) -> str:
    code, out = invoke(db_url, "db", "upgrade")
    assert code == 0, out
    return db_url


def _samples(db: str) -> None:
    """The cards' readings every 10 s for the hour, as the sampler writes them: both H100s
    at 60 %, the 3g.20gb instance at 40 % (the unheld 1g.5gb reports nothing)."""
    from auditor.store.writes import insert_samples

    engine = make_engine(db)
    with engine.begin() as conn:
        ids = {u: i for u, i in conn.execute(select(gpus.c.uuid, gpus.c.id))}
        insert_samples(
            conn,
            [
                GpuSample(uuid, T0 + s * 1000, util)
                for s in range(0, 3600, 10)
                for uuid, util in ((A0, 60.0), (A1, 60.0), (MIG_3G, 40.0))
            ],
            ids,
        )
    engine.dispose()


def _stored(db: str) -> tuple[dict[tuple[str, str], float], dict[str, Any], dict[str, Any]]:
    engine = make_engine(db)
    with engine.connect() as conn:
        cards = {r.uuid: r for r in conn.execute(select(gpus))}
        by_id = {r.id: r.uuid for r in cards.values()}
        exact = {
            (r.pod_uid, by_id[r.gpu_id]): r.share
            for r in conn.execute(select(gpu_assignments))
            if r.source == "dra"
        }
        held = {r.name: r for r in conn.execute(select(pods))}
    engine.dispose()
    return exact, cards, held


@pytest.mark.parametrize("fixture", ["cluster.json", "cluster.yaml"])
def test_claims_give_pods_their_cards_exactly_and_the_audit_counts_them(
    db: str, fixture: str
) -> None:
    code, out = invoke(db, "import", "pods", str(FIXTURES / fixture))
    assert code == 0, out
    assert "5 ResourceClaims: 4 pod-card pairs mapped exactly" in out, out
    exact, cards, held = _stored(db)
    assert exact == EXACT  # spare-1g's instance is nobody's; queued-0 has nothing
    assert set(held) == {"train-0", "infer-a", "infer-b", "mig-0", "queued-0"}
    assert {held[n].share_kind for n in held} == {"dra"}
    # the slices' cards: node, model, memory; the MIG instances under their card
    assert (cards[A0].node, cards[A0].model, cards[A0].memory_total_mib) == (
        "dra-a",
        "NVIDIA H100 80GB HBM3",
        81920.0,
    )
    assert (cards[MIG_3G].parent_uuid, cards[MIG_3G].mig_profile) == (M0, "3g.20gb")
    assert (cards[MIG_1G].parent_uuid, cards[MIG_1G].node) == (M0, "dra-m")
    assert cards[M0].model == "NVIDIA A100-SXM4-40GB"

    _samples(db)
    code, out = invoke(
        db, "audit", "--start", "2026-11-23T08:00:00", "--end", "2026-11-23T09:00:00"
    )
    assert code == 0, out
    code, out = invoke(db, "report", "--by", "pod", "--format", "json")
    assert code == 0, out
    rows = {r["pod"]: r for r in json.loads(out)}
    for name, hours in HELD_HOURS.items():
        assert rows[name]["allocated_gpu_hours"] == pytest.approx(hours, abs=1e-6), name
        assert rows[name]["inferred_share"] == 0, name  # an exact mapping: nothing inferred
    assert "queued-0" not in rows or rows["queued-0"]["allocated_gpu_hours"] == 0
    # the card gpu-1's activity is split between its two tenants in proportion to their
    # shares (SPEC §7: no per-process readings): their attribution, not their card, is estimated
    for name in ("train-0", "mig-0"):
        assert rows[name]["estimated_share"] == 0, name
    # train-0's card at 60 % for its half hour: 0.3 h busy, 0.2 h idle
    assert rows["train-0"]["busy_gpu_hours"] == pytest.approx(0.3, abs=1e-6)


def test_pods_before_their_claims_in_another_file(db: str, tmp_path: Path) -> None:
    """Claims and slices imported after the pods (another file) still map them: the join
    takes the pods the store holds."""
    doc = json.loads((FIXTURES / "cluster.json").read_text())
    pods_only = {**doc, "items": [i for i in doc["items"] if i["kind"] == "Pod"]}
    rest = {**doc, "items": [i for i in doc["items"] if i["kind"] != "Pod"]}
    (tmp_path / "pods.json").write_text(json.dumps(pods_only))
    (tmp_path / "dra.json").write_text(json.dumps(rest))
    for name in ("pods.json", "dra.json"):
        code, out = invoke(db, "import", "pods", str(tmp_path / name))
        assert code == 0, out
    assert _stored(db)[0] == EXACT


@pytest.mark.parametrize("fixture", ["cluster.json", "cluster.yaml"])
def test_a_pod_waiting_on_its_claim_waits_for_the_gpus_the_claim_asks_for(
    db: str, fixture: str, tmp_path: Path
) -> None:
    """A DRA pod asks for no card in its containers: what it waits for is what the claim
    made for it asks (queued-0: one `gpu.nvidia.com` device), so its wait counts as one card
    waiting (SPEC §10 `blocked`, `queue_wait_gpu_hours`). A claim shared by name is no one
    pod's ask. Seeing the pod again (a later snapshot) keeps the count."""
    from auditor.model import Window
    from auditor.store.demand import read_queue_waits

    code, out = invoke(db, "import", "pods", str(FIXTURES / fixture))
    assert code == 0, out
    engine = make_engine(db)
    with engine.connect() as conn:
        count = dict(conn.execute(select(pods.c.name, pods.c.gpu_count)).all())
    assert count == {"train-0": 1, "mig-0": 1, "queued-0": 1, "infer-a": 0, "infer-b": 0}
    doc = json.loads((FIXTURES / "cluster.json").read_text())
    again = {**doc, "items": [i for i in doc["items"] if i["kind"] == "Pod"]}
    (tmp_path / "pods.json").write_text(json.dumps(again))
    code, out = invoke(db, "import", "pods", str(tmp_path / "pods.json"))
    assert code == 0, out
    with engine.connect() as conn:
        assert (
            conn.execute(select(pods.c.gpu_count).where(pods.c.name == "queued-0")).scalar_one()
            == 1
        )
        waits = read_queue_waits(conn, window=Window(T0 - 3_600_000, T0 + 10**12))
    engine.dispose()
    assert waits.set_index("name")["cards"].to_dict() == {"queued-0": 1.0}
    # and the count never makes the pod's cards a guess: with no claim mapped it holds none
    assert _stored(db)[0] == EXACT


def test_gpus_asked_by_a_claim_of_each_shape() -> None:
    def claim(spec: dict[str, Any]) -> int:
        obj = {"metadata": {"uid": "c", "name": "c", "namespace": "n"}, "spec": spec}
        return dra.read_claim(obj).asked

    def req(**body: Any) -> dict[str, Any]:
        return {"devices": {"requests": [{"name": "r", **body}]}}

    assert claim(req(exactly={"deviceClassName": "gpu.nvidia.com", "count": 4})) == 4
    assert claim(req(exactly={"deviceClassName": "gpu.nvidia.com"})) == 1  # ExactCount, 1
    assert claim(req(deviceClassName="mig.nvidia.com", count=2)) == 2  # v1beta1, flat
    assert claim(req(exactly={"deviceClassName": "gpu.amd.com", "allocationMode": "All"})) == 1
    channel = "compute-domain-default-channel.nvidia.com"
    assert claim(req(exactly={"deviceClassName": channel})) == 0  # not a GPU
    first = [{"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 2}]
    assert claim(req(firstAvailable=first)) == 2
    assert claim({}) == 0


def test_claims_of_pods_not_imported_give_nothing_and_say_so(db: str, tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "cluster.json").read_text())
    rest = {**doc, "items": [i for i in doc["items"] if i["kind"] != "Pod"]}
    (tmp_path / "dra.json").write_text(json.dumps(rest))
    code, out = invoke(db, "import", "pods", str(tmp_path / "dra.json"))
    assert code == 0, out
    # train-0's, mig-0's and the shared one's holds, and queued-0's ask: their pods are not
    # stored (spare-1g is reserved for no one and owned by no pod: nothing to give)
    assert "4 claims gave nothing" in out, out
    assert _stored(db)[0] == {}


HOSTILE: dict[str, tuple[str, str, object, str]] = {
    # case: (kind, dotted path to set, value, field the error names)
    "result-device-number": (
        "ResourceClaim",
        "status.allocation.devices.results.0.device",
        7,
        "status.allocation.devices.results[0].device",
    ),
    "reserved-uid-missing": (
        "ResourceClaim",
        "status.reservedFor.0.uid",
        None,
        "status.reservedFor[0].uid",
    ),
    "results-not-a-list": (
        "ResourceClaim",
        "status.allocation.devices.results",
        "gpu-0",
        "status.allocation.devices.results",
    ),
    "slice-uuid-nul": (
        "ResourceSlice",
        "spec.devices.0.attributes.uuid.string",
        "GPU-\u0000bad",
        "spec.devices[0].attributes.uuid",
    ),
    "slice-driver-missing": ("ResourceSlice", "spec.driver", None, "spec.driver"),
    "slice-memory-text": (
        "ResourceSlice",
        "spec.devices.0.capacity.memory.value",
        "lots",
        "spec.devices[0].capacity.memory",
    ),
}


def _set(obj: dict[str, Any], path: str, value: object) -> None:
    *parents, last = path.split(".")
    node: Any = obj
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is None:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_bad_claim_or_slice_is_one_line_naming_file_line_and_field(
    db: str, case: str, tmp_path: Path
) -> None:
    """The file is refused whole: one line naming it, the object's line and the field; the
    store is untouched."""
    kind, path, value, field = HOSTILE[case]
    doc = json.loads((FIXTURES / "cluster.json").read_text())
    index = next(i for i, o in enumerate(doc["items"]) if o["kind"] == kind)
    _set(doc["items"][index], path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc, indent=1))
    code, out = invoke(db, "import", "pods", str(bad))
    assert code != 0
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert str(bad) in lines[0], lines[0]
    assert f"items[{index}].{field}" in lines[0], lines[0]
    assert "Traceback" not in out
    exact, cards, held = _stored(db)
    assert (exact, cards, held) == ({}, {}, {})


def test_the_v1_and_v1beta1_shapes_read_alike() -> None:
    """A device's attributes flat (v1, v1beta2) or under `basic` (v1beta1), qualified by the
    driver's domain or not, are the same card."""
    attrs = {"gpu.nvidia.com/uuid": {"string": A0}, "productName": {"string": "NVIDIA H100"}}
    base = {"driver": "gpu.nvidia.com", "pool": {"name": "n"}, "nodeName": "n"}
    v1 = {"spec": {**base, "devices": [{"name": "gpu-0", "attributes": attrs}]}}
    beta = {"spec": {**base, "devices": [{"name": "gpu-0", "basic": {"attributes": attrs}}]}}
    assert dra.read_slice(v1) == dra.read_slice(beta)
    assert [d.uuid for d in dra.read_slice(v1)] == [A0]


def test_a_claim_shared_by_more_pods_later_splits_by_the_most_seen() -> None:
    state = dra.DraState()
    state.add_slice(dra.read_slice(
        {"spec": {"driver": "d", "pool": {"name": "p"}, "nodeName": "n",
                  "devices": [{"name": "g", "attributes": {"uuid": {"string": A0}}}]}}
    ))  # fmt: skip
    one = dra.DraClaim("c", "ns", "c", (("d", "p", "g"),), ("p1",))
    two = dra.DraClaim("c", "ns", "c", (("d", "p", "g"),), ("p1", "p2"))
    for claim in (one, two, one):
        state.add_claim(claim)
    assert [(h.pod_uid, h.share) for h in state.holds()] == [("p1", 0.5)]


def test_a_device_that_is_no_card_is_left_out() -> None:
    channel = {"name": "channel-0", "attributes": {"type": {"string": "channel"}}}
    devices = dra.read_slice(
        {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p"}, "nodeName": "n",
                  "devices": [channel]}}
    )  # fmt: skip
    assert [d.uuid for d in devices] == [None]
    with pytest.raises(PodFieldError):
        dra.read_claim({"metadata": {"uid": "u", "name": "n"}})  # no namespace
