"""The store on SQLite and a real PostgreSQL: writes are idempotent, pods merge by UID."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine, select

from auditor.model import GpuRecord, GpuSample, PodRecord, TenantSample, WorkloadKind
from auditor.store import reads
from auditor.store.pod_writes import upsert_pods
from auditor.store.schema import gpu_samples, gpus, pods
from auditor.store.writes import (
    insert_samples,
    insert_tenant_samples,
    replace_audit_run,
    supersedes,
    upsert_assignments,
    upsert_gpus,
    upsert_nodes,
)


def _pod(**changes: object) -> PodRecord:
    base: dict[str, object] = {
        "uid": "u-1",
        "namespace": "ml",
        "name": "train-0",
        "node": "n1",
        "team": "nlp",
        "job": "PyTorchJob/train",
        "job_kind": "PyTorchJob",
        "workload": WorkloadKind.TRAINING,
        "gang": "ml/PyTorchJob/train",
        "gpu_count": 8,
        "rank": 0,
        "created_ms": 1_000,
        "bound_ms": 2_000,
        "labels": {"team": "nlp"},
    }
    base.update(changes)
    return PodRecord(**base)  # type: ignore[arg-type]


def test_samples_are_idempotent(engine: Engine) -> None:
    gpu = GpuRecord(uuid="GPU-a", node="n1", index=0, model="NVIDIA H100 80GB HBM3")
    samples = [GpuSample("GPU-a", 1_000 * i, util=float(i), memory_used_mib=10.0) for i in range(5)]
    for _ in range(2):
        with engine.begin() as conn:
            ids = upsert_gpus(conn, [gpu])
            insert_samples(conn, samples, ids)
    with engine.connect() as conn:
        stored = reads.read_samples(conn, start_ms=0, end_ms=10_000)
        raw = conn.execute(select(gpu_samples.c.util, gpu_samples.c.power_w)).all()
    assert len(stored) == 5
    assert stored["util"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # a field the source did not read stays NULL, never 0
    assert {p for _, p in raw} == {None}


def test_gpu_attributes_fill_in_and_node_moves(engine: Engine) -> None:
    with engine.begin() as conn:
        upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1", index=0)])
        upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1", model="H200", memory_total_mib=1.0)])
    with engine.connect() as conn:
        gpus = reads.read_gpus(conn)
    assert gpus[["uuid", "node", "gpu_index", "model"]].to_dict("records") == [
        {"uuid": "GPU-a", "node": "n1", "gpu_index": 0, "model": "H200"}
    ]


def test_pod_observations_merge_without_erasing_times(engine: Engine) -> None:
    with engine.begin() as conn:
        upsert_pods(conn, [_pod(phase="Pending", bound_ms=None)])
    with engine.begin() as conn:
        upsert_pods(conn, [_pod(phase="Running", started_ms=3_000), _pod(phase="Running")])
    with engine.begin() as conn:
        upsert_pods(conn, [_pod(phase="Succeeded", bound_ms=None, finished_ms=9_000)])
    with engine.connect() as conn:
        row = conn.execute(select(pods)).mappings().one()
    assert row["phase"] == "Succeeded"
    assert (row["bound_ms"], row["started_ms"], row["finished_ms"]) == (2_000, 3_000, 9_000)
    assert row["labels"] == {"team": "nlp"}


def test_restart_does_not_move_the_start_later(engine: Engine) -> None:
    # a container status remembers only its previous run: a later observation after
    # restarts reports a later start, which must not replace the first one
    with engine.begin() as conn:
        upsert_pods(conn, [_pod(started_ms=3_000)])
    with engine.begin() as conn:
        upsert_pods(conn, [_pod(started_ms=8_000, bound_ms=2_500), _pod(started_ms=9_000)])
    with engine.connect() as conn:
        row = conn.execute(select(pods)).mappings().one()
    assert (row["bound_ms"], row["started_ms"]) == (2_000, 3_000)


def test_reimport_of_the_same_pods_changes_nothing(engine: Engine) -> None:
    records = [_pod(), _pod(uid="u-2", name="train-1", rank=1)]
    with engine.begin() as conn:
        upsert_pods(conn, records)
    with engine.connect() as conn:
        first = reads.read_pods(conn)
    with engine.begin() as conn:
        upsert_pods(conn, records)
    with engine.connect() as conn:
        again = reads.read_pods(conn)
    assert first.equals(again)
    assert len(again) == 2


def test_assignments_widen_their_span(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1", index=0)])
        upsert_pods(conn, [_pod()])
        upsert_assignments(conn, [("u-1", ids["GPU-a"], 5_000)], source="pod-resources")
        upsert_assignments(
            conn,
            [("u-1", ids["GPU-a"], 1_000), ("u-1", ids["GPU-a"], 7_000)],
            source="pod-resources",
        )
    with engine.connect() as conn:
        mapping = reads.read_assignments(conn)
        span = conn.exec_driver_sql("select first_seen_ms, last_seen_ms from gpu_assignments").one()
    assert mapping[["pod_uid", "gpu_uuid"]].to_dict("records") == [
        {"pod_uid": "u-1", "gpu_uuid": "GPU-a"}
    ]
    assert tuple(span) == (1_000, 7_000)


def test_audit_run_of_the_same_window_replaces_the_earlier(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1", index=0)])

    def store(seconds: float) -> int:
        with engine.begin() as conn:
            return replace_audit_run(
                conn,
                window=(0, 3_600_000),
                shard="all",
                created_ms=1,
                thresholds={"x": 1.0},
                version="test",
                results=[
                    {
                        "gpu_id": ids["GPU-a"],
                        "pod_uid": None,
                        "category": "unallocated",
                        "seconds": seconds,
                        "inferred": False,
                    }
                ],
                findings=[],
            )

    store(3600.0)
    second = store(1800.0)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=None, end_ms=None)
        results = reads.read_results(conn, [int(i) for i in runs["id"]])
    assert runs["id"].tolist() == [second]
    assert results["seconds"].tolist() == [1800.0]
    assert results["team"].isna().all()


@pytest.mark.parametrize(
    ("new", "old", "replaced"),
    [
        ("all", "all", True),
        ("all", "0/2", True),
        ("0/2", "all", True),
        ("0/2", "0/2", True),
        ("0/2", "1/2", False),
        ("0/3", "1/2", True),
    ],
)
def test_which_runs_a_new_run_supersedes(new: str, old: str, replaced: bool) -> None:
    assert supersedes(new, old) is replaced


def test_each_source_records_where_utilisation_came_from(db_url: str, tmp_path: Path) -> None:
    """nvidia-smi logs say `nvidia-smi`; a later source that names its own wins, and a
    record naming none (a later nvidia-smi-less write) keeps it; none is a conflict."""
    from auditor.jobs import import_nvidia_smi, open_store
    from auditor.store import migrate

    migrate.upgrade(db_url)
    log = tmp_path / "node-a.csv"
    log.write_text(
        "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]\n"
        "2026/11/23 08:00:00.000, 0, GPU-aaaa, 87 %, 61234 MiB\n",
        encoding="utf-8",
    )
    import_nvidia_smi(db_url, log, node="node-a")
    engine = open_store(db_url)

    def source() -> str | None:
        with engine.connect() as conn:
            return conn.execute(select(gpus.c.util_source)).scalar_one()

    assert source() == "nvidia-smi"
    with engine.begin() as conn:
        upsert_gpus(conn, [GpuRecord("GPU-aaaa", "node-a", 0, "H100")])
    assert source() == "nvidia-smi"
    with engine.begin() as conn:
        upsert_gpus(conn, [GpuRecord("GPU-aaaa", "node-a", 0, util_source="nvml")])
    assert source() == "nvml"


# ------------------------------------------------------------------ shared cards (SPEC §7)


def test_share_fields_of_pods_round_trip(engine: Engine) -> None:
    """What a pod asks for of a card comes back as written; a later observation replaces it,
    and a whole-card pod reads None for each (not 0)."""
    hami = _pod(
        uid="u-h",
        name="hami-0",
        gpu_count=1,
        gpu_resource="nvidia.com/gpu",
        share_kind="hami",
        gpu_share=0.3,
        gpu_mem_mib=3000.0,
        gpu_mem_share=None,
    )
    runai = _pod(uid="u-r", name="frac-0", gpu_count=1, gpu_resource="gpu-fraction")
    with engine.begin() as conn:
        upsert_pods(conn, [hami, _pod(uid="u-w", name="whole-0"), runai])
        upsert_pods(
            conn,
            [
                _pod(
                    uid="u-r",
                    name="frac-0",
                    gpu_count=1,
                    gpu_resource="gpu-fraction",
                    share_kind="runai",
                    gpu_share=0.5,
                    gpu_mem_share=0.25,
                )
            ],
        )
    with engine.connect() as conn:
        got = reads.read_pods(conn).set_index("uid")
    cols = ["share_kind", "gpu_share", "gpu_mem_mib", "gpu_mem_share", "gpu_resource"]
    rows = {uid: tuple(None if pd.isna(v) else v for v in got.loc[uid, cols]) for uid in got.index}
    assert rows == {
        "u-h": ("hami", 0.3, 3000.0, None, "nvidia.com/gpu"),
        "u-r": ("runai", 0.5, None, 0.25, "gpu-fraction"),
        "u-w": (None, None, None, None, "nvidia.com/gpu"),
    }
    assert str(got["gpu_share"].dtype) == "float64"


def test_mig_profile_is_stored_and_filled_in(engine: Engine) -> None:
    card = GpuRecord(uuid="GPU-p", node="n1", index=0, model="NVIDIA A100-SXM4-40GB")
    mig = GpuRecord(uuid="MIG-1", node="n1", parent_uuid="GPU-p", mig_profile="3g.20gb")
    with engine.begin() as conn:
        upsert_gpus(conn, [card, GpuRecord(uuid="MIG-1", node="n1", parent_uuid="GPU-p")])
        upsert_gpus(conn, [mig])
        upsert_gpus(conn, [GpuRecord(uuid="MIG-1", node="n1")])  # says nothing: keeps it
    with engine.connect() as conn:
        got = reads.read_gpus(conn).set_index("uuid")
    assert got.loc["MIG-1", "mig_profile"] == "3g.20gb"
    assert got.loc["MIG-1", "parent_uuid"] == "GPU-p"
    assert pd.isna(got.loc["GPU-p", "mig_profile"])


def test_assignments_carry_replicas_and_share(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1"), GpuRecord("GPU-b", "n1")])
        upsert_pods(conn, [_pod(), _pod(uid="u-2", name="train-1")])
        a, b = ids["GPU-a"], ids["GPU-b"]
        upsert_assignments(
            conn,
            [("u-1", a, 1_000), ("u-2", b, 1_000)],
            source="pod-resources",
            shares={("u-1", a): (2, None), ("u-2", b): (None, 0.3)},
        )
        # a later observation that says nothing keeps what was said; a new value replaces it
        upsert_assignments(
            conn,
            [("u-1", a, 9_000), ("u-2", b, 9_000)],
            source="pod-resources",
            shares={("u-2", b): (None, 0.4)},
        )
        upsert_assignments(conn, [("u-2", a, 5_000)], source="dcgm")
    with engine.connect() as conn:
        got = reads.read_assignments(conn).sort_values(["pod_uid", "gpu_uuid"])
    records = [
        (p, g, None if r is pd.NA else int(r), None if pd.isna(s) else s)
        for p, g, r, s in got[["pod_uid", "gpu_uuid", "replicas", "share"]].itertuples(index=False)
    ]
    assert records == [
        ("u-1", "GPU-a", 2, None),
        ("u-2", "GPU-a", None, None),
        ("u-2", "GPU-b", None, 0.4),
    ]
    assert str(got["replicas"].dtype) == "Int64"


def test_tenant_samples_are_idempotent_and_read_per_card_range(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1"), GpuRecord("GPU-b", "n1")])
    a, b = ids["GPU-a"], ids["GPU-b"]
    samples = [
        TenantSample("GPU-a", "u-1", 1_000, 30.0),
        TenantSample("GPU-a", "u-2", 1_000, 12.5),
        TenantSample("GPU-a", "u-1", 2_000, None),
        TenantSample("GPU-a", "u-1", 3_000, 40.0),
        TenantSample("GPU-b", "u-3", 1_000, 99.0),
        TenantSample("GPU-b", "u-3", 5_000, 1.0),
    ]
    for _ in range(2):
        with engine.begin() as conn:
            insert_tenant_samples(conn, samples, ids)
    with engine.connect() as conn:
        got = reads.read_tenant_util(
            conn, [(a, 1_000, 3_000), (b, 0, 2_000)], {a: "GPU-a", b: "GPU-b"}
        )
        empty = reads.read_tenant_util(conn, [], {})
    assert list(got.columns) == ["gpu", "pod_uid", "ts_ms", "util"]
    rows = [(g, p, t, None if pd.isna(u) else u) for g, p, t, u in got.itertuples(index=False)]
    assert rows == [
        ("GPU-a", "u-1", 1_000, 30.0),
        ("GPU-a", "u-2", 1_000, 12.5),
        ("GPU-a", "u-1", 2_000, None),
        ("GPU-b", "u-3", 1_000, 99.0),
    ]
    assert str(got["ts_ms"].dtype) == "int64"
    assert str(got["util"].dtype) == "float64"
    assert list(empty.columns) == ["gpu", "pod_uid", "ts_ms", "util"]
    assert empty.empty


def test_read_nodes_gives_labels_as_a_dict(engine: Engine) -> None:
    labels = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    row = {
        "name": "n1",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpu_capacity": 8,
        "gpu_allocatable": 8,
        "unschedulable": False,
        "labels": labels,
        "resource_version": "7",
        "updated_ms": 1,
    }
    with engine.begin() as conn:
        upsert_nodes(conn, [row, {**row, "name": "n0", "gpu_model": None, "labels": {}}])
    with engine.connect() as conn:
        got = reads.read_nodes(conn)
    assert got.to_dict("records") == [
        {"name": "n0", "gpu_model": None, "labels": {}},
        {"name": "n1", "gpu_model": "NVIDIA H100 80GB HBM3", "labels": labels},
    ]


def test_results_say_which_time_was_estimated(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1", index=0)])
        upsert_pods(conn, [_pod()])
        base = {"gpu_id": ids["GPU-a"], "inferred": False}
        run = replace_audit_run(
            conn,
            window=(0, 3_600_000),
            shard="all",
            created_ms=1,
            thresholds={},
            version="test",
            results=[
                {**base, "pod_uid": "u-1", "category": "busy", "seconds": 60.0, "estimated": True},
                {**base, "pod_uid": None, "category": "unallocated", "seconds": 30.0},
            ],
            findings=[],
        )
    with engine.connect() as conn:
        got = reads.read_results(conn, [run]).sort_values("seconds")
    assert got["estimated"].tolist() == [False, True]  # unsaid: false


def test_a_rollup_deletes_per_pod_utilisation_before_its_cut(engine: Engine) -> None:
    """Raw per-tenant rows do not outlive the raw samples they go with."""
    from auditor.settings import Thresholds
    from auditor.store.rollup import rollup

    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord(uuid="GPU-a", node="n1")])
        insert_samples(conn, [GpuSample("GPU-a", t, 50.0) for t in (0, 60_000, 180_000)], ids)
        insert_tenant_samples(
            conn, [TenantSample("GPU-a", "u-1", t, 25.0) for t in (0, 60_000, 180_000)], ids
        )
        rollup(conn, before_ms=120_000, thresholds=Thresholds())
    with engine.connect() as conn:
        left = reads.read_tenant_util(conn, [(ids["GPU-a"], 0, 10**9)], {ids["GPU-a"]: "GPU-a"})
    assert left["ts_ms"].tolist() == [180_000]
