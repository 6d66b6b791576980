"""Reading kubectl YAML (lists, multi-document files, watch streams), Node objects in JSON
and YAML, several files in one import, and PyTorchJob ranks settled across a job's pods.

Every JSON fixture under fixtures/pods, dumped as YAML with `yaml.safe_dump`, must give the
same records as the JSON; hostile YAML is refused with one line naming file and line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.collect.kubectl_files import is_yaml, read_kubectl
from auditor.collect.kubectl_json import KubectlRecord
from auditor.errors import InputError
from auditor.settings import TeamRules
from auditor.store.connection import make_engine
from auditor.store.schema import nodes, pods

PODS = Path(__file__).parents[1] / "fixtures" / "pods"
TEAMS = TeamRules()
runner = CliRunner()
JSON_FIXTURES = sorted(
    p
    for p in [*PODS.glob("*.json"), *(PODS / "controllers").glob("*.json")]
    if p.name != "watch-expired.json"  # ends in an error; compared in its own test
)


def json_documents(path: Path) -> list[Any]:
    """The JSON values of a file, back to back (a watch stream has many)."""
    text, decoder, out, i = path.read_text(), json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)


def as_yaml(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / f"{source.stem}.yaml"
    path.write_text(yaml.safe_dump_all(json_documents(source)))
    return path


def read(path: Path) -> list[KubectlRecord]:
    return list(read_kubectl(path, teams=TEAMS, node_ms=1))


def error_of(tmp_path: Path, text: str, name: str = "pods.yaml") -> InputError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read(path)
    assert len(str(e.value)) < 300
    assert "\n" not in str(e.value)
    assert e.value.file == str(path)
    return e.value


# ---------------------------------------------------------------------------------------------
# the same records as JSON


@pytest.mark.parametrize("source", JSON_FIXTURES, ids=lambda p: p.name)
def test_yaml_dump_of_each_fixture_gives_the_json_records(tmp_path: Path, source: Path) -> None:
    yaml_path = as_yaml(tmp_path, source)
    assert is_yaml(yaml_path)
    assert not is_yaml(source)
    expected = read(source)
    assert expected  # every fixture holds a GPU pod or a node
    assert read(yaml_path) == expected


def test_a_yaml_watch_that_ends_in_410_keeps_the_events_before_it(tmp_path: Path) -> None:
    path = as_yaml(tmp_path, PODS / "watch-expired.json")
    names = [r.name for r in read(path)]  # type: ignore[union-attr]
    assert names[:1] == ["bert-eval-qz8tn"]
    # the same events as the JSON reader keeps
    assert names == [r.name for r in read(PODS / "watch-expired.json")]  # type: ignore[union-attr]


def test_watch_error_in_a_yaml_stream_is_refused_at_its_document(tmp_path: Path) -> None:
    source = tmp_path / "watch-500.json"
    source.write_text(
        (PODS / "watch-expired.json").read_text().replace('"code": 410', '"code": 500')
    )
    path = as_yaml(tmp_path, source)
    records = read_kubectl(path, teams=TEAMS)
    assert next(records).name == "bert-eval-qz8tn"  # type: ignore[union-attr]
    with pytest.raises(InputError) as e:
        next(records)
    lines = path.read_text().split("\n")
    assert lines[e.value.line - 1] in ("---", "object:") or "type: ERROR" in "\n".join(
        lines[e.value.line - 1 : e.value.line + 40]
    )
    assert "500 Expired" in e.value.message
    assert e.value.field == "object"


def test_kubectl_style_yaml_list_multi_document_and_watch_stream(tmp_path: Path) -> None:
    docs = json_documents(PODS / "list.json")[0]["items"]
    expected = read(PODS / "list.json")
    # kubectl get pod a b -o yaml / hand-written manifests: one object per document
    multi = tmp_path / "multi.yml"
    multi.write_text("---\n" + "---\n".join(yaml.safe_dump(d) for d in docs) + "---\n")
    assert read(multi) == expected
    # --watch -o yaml --output-watch-events: events separated by ---, no extension
    events = tmp_path / "watch"
    events.write_text("\n---\n".join(yaml.safe_dump({"type": "ADDED", "object": d}) for d in docs))
    assert read(events) == expected


def test_a_file_with_no_document_is_refused(tmp_path: Path) -> None:
    e = error_of(tmp_path, "# kubectl failed\n---\n")
    assert "the file is empty" in e.message


# ---------------------------------------------------------------------------------------------
# hostile YAML


def test_aliases_are_refused_without_expanding_them(tmp_path: Path) -> None:
    laughs = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    e = error_of(tmp_path, "\n".join(laughs) + "\n")
    assert "aliases (*a) are not accepted" in e.message
    assert e.line == 2


def test_an_unquoted_boolean_label_names_the_field_and_its_line(tmp_path: Path) -> None:
    pod = json_documents(PODS / "single-pod.json")[0]
    pod["metadata"]["labels"]["spot"] = "PLACEHOLDER"
    text = yaml.safe_dump(pod).replace("spot: PLACEHOLDER", "spot: yes")
    e = error_of(tmp_path, text)
    assert e.field == "metadata.labels.spot"
    assert e.line == text.split("\n").index("    spot: yes") + 1
    assert "values must be strings" in e.message
    assert "unquoted 'yes' as a boolean: quote it" in e.message


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("kind: Pod\nmetadata:\n  labels:\n    1: a\n", 4, "a key must be a string"),
        ("kind: Pod\nmetadata:\n\tname: a\n", 3, "a tab character"),
        ("kind: Pod\nmetadata: !!python/object:os.system {}\n", 2, "tag"),
        ("kind: Pod\n<<: {a: 1}\n", 2, "merge keys"),
        ("kind: Pod\nmetadata: [\n", 3, "not valid YAML"),
        ("- 1\n- 2\n", 1, "got a sequence"),
        ("kind: Service\nspec: {}\n", 1, "got kind=Service"),
        ("kind: List\nitems:\n- kind: Secret\n", 3, "got kind=Secret"),
        ("kind: List\nitems: 3\n", 1, "must be a list"),
        ("a:" + " [" * 80 + "]" * 80 + "\n", 1, "nested more than"),
    ],
)
def test_hostile_or_wrong_yaml_is_one_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    e = error_of(tmp_path, text)
    assert e.line == line
    assert message in e.message


def test_a_huge_object_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.collect import kubectl_yaml

    monkeypatch.setattr(kubectl_yaml, "MAX_NODES", 1000)
    pod = json_documents(PODS / "single-pod.json")[0]
    pod["metadata"]["annotations"] = {f"k{i}": "v" for i in range(2000)}
    e = error_of(tmp_path, yaml.safe_dump(pod))
    assert "more than 1000 values" in e.message


def test_json_is_read_by_the_json_reader_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "pods.txt"
    path.write_text("\ufeff\n  " + (PODS / "single-pod.json").read_text())
    assert not is_yaml(path)
    assert read(path) == read(PODS / "single-pod.json")


# ---------------------------------------------------------------------------------------------
# Node objects


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **labels},
        },
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "2", "cpu": "64"},
            "allocatable": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "2"},
        },
    }


SHARED = {
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/mig.config": "all-3g.40gb",
}


@pytest.mark.parametrize(
    "shape", ["alone-yaml", "nodelist-json", "mixed-list-yaml", "mixed-list-json"]
)
def test_nodes_alone_in_a_node_list_or_with_pods(tmp_path: Path, shape: str) -> None:
    a, b = node("gpu-a", **SHARED), node("gpu-b", **{"nvidia.com/gpu.product": "X" * 300})
    pod = json_documents(PODS / "single-pod.json")[0]
    if shape == "alone-yaml":
        path, text = tmp_path / "n.yaml", yaml.safe_dump(a) + "---\n" + yaml.safe_dump(b)
    elif shape == "nodelist-json":
        path, text = tmp_path / "n.json", json.dumps({"kind": "NodeList", "items": [a, b]})
    else:
        doc = {"kind": "List", "items": [pod, a, b]}
        path = tmp_path / ("n.yaml" if shape.endswith("yaml") else "n.json")
        text = yaml.safe_dump(doc) if shape.endswith("yaml") else json.dumps(doc)
    path.write_text(text)
    records = read(path)
    rows = [r for r in records if isinstance(r, dict)]
    assert [r["name"] for r in rows] == ["gpu-a", "gpu-b"]
    first = rows[0]
    assert first["gpu_model"] == "NVIDIA-A100-SXM4-80GB"
    # 4 time-slicing replicas of one card (replicas=4), and 2 MIG instances
    assert (first["gpu_capacity"], first["gpu_allocatable"]) == (3, 3)
    assert {k: first["labels"][k] for k in SHARED} == SHARED
    assert len(rows[1]["gpu_model"]) == 128  # fitted to the column, not refused
    assert len(records) == (3 if shape.startswith("mixed") else 2)


# ---------------------------------------------------------------------------------------------
# the CLI: several files, nodes stored, ranks settled


def invoke(db: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", db, *args])
    return result.exit_code, result.output


def test_several_files_one_bad_is_refused_and_the_rest_imported(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    good = as_yaml(tmp_path, PODS / "list.json")
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump({"kind": "List", "items": [node("gpu-a", **SHARED)]}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(json_documents(PODS / "single-pod.json")[0]) + "x: *nope\n")
    code, out = invoke(db, "import", "pods", str(good), str(bad), str(nodes_file))
    assert code == 2, out
    lines = out.strip().split("\n")
    assert lines[0].startswith(f"imported 7 GPU pod records and 0 nodes from {good} in ")
    assert lines[1].startswith(f"auditor: error: {bad}:")
    assert lines[2].startswith(f"imported 0 GPU pod records and 1 nodes from {nodes_file} in ")
    assert lines[3] == "auditor: error: 1 of 3 files refused (nothing of them written): bad.yaml"
    engine = make_engine(db)
    with engine.connect() as conn:
        names = set(conn.execute(select(pods.c.name)).scalars())
        (labels,) = conn.execute(select(nodes.c.labels)).scalars()
        (updated,) = conn.execute(select(nodes.c.updated_ms)).scalars()
    engine.dispose()
    assert "triton-ensemble-1" not in names  # the bad file's pod: rolled back
    assert len(names) == 7
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert updated == int(nodes_file.stat().st_mtime * 1000)


def pytorch_pod(job: str, role: str, index: int, *, rank_env: bool) -> dict[str, Any]:
    pod = copy.deepcopy(json_documents(PODS / "controllers" / "pytorchjob-worker.json")[0])
    meta = pod["metadata"]
    meta["name"] = f"{job}-{role}-{index}"
    meta["uid"] = f"{job}-{role}-{index}-uid"
    meta["ownerReferences"][0]["name"] = job
    meta["labels"].update(
        {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": role,
            "training.kubeflow.org/replica-index": str(index),
        }
    )
    env = pod["spec"]["containers"][0]["env"]
    pod["spec"]["containers"][0]["env"] = [e for e in env if e["name"] != "RANK" or rank_env]
    return pod


def stored_ranks(db: str) -> dict[str, int | None]:
    engine = make_engine(db)
    with engine.connect() as conn:
        out = {name: rank for name, rank in conn.execute(select(pods.c.name, pods.c.rank))}
    engine.dispose()
    return out


def test_pytorchjob_worker_ranks_with_and_without_a_master(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    workers = [pytorch_pod("solo", "worker", i, rank_env=False) for i in range(3)]
    duo = [pytorch_pod("duo", "worker", i, rank_env=False) for i in range(2)]
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"kind": "List", "items": workers + duo}))
    assert invoke(db, "import", "pods", str(first))[0] == 0
    ranks = stored_ranks(db)
    assert [ranks[f"solo-worker-{i}"] for i in range(3)] == [0, 1, 2]  # no master: 0..N-1
    assert [ranks[f"duo-worker-{i}"] for i in range(2)] == [0, 1]
    # duo's master shows up in a later capture: its workers become 1..N
    master = pytorch_pod("duo", "master", 0, rank_env=False)
    later = tmp_path / "later.yaml"
    later.write_text(yaml.safe_dump(master) + "---\n" + yaml.safe_dump(duo[1]))
    assert invoke(db, "import", "pods", str(later))[0] == 0
    ranks = stored_ranks(db)
    assert [ranks["duo-master-0"], ranks["duo-worker-0"], ranks["duo-worker-1"]] == [0, 1, 2]
    assert [ranks[f"solo-worker-{i}"] for i in range(3)] == [0, 1, 2]


def test_an_operator_rank_is_kept_even_without_a_master_pod_stored(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    worker = pytorch_pod("cpu-master", "worker", 1, rank_env=True)  # RANK=2: a CPU-only master
    path = tmp_path / "w.json"
    path.write_text(json.dumps(worker))
    assert invoke(db, "import", "pods", str(path))[0] == 0
    assert stored_ranks(db)["cpu-master-worker-1"] == 2
