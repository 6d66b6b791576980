"""Reading kubectl pod JSON: lists, single pods, watch streams, and bad input.

Fixtures under fixtures/pods are in the shape kubectl writes (4-space indent, sorted keys;
`api-podlist.json` is a raw API answer on one line, `kind` first and items without a kind).
"""

from __future__ import annotations

import json
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.collect.kubectl_json import CHUNK_CHARS, read_kubectl_json, read_kubectl_pods
from auditor.errors import InputError
from auditor.model import PodRecord
from auditor.settings import TeamRules

PODS = Path(__file__).parents[1] / "fixtures" / "pods"
TEAMS = TeamRules()


def read(
    path: Path,
    *,
    chunk_chars: int = CHUNK_CHARS,
    on_progress: Callable[[int], None] | None = None,
) -> list[PodRecord]:
    return list(
        read_kubectl_pods(path, teams=TEAMS, chunk_chars=chunk_chars, on_progress=on_progress)
    )


def error_of(path: Path) -> InputError:
    with pytest.raises(InputError) as e:
        read(path)
    return e.value


def line_of(text: str, needle: str) -> int:
    """1-based line of the only occurrence of `needle` in `text`."""
    assert text.count(needle) == 1, needle
    return text[: text.index(needle)].count("\n") + 1


def item_start_lines(text: str) -> list[int]:
    """Lines where kubectl's list items begin (`{` indented by eight spaces)."""
    return [i for i, line in enumerate(text.split("\n"), 1) if line == "        {"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


# ---------------------------------------------------------------------------------------------
# the shapes kubectl writes


def test_list_yields_gpu_pods_only_in_file_order() -> None:
    records = read(PODS / "list.json")
    assert [r.name for r in records] == [
        "llama-ft-master-0",
        "llama-ft-worker-1",
        "llama-ft-worker-2",
        "eval-sweep-3-x7k2p",
        "llama3-8b-chat-7d9f8c6b5d-x8k2m",
        "sd-finetune-oom",
        "alice-gpu-nb-0",
    ]  # coredns and the dcgm-exporter request no GPU
    by_name = {r.name: r for r in records}
    assert by_name["llama3-8b-chat-7d9f8c6b5d-x8k2m"].gpu_resource == "nvidia.com/mig-3g.40gb"
    pending = by_name["llama-ft-worker-2"]
    assert (pending.node, pending.bound_ms, pending.phase) == (None, None, "Pending")
    failed = by_name["sd-finetune-oom"]
    assert (failed.phase, failed.team, failed.job) == ("Failed", "genai-art", "Pod/sd-finetune-oom")
    assert failed.finished_ms is not None


def test_raw_api_pod_list_on_one_line_with_items_without_kind() -> None:
    records = read(PODS / "api-podlist.json")
    assert [(r.name, r.job) for r in records] == [
        ("vllm-70b-1-2", "LeaderWorkerSet/vllm-70b"),
        ("resnet-tf-worker-1", "TFJob/resnet-tf"),
    ]


def test_single_pod() -> None:
    [rec] = read(PODS / "single-pod.json")
    assert (rec.name, rec.job, rec.rank, rec.gpu_count) == (
        "triton-ensemble-1",
        "StatefulSet/triton-ensemble",
        1,
        2,
    )


def test_watch_events_give_one_record_per_observation() -> None:
    records = read(PODS / "watch-events.json")
    # ADDED coredns (no GPU) is dropped; the BOOKMARK is skipped
    assert [r.name for r in records] == [
        "bert-eval-qz8tn",  # ADDED: bound, containers being created
        "mixtral-infer-0",  # ADDED: unschedulable
        "bert-eval-qz8tn",  # MODIFIED: running
        "mixtral-infer-0",  # DELETED before it was ever scheduled
        "bert-eval-prep-m2r7c",  # DELETED after it succeeded, without a deletionTimestamp
        "bert-eval-qz8tn",  # DELETED: terminated by the deletion
    ]
    added, running, gone = (r for r in records if r.name == "bert-eval-qz8tn")
    assert added.uid == running.uid == gone.uid
    assert added.bound_ms is not None
    assert (added.started_ms, added.finished_ms, added.deleted_ms) == (None, None, None)
    assert running.bound_ms == added.bound_ms
    assert running.started_ms is not None
    assert running.finished_ms is None
    assert running.deleted_ms is None
    assert gone.started_ms == running.started_ms
    assert gone.finished_ms is not None
    assert gone.deleted_ms is not None
    assert gone.finished_ms < gone.deleted_ms  # it stopped before its grace period ran out
    assert gone.released_ms == gone.finished_ms
    assert [r.phase for r in (added, running, gone)] == ["Pending", "Running", "Failed"]
    assert int(added.resource_version or 0) < int(running.resource_version or 0)

    never = [r for r in records if r.name == "mixtral-infer-0"]
    assert [(r.node, r.bound_ms, r.deleted_ms) for r in never] == [(None, None, None)] * 2
    [prep] = [r for r in records if r.name == "bert-eval-prep-m2r7c"]
    assert prep.deleted_ms == prep.finished_ms is not None  # no event time in a file


def test_watch_stream_of_bare_pods() -> None:
    records = read(PODS / "watch-objects.json")
    assert [r.phase for r in records] == ["Pending", "Running", "Failed"]
    assert len({r.uid for r in records}) == 1


def test_crlf_line_ends_read_the_same(tmp_path: Path) -> None:
    for name in ("list.json", "watch-events.json"):
        text = (PODS / name).read_text()
        crlf = write(tmp_path, name, text.replace("\n", "\r\n"))
        assert read(crlf) == read(PODS / name)


def test_an_empty_file_is_refused_and_an_empty_list_has_no_pods(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="the file is empty"):
        read(write(tmp_path, "empty.json", ""))
    empty_list = '{\n    "apiVersion": "v1",\n    "items": [],\n    "kind": "List"\n}\n'
    assert read(write(tmp_path, "list.json", empty_list)) == []


@pytest.mark.parametrize("chunk_chars", [1, 7, 100, 4096])
def test_reads_cut_anywhere_give_the_same_records(chunk_chars: int) -> None:
    for name in ("list.json", "watch-events.json", "api-podlist.json"):
        assert read(PODS / name, chunk_chars=chunk_chars) == read(PODS / name)


def test_a_number_cut_by_a_read_is_read_whole(tmp_path: Path) -> None:
    pod = json.loads((PODS / "single-pod.json").read_text())
    text = json.dumps({"type": "ADDED", "object": pod, "extra": 123456789})
    path = write(tmp_path, "w.json", text + "\n" + text)
    for chunk in range(1, 40):
        assert len(read(path, chunk_chars=chunk)) == 2


def test_progress_reports_bytes_read_up_to_the_file_size() -> None:
    seen: list[int] = []
    read(PODS / "list.json", on_progress=seen.append, chunk_chars=4096)
    assert len(seen) > 2
    assert seen == sorted(seen)
    assert seen[-1] == (PODS / "list.json").stat().st_size


# ---------------------------------------------------------------------------------------------
# streaming


def big_list(tmp_path: Path, pods: int) -> Path:
    """A kubectl-style list of `pods` distinct GPU pods."""
    template = (PODS / "controllers" / "pytorchjob-worker.json").read_text()
    uid = json.loads(template)["metadata"]["uid"]
    body = "\n".join("        " + line for line in template.rstrip("\n").split("\n"))
    path = tmp_path / "big.json"
    with path.open("w") as f:
        f.write('{\n    "apiVersion": "v1",\n    "items": [\n')
        for i in range(pods):
            f.write(body.replace(uid, f"{i:08d}-0000-4000-8000-000000000000"))
            f.write(",\n" if i < pods - 1 else "\n")
        f.write('    ],\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n')
        f.write("    }\n}\n")
    return path


def test_a_large_list_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = big_list(tmp_path, 600)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_kubectl_pods(path, teams=TEAMS, chunk_chars=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 600
    assert size > 5_000_000
    assert peak < size / 4  # loading it whole takes more than twice its size


def test_records_come_before_the_rest_of_the_file_is_read(tmp_path: Path) -> None:
    pod = (PODS / "single-pod.json").read_text()
    path = write(tmp_path, "stream.json", pod + pod + "this is not JSON\n")
    records = read_kubectl_pods(path, teams=TEAMS, chunk_chars=4096)
    assert next(records).name == "triton-ensemble-1"
    assert next(records).name == "triton-ensemble-1"
    with pytest.raises(InputError):
        next(records)


# ---------------------------------------------------------------------------------------------
# bad input: every error names the file, the line and (where there is one) the field


def assert_names(error: InputError, *, path: Path, line: int, field: str | None) -> None:
    text = str(error)
    assert text.startswith(f"{path}:{line}: ")
    assert (error.file, error.line, error.field) == (str(path), line, field)
    if field:
        assert repr(field) in text


def test_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "pods.json"
    with pytest.raises(InputError) as e:
        read_kubectl_pods(missing, teams=TEAMS)
    assert str(e.value) == f"{missing}: file does not exist"


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a regular file"):
        read_kubectl_pods(tmp_path, teams=TEAMS)


def test_not_json_names_line_and_column(tmp_path: Path) -> None:
    text = (PODS / "single-pod.json").read_text()
    broken = text.replace('"phase": "Running",', '"phase": "Running"')
    path = write(tmp_path, "pod.json", broken)
    e = error_of(path)
    next_key_line = line_of(broken, '"phase": "Running"') + 1
    assert_names(e, path=path, line=next_key_line, field=None)
    assert "not valid JSON" in e.message
    assert "column 9" in e.message


def test_truncated_file_is_not_json(tmp_path: Path) -> None:
    text = (PODS / "list.json").read_text()
    cut = text[: len(text) * 2 // 3]
    path = write(tmp_path, "cut.json", cut)
    with pytest.raises(InputError) as e:
        read(path, chunk_chars=4096)
    assert e.value.line == cut.count("\n") + 1  # the last line, where the text stops
    assert "not valid JSON" in str(e.value)


def test_text_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes((PODS / "single-pod.json").read_bytes().replace(b"triton", b"tr\xefton"))
    with pytest.raises(InputError, match="not UTF-8"):
        read(path)


def test_a_node_list_gives_node_rows_and_no_pods() -> None:
    path = PODS / "nodes.json"
    assert read(path) == []
    (row,) = list(read_kubectl_json(path, teams=TEAMS, node_ms=7))
    assert isinstance(row, dict)
    assert (row["name"], row["gpu_model"], row["gpu_capacity"]) == (
        "gpu-h100-pool-2e91d-03",
        "NVIDIA-H100-80GB-HBM3",
        8,
    )
    assert row["updated_ms"] == 7


@pytest.mark.parametrize(
    ("text", "line", "field", "got"),
    [
        ('{"kind": "ServiceList", "apiVersion": "v1", "items": []}', 1, "kind", "kind=ServiceList"),
        (
            '\n{\n    "apiVersion": "v1",\n    "kind": "Service",\n    "spec": {}\n}\n',
            2,
            "kind",
            "kind=Service",
        ),
        ('{"metadata": {"name": "x"}}', 1, "kind", "an object without a kind"),
        ("\n\n[1, 2]\n", 3, None, "an array"),
        ('{"type": "ADDED", "object": {"kind": "Secret"}}', 1, "object.kind", "kind=Secret"),
    ],
)
def test_json_that_is_not_pods(
    tmp_path: Path, text: str, line: int, field: str | None, got: str
) -> None:
    path = write(tmp_path, "x.json", text)
    e = error_of(path)
    assert_names(e, path=path, line=line, field=field)
    assert e.message.endswith(f"expected a Pod, a Node, a List of them or a watch event, got {got}")


@pytest.mark.parametrize("key", ["uid", "name", "namespace"])
def test_list_item_missing_an_identity_field(tmp_path: Path, key: str) -> None:
    text = (PODS / "list.json").read_text()
    meta = json.loads(text)["items"][3]["metadata"]
    start = sum(len(line) + 1 for line in text.split("\n")[: item_start_lines(text)[3] - 1])
    head, item = text[:start], text[start:]
    if key == "uid":  # the last key of metadata: the line before loses its comma
        item = item.replace(f',\n                "uid": {json.dumps(meta["uid"])}\n', "\n", 1)
    else:
        item = item.replace(f'                "{key}": {json.dumps(meta[key])},\n', "", 1)
    broken = head + item
    assert broken != text
    path = write(tmp_path, "pods.json", broken)
    e = error_of(path)
    assert_names(e, path=path, line=item_start_lines(broken)[3], field=f"items[3].metadata.{key}")
    assert e.message == "missing"


def test_bad_timestamp_names_its_own_line(tmp_path: Path) -> None:
    text = (PODS / "list.json").read_text()
    bad = '"finishedAt": "2025-11-03T08:18:04"'
    broken = text.replace('"finishedAt": "2025-11-03T08:18:04Z"', bad)
    path = write(tmp_path, "pods.json", broken)
    e = error_of(path)
    field = "items[7].status.containerStatuses[train].state.terminated.finishedAt"
    assert_names(e, path=path, line=line_of(broken, bad), field=field)
    assert "not an RFC 3339 time" in e.message


def test_a_container_finished_before_it_started_names_its_own_line(tmp_path: Path) -> None:
    text = (PODS / "list.json").read_text()
    bad = '"finishedAt": "2025-11-03T07:18:04Z"'  # 43 minutes before its startedAt
    broken = text.replace('"finishedAt": "2025-11-03T08:18:04Z"', bad)
    path = write(tmp_path, "pods.json", broken)
    e = error_of(path)
    field = "items[7].status.containerStatuses[train].state.terminated.finishedAt"
    assert_names(e, path=path, line=line_of(broken, bad), field=field)
    assert "before its startedAt 2025-11-03T08:01:30Z" in e.message
    assert len(str(e).splitlines()) == 1


def test_bad_scheduled_time_in_a_watch_event(tmp_path: Path) -> None:
    text = (PODS / "watch-events.json").read_text()
    # the first PodScheduled transition of the bert-eval pod, in its ADDED event
    old = '"lastTransitionTime": "2025-11-03T09:10:02Z",\n                    "status": "True",\n'
    old += '                    "type": "PodScheduled"'
    assert old in text
    broken = text.replace(old, old.replace("09:10:02Z", "03/11/2025 09:10"), 1)
    path = write(tmp_path, "watch.json", broken)
    e = error_of(path)
    field = "object.status.conditions[PodScheduled].lastTransitionTime"
    assert_names(e, path=path, line=line_of(broken, "03/11/2025 09:10"), field=field)


def test_gpu_quantity_that_is_not_a_whole_number(tmp_path: Path) -> None:
    text = (PODS / "single-pod.json").read_text()
    broken = text.replace('"nvidia.com/gpu": "2"', '"nvidia.com/gpu": "1.5"', 1)
    path = write(tmp_path, "pod.json", broken)
    e = error_of(path)
    field = "spec.containers[0].resources.limits.nvidia.com/gpu"
    assert_names(e, path=path, line=line_of(broken, '"1.5"'), field=field)
    assert "whole number" in e.message


def test_a_watch_that_ends_in_410_keeps_the_events_before_it() -> None:
    """`kubectl get -w` saved to a file ends when the server expires the watch (410)."""
    path = PODS / "watch-expired.json"
    names = [r.name for r in read_kubectl_pods(path, teams=TEAMS)]
    assert names[0] == "bert-eval-qz8tn"


def test_another_watch_error_stops_the_stream_at_its_line(tmp_path: Path) -> None:
    text = (PODS / "watch-expired.json").read_text().replace('"code": 410', '"code": 500')
    path = write(tmp_path, "w.json", text)
    records = read_kubectl_pods(path, teams=TEAMS)
    assert next(records).name == "bert-eval-qz8tn"
    with pytest.raises(InputError) as e:
        next(records)
    error_line = line_of(text, '"type": "ERROR"')
    start = error_line - text.split("\n")[:error_line][::-1].index("{")
    assert_names(e.value, path=path, line=start, field="object")
    assert "500 Expired: too old resource version" in e.value.message


def test_unknown_watch_event_types_are_skipped(tmp_path: Path) -> None:
    pod = json.loads((PODS / "single-pod.json").read_text())
    events = [{"type": "SYNC", "object": {}}, {"type": "ADDED", "object": pod}]
    path = write(tmp_path, "w.json", "\n".join(json.dumps(e) for e in events))
    assert [r.name for r in read(path)] == ["triton-ensemble-1"]


ERROR_CASES: list[tuple[str, Callable[[str], str]]] = [
    ("trailing garbage", lambda t: t + "}\n"),
    ("missing colon", lambda t: re.sub(r'"kind": "Pod"', '"kind" "Pod"', t, count=1)),
]


@pytest.mark.parametrize(("case", "edit"), ERROR_CASES, ids=[c for c, _ in ERROR_CASES])
def test_syntax_errors_name_the_line(tmp_path: Path, case: str, edit: Callable[[str], str]) -> None:
    text = (PODS / "single-pod.json").read_text()
    broken = edit(text)
    path = write(tmp_path, "pod.json", broken)
    e = error_of(path)
    assert e.file == str(path)
    assert e.line is not None
    assert "column" in e.message
    if case == "missing colon":
        assert e.line == line_of(broken, '"kind" "Pod"')
    else:
        assert e.line == broken.count("\n")
