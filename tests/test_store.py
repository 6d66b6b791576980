"""The store on SQLite and a real PostgreSQL: writes are idempotent, pods merge by UID."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from auditor.model import GpuRecord, GpuSample, PodRecord, WorkloadKind
from auditor.store import reads
from auditor.store.schema import gpu_samples, gpus, pods
from auditor.store.writes import (
    insert_samples,
    replace_audit_run,
    supersedes,
    upsert_assignments,
    upsert_gpus,
    upsert_pods,
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
    assert mapping.to_dict("records") == [{"pod_uid": "u-1", "gpu_uuid": "GPU-a"}]
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
