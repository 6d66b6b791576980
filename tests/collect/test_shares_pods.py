"""Shared-GPU pods (SPEC §7) through the real readers: which pods hold GPUs, how many units,
and what share of a card each asks for; HAMi's named cards become exact assignments; a value
no real system writes is one line naming file, line and field in the importer, and is
counted and skipped in the watcher."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.collect import shares
from auditor.collect.kubectl_files import read_kubectl
from auditor.collect.pod_records import pod_record
from auditor.errors import ConfigError, PodFieldError
from auditor.jobs.watch_sinks import PodSink, requests_gpus
from auditor.model import GpuRecord, PodRecord
from auditor.settings import Sharing, TeamRules, load_config
from auditor.store import reads
from auditor.store.schema import gpu_assignments, gpus, pods
from auditor.store.writes import upsert_gpus

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pods" / "sharing"
runner = CliRunner()

Expected = tuple[int, str, str | None, float | None, float | None, float | None]
"""gpu_count, gpu_resource, share_kind, gpu_share, gpu_mem_mib, gpu_mem_share."""

DECISIONS: dict[tuple[str, str], Expected] = {
    # time-slicing: the pod asks for replicas and does not know it; the node's labels tell
    ("timeslicing", "nb-alice-0"): (1, "nvidia.com/gpu", None, None, None, None),
    ("timeslicing", "nb-bob-0"): (2, "nvidia.com/gpu", None, None, None, None),
    ("timeslicing", "nb-carol-0"): (1, "nvidia.com/gpu.shared", None, None, None, None),
    # MIG: instances held, the profile names the share
    ("mig", "llm-small-7d9f-abcde"): (1, "nvidia.com/mig-3g.20gb", "mig", None, None, None),
    ("mig", "embed-5c6b-fghij"): (2, "nvidia.com/mig-1g.5gb", "mig", None, None, None),
    ("mig", "mixed-mig-0"): (
        2,
        "nvidia.com/mig-1g.10gb,nvidia.com/mig-2g.20gb",
        "mig",
        None,
        None,
        None,
    ),
    # HAMi: vGPUs held; cores / 100 is the share; memory in MiB ("3k" is 3000, "2Gi" 2048)
    ("hami", "hami-cores-0"): (1, "nvidia.com/gpu", "hami", 0.3, 3000.0, None),
    ("hami", "hami-mem-0"): (1, "nvidia.com/gpu", "hami", None, 3000.0, None),
    ("hami", "hami-plain-0"): (1, "nvidia.com/vgpu", "hami", None, None, None),
    ("hami", "hami-pct-0"): (2, "nvidia.com/gpu", "hami", None, None, 0.5),  # cores "0": none
    ("hami", "hami-gib-0"): (1, "nvidia.com/gpu", "hami", 0.25, 2048.0, None),
    ("hami", "hami-defaults-0"): (1, "nvidia.com/gpumem", "hami", None, 4096.0, None),
    # Run:ai: annotations only; the reservation pod holds nothing of its own
    ("runai", "frac-job-0-0"): (1, "gpu-fraction", "runai", 0.5, None, None),
    ("runai", "runai-reservation-gpu-runai-1-7x2kq"): (
        0,
        "nvidia.com/gpu",
        "runai-reservation",
        None,
        None,
        None,
    ),
    ("runai", "mig-job-0-0"): (1, "nvidia.com/mig-3g.20gb", "mig", None, None, None),
    ("runai", "alloc-only-0-0"): (1, "runai-allocated-gpus", "runai", 0.25, None, None),
    ("runai", "multi-frac-0-0"): (2, "gpu-fraction", "runai", 0.5, None, None),
    # Alibaba gpu-milli (OpenB) and the memory-shared GPU
    ("milli", "openb-pod-0457"): (1, "alibabacloud.com/gpu-milli", "milli", 0.46, None, None),
    ("milli", "openb-pod-0458"): (1, "alibabacloud.com/gpu-milli", "milli", 1.0, 16384.0, None),
    ("milli", "openb-pod-0459"): (2, "alibabacloud.com/gpu-milli", "milli", None, None, None),
    ("milli", "gpushare-0"): (1, "aliyun.com/gpu-mem", "milli", None, 8192.0, None),
    ("milli", "openb-pod-0001"): (1, "alibabacloud.com/gpu-milli", "milli", 0.46, None, None),
    ("milli", "openb-pod-0102"): (8, "alibabacloud.com/gpu-milli", "milli", 1.0, None, None),
    # openb-pod-0103 (milli 0, count 0) holds no GPU: it is in no row
}


def _records(kind: str, sharing: Sharing | None = None) -> dict[str, PodRecord]:
    found = read_kubectl(FIXTURES / f"{kind}.json", teams=TeamRules(), sharing=sharing)
    return {r.name: r for r in found if isinstance(r, PodRecord)}


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (
        a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12)
    )


@pytest.mark.parametrize(("kind", "name"), list(DECISIONS))
def test_each_kind_of_sharing_is_recognised(kind: str, name: str) -> None:
    rec = _records(kind)[name]
    count, resource, share_kind, share, mem, mem_share = DECISIONS[(kind, name)]
    assert (rec.gpu_count, rec.gpu_resource, rec.share_kind) == (count, resource, share_kind)
    assert _close(rec.gpu_share, share), rec.gpu_share
    assert _close(rec.gpu_mem_mib, mem), rec.gpu_mem_mib
    assert _close(rec.gpu_mem_share, mem_share), rec.gpu_mem_share


def test_the_table_round_trips_through_import_and_the_store(db: str) -> None:
    """`auditor import pods` of every fixture, then `read_pods`: the same table, on SQLite
    and PostgreSQL."""
    from auditor.store.connection import make_engine

    for kind in ("timeslicing", "mig", "hami", "runai", "milli"):
        code, out = invoke(db, "import", "pods", str(FIXTURES / f"{kind}.json"))
        assert code == 0, out
    engine = make_engine(db)
    with engine.connect() as conn:
        stored = reads.read_pods(conn).set_index("name")
    engine.dispose()
    cols = ["gpu_count", "gpu_resource", "share_kind", "gpu_share", "gpu_mem_mib", "gpu_mem_share"]
    got = {
        name: tuple(None if pd.isna(v) else v for v in stored.loc[name, cols])
        for name in stored.index
    }
    assert got == {name: want for (_, name), want in DECISIONS.items()}


def test_every_fixture_pod_is_in_the_table() -> None:
    """No pod of a fixture is silently dropped as holding no GPU."""
    for kind in ("timeslicing", "mig", "hami", "runai", "milli"):
        assert set(_records(kind)) == {n for k, n in DECISIONS if k == kind}


def _only(path: Path) -> dict[str, Any]:
    items: list[dict[str, Any]] = json.loads(path.read_text())["items"]
    return items[0]


@pytest.mark.parametrize(
    ("pod", "holds"),
    [
        ({"metadata": {"namespace": "x"}, "spec": {"containers": [{"name": "c"}]}}, False),
        ({"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": {}}, True),
        ({"metadata": {"annotations": {"nvidia.com/mig-1g.10gb": "1"}}, "spec": {}}, True),
        ({"metadata": {"annotations": {"team": "a"}}, "spec": {}}, False),  # no GPU annotation
        (
            {
                "metadata": {"namespace": "runai-reservation"},
                "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
            True,
        ),
        (
            {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/vgpu": "1"}}}]}},
            True,
        ),
        (
            {
                "spec": {
                    "containers": [{"resources": {"limits": {"alibabacloud.com/gpu-milli": "250"}}}]
                }
            },
            True,
        ),
    ],
)
def test_the_watcher_keeps_pods_that_hold_a_share(pod: dict[str, Any], holds: bool) -> None:
    assert requests_gpus(pod) is holds


@pytest.mark.parametrize("text", ["0.5", ".5", "5e-1", "5E-1", "+0.5", " 0.50 ", "50e-2"])
def test_a_runai_fraction_is_read_as_go_parses_a_float(text: str) -> None:
    ask = shares.gpu_ask({}, {}, namespace="ml", annotations={"gpu-fraction": text})
    assert ask.share == pytest.approx(0.5)


# ------------------------------------------------------------------ hostile values

HOSTILE = {
    "fraction-above-one": ("metadata.annotations.gpu-fraction", "1.5"),
    "fraction-negative": ("metadata.annotations.gpu-fraction", "-0.2"),
    "fraction-text": ("metadata.annotations.gpu-fraction", "abc"),
    "fraction-zero": ("metadata.annotations.gpu-fraction", "0"),
    "cores-above-100": ("nvidia.com/gpucores", "150"),
    "gpumem-text": ("nvidia.com/gpumem", "lots"),
    "milli-fraction": ("alibabacloud.com/gpu-milli", "0.5"),
    "hami-devices": ("hami.io/vgpu-devices-allocated", "GPU-0fc3eda5,NVIDIA:;"),
    "mig-annotation": ("metadata.annotations.nvidia.com/mig-1g.10gb", "one"),
    "milli-annotation": ("metadata.annotations.alibabacloud.com/gpu-milli", "half"),
}


def invoke(db: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", db, *args])
    return result.exit_code, result.output


@pytest.fixture
def db(db_url: str) -> str:
    code, out = invoke(db_url, "db", "upgrade")
    assert code == 0, out
    return db_url


def _line_of(path: Path, value: str) -> int:
    needle = json.dumps(value)
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip(",").endswith(needle))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_value_is_one_line_naming_file_line_and_field(case: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    assert invoke(db, "import", "pods", str(FIXTURES / "runai.json"))[0] == 0
    engine_counts = _pod_count(db)
    path = FIXTURES / f"bad-{case}.json"
    field, value = HOSTILE[case]
    code, out = invoke(db, "import", "pods", str(path))
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1, out
    assert f"bad-{case}.json:{_line_of(path, value)}" in out, out
    assert field in out, out
    assert _pod_count(db) == engine_counts


def _pod_count(db: str) -> int:
    from auditor.store.connection import make_engine

    engine = make_engine(db)
    with engine.connect() as conn:
        n = len(conn.execute(select(pods.c.uid)).all())
    engine.dispose()
    return n


def test_the_watcher_counts_and_skips_hostile_pods(engine: Engine) -> None:
    skipped: list[str] = []
    sink = PodSink(
        engine,
        scope="pods",
        teams=TeamRules(),
        in_scope=lambda _ns, _labels: True,
        on_skip=skipped.append,
    )
    good = json.loads((FIXTURES / "runai.json").read_text())["items"]
    bad = [_only(FIXTURES / f"bad-{case}.json") for case in HOSTILE]
    for i, pod in enumerate(bad):
        pod["metadata"]["uid"] = f"bad-{i}"
    stored = sink.replace([*bad, *good], resource_version="7", at_ms=1_800_000_000_000)
    assert stored == len(good)
    assert skipped == ["unreadable"] * len(bad)
    with engine.connect() as conn:
        kinds = dict(conn.execute(select(pods.c.name, pods.c.share_kind)).all())
    assert kinds["frac-job-0-0"] == "runai"
    assert kinds["runai-reservation-gpu-runai-1-7x2kq"] == "runai-reservation"


# ------------------------------------------------------------------ HAMi's named cards

CARD = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def _assignments(db: str) -> dict[tuple[str, str], tuple[str, float | None]]:
    from auditor.store.connection import make_engine

    engine = make_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(
            select(pods.c.name, gpus.c.uuid, gpu_assignments.c.source, gpu_assignments.c.share)
            .join(pods, pods.c.uid == gpu_assignments.c.pod_uid)
            .join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
        ).all()
        nodes = dict(conn.execute(select(gpus.c.uuid, gpus.c.node)).all())
    engine.dispose()
    assert nodes.get(CARD) == "gpu-hami-1"
    return {(p, g): (s, share) for p, g, s, share in rows}


def test_hami_cards_become_exact_assignments(db: str) -> None:
    """cores / 100 where set; else the memory over the card's, once the card's memory is
    known; else none. Cards not seen yet are added to the pod's node; a re-import is a
    no-op."""
    for _ in range(2):
        code, out = invoke(db, "import", "pods", str(FIXTURES / "hami.json"))
        assert code == 0, out
    got = _assignments(db)
    assert got == {
        ("hami-cores-0", CARD): ("hami", 0.3),
        ("hami-mem-0", CARD): ("hami", None),
        ("hami-plain-0", CARD): ("hami", None),
        ("hami-pct-0", "GPU-7d3c9e21-5f1a-4b8e-9a3c-1e2f3a4b5c6d"): ("hami", None),
        ("hami-pct-0", "GPU-a2b4c6d8-1357-4e9f-8a2b-4c6d8e0f1a3b"): ("hami", None),
    }


def test_hami_memory_share_uses_the_cards_known_memory(db: str) -> None:
    from auditor.store.connection import make_engine

    engine = make_engine(db)
    with engine.begin() as conn:
        upsert_gpus(conn, [GpuRecord(CARD, "gpu-hami-1", 0, "Tesla V100", 32768.0)])
    engine.dispose()
    assert invoke(db, "import", "pods", str(FIXTURES / "hami.json"))[0] == 0
    got = _assignments(db)
    assert got[("hami-mem-0", CARD)] == ("hami", pytest.approx(3000 / 32768))
    assert got[("hami-cores-0", CARD)] == ("hami", 0.3)  # cores win over memory


def test_a_watched_hami_pod_gets_its_cards(engine: Engine) -> None:
    sink = PodSink(engine, scope="pods", teams=TeamRules(), in_scope=lambda _n, _l: True)
    items = json.loads((FIXTURES / "hami.json").read_text())["items"]
    assert sink.replace(items, resource_version="9", at_ms=1_800_000_000_000) == len(items)
    with engine.connect() as conn:
        mapping = reads.read_assignments(conn)
    cores = mapping[mapping["gpu_uuid"] == CARD]["share"].dropna().tolist()
    assert cores == [0.3]
    assert len(mapping) == 5


# ------------------------------------------------------------------ the config's extra names


def test_extra_names_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text(
        '[sharing]\nfraction_annotations = ["example.com/gpu-fraction"]\n'
        '[sharing.resources]\n"example.com/vgpu" = "hami"\n"example.com/milli" = "milli"\n'
    )
    sharing = load_config(config).sharing
    pod = _only(FIXTURES / "hami.json")
    for section in pod["spec"]["containers"][0]["resources"].values():
        section.pop("nvidia.com/gpu")
        section["example.com/vgpu"] = "1"
    path = tmp_path / "pods.json"
    frac = json.loads(json.dumps(_only(FIXTURES / "runai.json")))
    frac["metadata"]["annotations"] = {"example.com/gpu-fraction": "0.2"}
    frac["metadata"]["uid"] = "u-frac"
    path.write_text(json.dumps({"kind": "List", "items": [pod, frac]}))
    plain = {r.name: r for r in read_kubectl(path, teams=TeamRules()) if isinstance(r, PodRecord)}
    got = {
        r.name: r
        for r in read_kubectl(path, teams=TeamRules(), sharing=sharing)
        if isinstance(r, PodRecord)
    }
    assert set(plain) == {"hami-cores-0"}  # HAMi's own values alone: its default, one vGPU
    assert plain["hami-cores-0"].gpu_resource == "nvidia.com/gpucores,nvidia.com/gpumem"
    assert (got["hami-cores-0"].share_kind, got["hami-cores-0"].gpu_share) == ("hami", 0.3)
    assert got["hami-cores-0"].gpu_resource == "example.com/vgpu"
    assert (got["frac-job-0-0"].share_kind, got["frac-job-0-0"].gpu_share) == ("runai", 0.2)


def test_a_bad_sharing_kind_in_the_config_is_named(tmp_path: Path) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text('[sharing.resources]\n"example.com/vgpu" = "half"\n')
    with pytest.raises(ConfigError, match=re.escape("sharing.resources.example.com/vgpu")):
        load_config(config)


def test_a_card_named_on_two_nodes_is_kept_on_the_first(engine: Engine) -> None:
    """Two watched pods whose annotations put one card on two nodes: the card goes on the
    first node, the other pod's claim is left out, and the watcher goes on."""
    items = json.loads((FIXTURES / "hami.json").read_text())["items"][:2]
    items[1]["spec"]["nodeName"] = "gpu-hami-9"
    sink = PodSink(engine, scope="pods", teams=TeamRules(), in_scope=lambda _n, _l: True)
    assert sink.replace(items, resource_version="3", at_ms=1_800_000_000_000) == 2
    with engine.connect() as conn:
        mapping = reads.read_assignments(conn)
        node = conn.execute(select(gpus.c.node).where(gpus.c.uuid == CARD)).scalar_one()
    assert node == "gpu-hami-1"
    assert mapping["pod_uid"].tolist() == [items[0]["metadata"]["uid"]]


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(
        [
            "gpu-fraction",
            "runai-allocated-gpus",
            "nvidia.com/mig-1g.10gb",
            "gpu-fraction-num-devices",
        ]
    ),
    value=st.text(max_size=12),
)
def test_any_annotation_value_is_a_share_or_a_named_refusal(key: str, value: str) -> None:
    """Whatever text an annotation holds, the ask is readable or refused naming the field:
    never another exception, never a share outside (0, 1]."""
    annotations = {"gpu-fraction": "0.5", key: value}
    field = ""
    try:
        ask = shares.gpu_ask({}, {}, namespace="ml", annotations=annotations)
    except PodFieldError as e:
        field = e.field or "(none)"
    if field:
        assert field.startswith("metadata.annotations.")
        return
    assert ask.count >= 1
    assert ask.share is None or 0 < ask.share <= 1


@settings(max_examples=60, deadline=None)
@given(qty=st.one_of(st.text(max_size=10), st.integers(-5, 10**6), st.floats()))
def test_any_hami_quantity_is_a_number_or_a_named_refusal(qty: object) -> None:
    field = ""
    try:
        value = shares.per_device_value("nvidia.com/gpumem", qty, "spec.containers[0].x")
    except PodFieldError as e:
        field = e.field or "(none)"
    if field:
        assert field == "spec.containers[0].x"
        return
    assert math.isfinite(value)
    assert value >= 0


def _realdata() -> Path:
    env = os.environ.get("AUDITOR_REALDATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "realdata"


OPENB_PODS = _realdata() / "alibaba-gpu-v2023-openb" / "openb_pod_list_default.csv"


@pytest.mark.skipif(
    not OPENB_PODS.exists(),
    reason="the OpenB trace (../shared/realdata/alibaba-gpu-v2023-openb) is not beside the repo",
)
def test_the_real_openb_pods_hold_what_the_trace_says() -> None:
    """Each of the trace's 8,152 pods as Alibaba's scheduler writes it (per-card milli and a
    card count, as annotations): the cards held and the GPU capacity asked for (sum of
    share x cards) are the trace's, and the fractional pods are the trace's."""
    rows = list(csv.DictReader(OPENB_PODS.open()))
    records = []
    for i, row in enumerate(rows):
        pod = {
            "metadata": {
                "name": row["name"],
                "namespace": "paib-gpu",
                "uid": f"openb-{i}",
                "annotations": {
                    "alibabacloud.com/gpu-milli": row["gpu_milli"],
                    "alibabacloud.com/gpu-count": row["num_gpu"],
                },
            },
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]},
        }
        records.append(pod_record(pod, teams=TeamRules()))
    gpu_rows = [r for r in rows if int(r["num_gpu"]) > 0]
    held = [r for r in records if r is not None]
    assert len(held) == len(gpu_rows)
    assert sum(r.gpu_count for r in held) == sum(int(r["num_gpu"]) for r in gpu_rows)
    asked = sum((r.gpu_share or 1.0) * r.gpu_count for r in held)
    trace = sum(int(r["num_gpu"]) * int(r["gpu_milli"]) / 1000 for r in gpu_rows)
    assert math.isclose(asked, trace, rel_tol=1e-12)
    fractional = [r for r in held if r.gpu_share is not None and r.gpu_share < 1]
    assert len(fractional) == sum(1 for r in gpu_rows if int(r["gpu_milli"]) < 1000)


def test_a_hami_pod_on_a_card_the_log_names_otherwise_is_unobserved_and_named(
    db: str, tmp_path: Path
) -> None:
    """HAMi names the card by UUID, the nvidia-smi log (no uuid column) by NODE/pci.bus_id:
    the pods still appear, their held time unobserved, and the report names the card."""
    lines = ["timestamp, index, pci.bus_id, utilization.gpu [%], memory.used [MiB]"]
    for i in range(120):  # 08:10 to 08:20, every 5 s
        minute, second = divmod(5 * i, 60)
        lines.append(
            f"2026/11/23 08:{10 + minute:02d}:{second:02d}.000, 0, 00000000:3B:00.0, 50 %, 900 MiB"
        )
    log = tmp_path / "gpu-hami-1.csv"
    log.write_text("\n".join(lines) + "\n")
    for args in (
        ["import", "nvidia-smi", str(log), "--node", "gpu-hami-1"],
        ["import", "pods", str(FIXTURES / "hami.json")],
        ["audit", "--start", "2026-11-23T08:10:00", "--end", "2026-11-23T08:20:00"],
    ):
        code, out = invoke(db, *args)
        assert code == 0, out
    code, out = invoke(db, "report", "--by", "pod", "--format", "json")
    assert code == 0, out
    rows = {r["pod"]: r for r in json.loads(out)}
    # hami-cores-0 asks 30 % of the card: 10 minutes x 0.3, all of it unobserved
    assert rows["hami-cores-0"]["unobserved_gpu_hours"] == pytest.approx(3 / 60, abs=1e-6)
    assert rows["hami-cores-0"]["allocated_gpu_hours"] == pytest.approx(3 / 60, abs=1e-6)
    # the sampled card is nobody's: half busy (of the platform), half free
    assert rows["(platform)"]["busy_gpu_hours"] == pytest.approx(5 / 60, abs=1e-6)
    code, table = invoke(db, "report")
    assert f"that pods held ({CARD}" in table.replace("\n", " ")
