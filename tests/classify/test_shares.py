"""Shared and partitioned cards (SPEC §7): a decision table per kind of sharing, by hand.

Each case is one physical card sampled every 10 s for an hour at a constant utilisation,
the pods that share it (as the importers store them: resources, shares, node labels,
exact assignments), and the GPU-hours each tenant and the platform must get per category,
computed by hand from SPEC §7's split in the comment beside it. Tenures come from
`build_tenures` (so the share each pod is given is part of what is tested), the split from
`classify`; then once more through the store (SQLite and PostgreSQL), the audit job and the
report, as a user gets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

from auditor.classify import build_tenures, classify
from auditor.classify.mig import mig_share
from auditor.model import Window
from auditor.settings import Thresholds

HOUR = 3_600_000
PERIOD = 10_000
TH = Thresholds()
WINDOW = Window(0, HOUR)


def samples(
    gpu: str, util: float | list[float], *, start: int = 0, end: int = HOUR
) -> pd.DataFrame:
    ts = np.arange(start, end, PERIOD, dtype=np.int64)
    values = np.full(ts.size, util, dtype=float) if not isinstance(util, list) else np.array(util)
    return pd.DataFrame({"gpu": gpu, "ts_ms": ts, "util": values})


def pod(uid: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "uid": uid,
        "namespace": fields.pop("namespace", "ml"),
        "name": uid,
        "node": "n1",
        "gang": None,
        "gpu_count": 1,
        "gpu_resource": "nvidia.com/gpu",
        "bound_ms": 0,
        "finished_ms": HOUR,
        "deleted_ms": None,
        "share_kind": None,
        "gpu_share": None,
        "gpu_mem_mib": None,
        "gpu_mem_share": None,
    }
    row.update(fields)
    return row


def card(uuid: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "uuid": uuid,
        "node": "n1",
        "gpu_index": 0,
        "parent_uuid": None,
        "mig_profile": None,
        "model": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81_920.0,
    }
    row.update(fields)
    return row


@dataclass
class Case:
    pods: list[dict[str, Any]]
    samples: pd.DataFrame
    expected: dict[tuple[str | None, str], float]
    """(pod uid or None for the platform, category) -> GPU-hours."""
    cards: list[dict[str, Any]] = field(default_factory=lambda: [card("G0")])
    labels: dict[str, str] = field(default_factory=dict)
    assignments: list[dict[str, Any]] = field(default_factory=list)
    activity: pd.DataFrame | None = None
    estimated: set[str] = field(default_factory=set)
    """Pods whose time is all estimated attribution."""

    def run(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        pods = pd.DataFrame(self.pods)
        gpus = pd.DataFrame(self.cards)
        nodes = pd.DataFrame([{"name": "n1", "labels": self.labels}])
        assignments = pd.DataFrame(
            self.assignments, columns=["pod_uid", "gpu_uuid", "share", "replicas"]
        )
        tenures = build_tenures(pods, gpus, assignments, now_ms=HOUR, nodes=nodes)
        out = classify(
            self.samples,
            tenures,
            window=WINDOW,
            thresholds=TH,
            cards=gpus,
            activity=self.activity,
        )
        return out.results, out.findings, tenures


def hours(results: pd.DataFrame) -> dict[tuple[str | None, str], float]:
    out: dict[tuple[str | None, str], float] = {}
    for pod_uid, cat, sec in results[["pod_uid", "category", "seconds"]].itertuples(index=False):
        key = (pod_uid, cat)
        out[key] = out.get(key, 0.0) + sec / 3600
    return out


TIME_SLICED = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}

CASES: dict[str, Case] = {
    # 4 replicas; a holds 1 (s=.25), b holds 2 (s=.5), one replica free (f=.25). U=.6 split
    # by share: u_a=.2, u_b=.4 (both at .8 of their share, active). Unused: a .05, b .1,
    # free .25 → the idle .4 goes .05/.1/.25.
    "time-slicing, 2 tenants of 1 and 2 replicas, a free replica": Case(
        pods=[pod("a"), pod("b", gpu_count=2)],
        labels=TIME_SLICED,
        samples=samples("G0", 60.0),
        expected={
            ("a", "busy"): 0.2,
            ("a", "compute_idle"): 0.05,
            ("b", "busy"): 0.4,
            ("b", "compute_idle"): 0.1,
            (None, "unallocated"): 0.25,
        },
        estimated={"a", "b"},
    ),
    # HAMi gpucores 30 and 50: s=.3/.5, f=.2. U=.4: u=.15/.25 (share util .5); unused
    # .15/.25/.2 = .6 = the idle.
    "HAMi with gpucores": Case(
        pods=[
            pod("a", share_kind="hami", gpu_share=0.3, gpu_mem_mib=10_000.0),
            pod("b", share_kind="hami", gpu_share=0.5),
        ],
        samples=samples("G0", 40.0),
        expected={
            ("a", "busy"): 0.15,
            ("a", "compute_idle"): 0.15,
            ("b", "busy"): 0.25,
            ("b", "compute_idle"): 0.25,
            (None, "unallocated"): 0.2,
        },
        estimated={"a", "b"},
    ),
    # HAMi gpumem only: 20,480 and 40,960 MiB of 81,920 → s=.25/.5, f=.25. U=.9 split by
    # share: u=.3/.6, both above their share (borrowing): no unused capacity but the free
    # share's, so the whole idle .1 is unallocated and nobody's time grows.
    "HAMi with only gpumem, tenants above their share": Case(
        pods=[
            pod("a", share_kind="hami", gpu_mem_mib=20_480.0),
            pod("b", share_kind="hami", gpu_mem_mib=40_960.0),
        ],
        samples=samples("G0", 90.0),
        expected={("a", "busy"): 0.3, ("b", "busy"): 0.6, (None, "unallocated"): 0.1},
        estimated={"a", "b"},
    ),
    # HAMi with neither cores nor memory: an equal split, s=.5 each. U=.3: u=.15 each,
    # unused .35 each.
    "HAMi with neither: an equal split": Case(
        pods=[pod("a", share_kind="hami"), pod("b", share_kind="hami")],
        samples=samples("G0", 30.0),
        expected={
            ("a", "busy"): 0.15,
            ("a", "compute_idle"): 0.35,
            ("b", "busy"): 0.15,
            ("b", "compute_idle"): 0.35,
        },
        estimated={"a", "b"},
    ),
    # A100 carved into two 3g.40gb instances (3/7 each), one slice uncarved (1/7). x holds
    # I1 at 50 % of the instance: busy 3/14, idle 3/14. I2 is carved but held by nobody
    # (3/7) and the uncarved slice (1/7): unallocated, 4/7. The parent reports no samples.
    "MIG with carved-but-free and uncarved slices": Case(
        pods=[pod("x", gpu_resource="nvidia.com/mig-3g.40gb", share_kind="mig")],
        cards=[
            card("P", model="NVIDIA A100-SXM4-40GB"),
            card("I1", parent_uuid="P", mig_profile="3g.40gb", gpu_index=1),
            card("I2", parent_uuid="P", mig_profile="3g.40gb", gpu_index=2),
        ],
        samples=pd.concat([samples("I1", 50.0), samples("I2", 0.0)], ignore_index=True),
        expected={
            ("x", "busy"): 3 / 14,
            ("x", "compute_idle"): 3 / 14,
            (None, "unallocated"): 4 / 7,
        },
    ),
    # Run:ai: the reservation pod holds the card for the scheduler and is never a tenant;
    # the fraction pod holds .5 alone: all activity is its own (u=.3, share util .6), its
    # unused .2 and the free .5 split the idle .7.
    "Run:ai fraction beside its reservation pod": Case(
        pods=[
            pod("reservation", namespace="runai-reservation", share_kind="runai-reservation"),
            pod("f", share_kind="runai", gpu_share=0.5, gpu_resource="gpu-fraction"),
        ],
        samples=samples("G0", 30.0),
        expected={
            ("f", "busy"): 0.3,
            ("f", "compute_idle"): 0.2,
            (None, "unallocated"): 0.5,
        },
    ),
    # gpu-milli 250 alone: s=.25, U=.1 → u=.1 (share util .4), unused .15, free .75.
    "gpu-milli": Case(
        pods=[pod("m", share_kind="milli", gpu_share=0.25)],
        samples=samples("G0", 10.0),
        expected={
            ("m", "busy"): 0.1,
            ("m", "compute_idle"): 0.15,
            (None, "unallocated"): 0.75,
        },
    ),
    # Three exact fractions of .5 on one card: 1.5 scaled to 1 (1/3 each), no free share.
    # U=.6: u=.2 each (share util .6), unused 2/15 each = the idle .4.
    "oversubscribed shares are scaled to the card": Case(
        pods=[pod(p, share_kind="runai", gpu_share=0.5) for p in ("a", "b", "c")],
        assignments=[
            {"pod_uid": p, "gpu_uuid": "G0", "share": 0.5, "replicas": None} for p in "abc"
        ],
        samples=samples("G0", 60.0),
        expected={
            **{(p, "busy"): 0.2 for p in "abc"},
            **{(p, "compute_idle"): 0.4 / 3 for p in "abc"},
        },
        estimated={"a", "b", "c"},
    ),
    # Per-process utilisation measured: a (s=.5) never runs a kernel, b (s=.5) uses 40 %
    # of the card. a's whole tenure is idle → reserved_idle on its unused .5; b's .1.
    "measured activity: an idle tenant beside a busy one": Case(
        pods=[pod("a"), pod("b")],
        labels={"nvidia.com/gpu.replicas": "2"},
        samples=samples("G0", 40.0),
        activity=pd.concat(
            [
                samples("G0", 0.0).assign(pod_uid="a"),
                samples("G0", 40.0).assign(pod_uid="b"),
            ],
            ignore_index=True,
        ),
        expected={
            ("a", "reserved_idle"): 0.5,
            ("b", "busy"): 0.4,
            ("b", "compute_idle"): 0.1,
        },
    ),
    # Per tenant startup: a (s=.5) is bound at 0 but its first activity comes at 20 min;
    # until then the card is idle (U=0), then a runs at 60 % of the card. a's first 20 min
    # are startup on its share (.5 × 1/3 h); after, u=.6 > s: a is busy .6, and b's idle
    # half is compute idle... b is idle all along: reserved_idle (whole tenure).
    "startup and reserved idle per tenant": Case(
        pods=[pod("a"), pod("b")],
        labels={"nvidia.com/gpu.replicas": "2"},
        samples=samples("G0", [0.0] * 120 + [60.0] * 240),
        activity=pd.concat(
            [
                samples("G0", [0.0] * 120 + [60.0] * 240).assign(pod_uid="a"),
                samples("G0", 0.0).assign(pod_uid="b"),
            ],
            ignore_index=True,
        ),
        # b's unused is .5 throughout; a's is .5 before, 0 after (it borrows .1 of b's).
        # First 20 min: idle 1 split .5/.5 → a startup .5/3, b .5/3. After: idle .4 all b's.
        expected={
            ("a", "startup"): 0.5 / 3,
            ("a", "busy"): 0.6 * 2 / 3,
            ("b", "reserved_idle"): 0.5 / 3 + 0.4 * 2 / 3,
        },
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decision_table(name: str) -> None:
    case = CASES[name]

    results, _, _ = case.run()

    got = hours(results)
    assert set(got) == set(case.expected), got
    for key, want in case.expected.items():
        assert got[key] == pytest.approx(want, abs=1e-9), key
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)  # one physical card-hour
    est = results[results["estimated"]]
    assert set(est["pod_uid"]) == case.estimated
    for pod_uid in case.estimated:
        mine = results[results["pod_uid"] == pod_uid]
        assert bool(mine["estimated"].all()), pod_uid


def test_shares_given_to_each_pod() -> None:
    _, _, tenures = CASES["time-slicing, 2 tenants of 1 and 2 replicas, a free replica"].run()
    assert dict(zip(tenures["pod_uid"], tenures["share"], strict=True)) == {"a": 0.25, "b": 0.5}
    _, _, tenures = CASES["HAMi with neither: an equal split"].run()
    assert tenures["share"].isna().all()
    assert tenures["share_estimated"].all()
    _, _, tenures = CASES["Run:ai fraction beside its reservation pod"].run()
    assert list(tenures["pod_uid"]) == ["f"]


def test_oversubscription_is_reported() -> None:
    _, findings, _ = CASES["oversubscribed shares are scaled to the card"].run()
    over = findings[findings["kind"] == "oversubscribed"]
    assert len(over) == 1
    row = over.iloc[0]
    assert row["gpu"] == "G0"
    assert row["seconds"] == pytest.approx(3600.0)
    assert "1.50" in row["detail"]


def test_replicas_fill_a_card_before_the_next() -> None:
    """First fit: 3 replicas of 1/4 take what is left of the first card, then the next."""
    pods = pd.DataFrame([pod("a", gpu_count=2), pod("b", gpu_count=3, bound_ms=1)])
    gpus = pd.DataFrame([card("G0"), card("G1", gpu_index=1)])
    nodes = pd.DataFrame([{"name": "n1", "labels": TIME_SLICED}])
    empty = pd.DataFrame(columns=["pod_uid", "gpu_uuid"])
    tenures = build_tenures(pods, gpus, empty, now_ms=HOUR, nodes=nodes)
    got = {
        (p, g): s
        for p, g, s in zip(tenures["pod_uid"], tenures["gpu"], tenures["share"], strict=True)
    }
    assert got == {("a", "G0"): 0.5, ("b", "G0"): 0.5, ("b", "G1"): 0.25}


def test_whole_cards_are_not_placed_on_shared_ones() -> None:
    pods = pd.DataFrame([pod("f", share_kind="runai", gpu_share=0.5), pod("w", bound_ms=1)])
    gpus = pd.DataFrame([card("G0"), card("G1", gpu_index=1)])
    empty = pd.DataFrame(columns=["pod_uid", "gpu_uuid"])
    tenures = build_tenures(pods, gpus, empty, now_ms=HOUR)
    assert dict(zip(tenures["pod_uid"], tenures["gpu"], strict=True)) == {"f": "G0", "w": "G1"}


@pytest.mark.parametrize(
    ("profile", "model", "share"),
    [
        ("1g.10gb", "NVIDIA H100 80GB HBM3", 1 / 7),
        ("3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7),
        ("7g.80gb", None, 1.0),
        ("1c.3g.40gb", "NVIDIA A100-SXM4-80GB", 1 / 7),
        ("2g.12gb", "NVIDIA A30", 2 / 4),
        ("1g.10gb+me", "NVIDIA H200", 1 / 7),
        ("8g.99gb", "NVIDIA H100", None),
        ("nonsense", "NVIDIA H100", None),
        (None, "NVIDIA H100", None),
    ],
)
def test_mig_share(profile: str | None, model: str | None, share: float | None) -> None:
    assert mig_share(profile, model) == (pytest.approx(share) if share is not None else None)


def _store_case(url: str, case: Case) -> None:
    """The case's pods, nodes, cards, samples, assignments and tenants' utilisation written
    through the store's own writes, as the importers and the sampler write them."""
    from auditor.jobs.common import open_store
    from auditor.model import GpuRecord, GpuSample, PodRecord, TenantSample, WorkloadKind
    from auditor.store import pod_writes, writes

    engine = open_store(url)
    try:
        with engine.begin() as conn:
            ids = writes.upsert_gpus(
                conn,
                [
                    GpuRecord(
                        c["uuid"],
                        c["node"],
                        c["gpu_index"],
                        c["model"],
                        c["memory_total_mib"],
                        c["parent_uuid"],
                        mig_profile=c["mig_profile"],
                    )
                    for c in case.cards
                ],
            )
            writes.insert_samples(
                conn,
                [
                    GpuSample(g, int(t), None if np.isnan(u) else float(u))
                    for g, t, u in case.samples[["gpu", "ts_ms", "util"]].itertuples(index=False)
                ],
                ids,
            )
            writes.upsert_nodes(
                conn,
                [
                    {
                        "name": "n1",
                        "gpu_model": None,
                        "gpu_capacity": 1,
                        "gpu_allocatable": 1,
                        "unschedulable": False,
                        "labels": case.labels,
                        "resource_version": None,
                        "updated_ms": 0,
                    }
                ],
            )
            pod_writes.upsert_pods(
                conn,
                [
                    PodRecord(
                        uid=p["uid"],
                        namespace=p["namespace"],
                        name=p["name"],
                        node=p["node"],
                        team=p["namespace"],
                        job=f"Pod/{p['name']}",
                        job_kind="Pod",
                        workload=WorkloadKind.OTHER,
                        gang=p["uid"],
                        gpu_count=p["gpu_count"],
                        gpu_resource=p["gpu_resource"],
                        bound_ms=p["bound_ms"],
                        finished_ms=p["finished_ms"],
                        share_kind=p["share_kind"],
                        gpu_share=p["gpu_share"],
                        gpu_mem_mib=p["gpu_mem_mib"],
                        gpu_mem_share=p["gpu_mem_share"],
                    )
                    for p in case.pods
                ],
            )
            if case.assignments:
                writes.upsert_assignments(
                    conn,
                    [(a["pod_uid"], ids[a["gpu_uuid"]], 0) for a in case.assignments],
                    source="test",
                    shares={
                        (a["pod_uid"], ids[a["gpu_uuid"]]): (a["replicas"], a["share"])
                        for a in case.assignments
                    },
                )
            if case.activity is not None:
                writes.insert_tenant_samples(
                    conn,
                    [
                        TenantSample(g, p, int(t), float(u))
                        for g, p, t, u in case.activity[
                            ["gpu", "pod_uid", "ts_ms", "util"]
                        ].itertuples(index=False)
                    ],
                    ids,
                )
    finally:
        engine.dispose()


@pytest.mark.parametrize("name", list(CASES))
def test_decision_table_through_the_store(db_url: str, name: str) -> None:
    """The same cases stored (SQLite and PostgreSQL), audited and reported as a user would:
    the same GPU-hours per pod and category, the same estimated attribution."""
    from auditor import jobs
    from auditor.report.summary import GroupBy

    case = CASES[name]
    jobs.db_upgrade(db_url)
    _store_case(db_url, case)

    jobs.audit(db_url, window=(0, HOUR), thresholds=TH)
    report = jobs.build_report(db_url, start_ms=None, end_ms=None, by=GroupBy.POD, team=None)

    rows = report.rows.set_index("pod")
    for (pod_uid, cat), want in case.expected.items():
        key = "(platform)" if pod_uid is None else pod_uid
        assert rows.loc[key, f"{cat}_gpu_hours"] == pytest.approx(want, abs=1e-9), (key, cat)
    assert report.totals["capacity_gpu_hours"] == pytest.approx(1.0, abs=1e-9)
    for pod_uid in case.estimated:
        assert rows.loc[pod_uid, "estimated_share"] == pytest.approx(1.0)
    held = [p for p, _ in case.expected if p is not None]
    for pod_uid in set(held) - case.estimated:
        assert rows.loc[pod_uid, "estimated_share"] == pytest.approx(0.0)


@pytest.mark.parametrize(
    "name",
    [
        "MIG with carved-but-free and uncarved slices",
        "time-slicing, 2 tenants of 1 and 2 replicas, a free replica",
        "oversubscribed shares are scaled to the card",
    ],
)
def test_finance_charges_shares_and_reconciles_to_capacity(tmp_path: Any, name: str) -> None:
    """The weekly CSV charges each pod's team its share and the platform the free share: its
    allocated cost adds up to the card's capacity × price, and a MIG instance is priced as
    its card."""
    import csv
    import io

    from auditor import jobs
    from auditor.report.finance import parse_week
    from auditor.settings import Config, Prices

    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    case = CASES[name]
    _store_case(url, case)
    week = parse_week("1970-W01")
    jobs.audit(url, window=(week.start_ms, week.end_ms), thresholds=TH)
    price = 3.0
    model = "NVIDIA A100-SXM4-40GB" if name.startswith("MIG") else "NVIDIA H100 80GB HBM3"
    config = Config(prices=Prices(default=1.0, by_model={model: price}))

    rows = list(
        csv.DictReader(io.StringIO(jobs.export_finance(url, week="1970-W01", config=config)))
    )

    assert {r["gpu_model"] for r in rows} == {model}
    assert sum(float(r["allocated_cost"]) for r in rows) == pytest.approx(1.0 * price)
    teams = {r["team"]: float(r["allocated_gpu_hours"]) for r in rows}
    held = sum(v for (p, _), v in case.expected.items() if p is not None)
    assert teams["ml"] == pytest.approx(held, abs=1e-4)
    assert teams.get("(platform)", 0.0) == pytest.approx(1.0 - held, abs=1e-4)
