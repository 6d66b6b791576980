"""What may be stored, and the small refusals a user meets at import: decision tables for the
row guard (`auditor.store.bounds`) and the text fitting (`auditor.limits`), then the CLI's
answers to an empty pods file, a clock reset to 1970, an hour skipped by daylight saving,
`nan` thresholds and a re-import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from auditor import limits
from auditor.cli import app
from auditor.store.bounds import RowError, check_row
from auditor.store.schema import nodes, pods

runner = CliRunner()

GOOD_POD: dict[str, Any] = {
    "uid": "u1",
    "namespace": "ml",
    "name": "p",
    "node": "n1",
    "team": "nlp",
    "job": "Pod/p",
    "job_kind": "Pod",
    "workload": "other",
    "gang": "ml/Pod/p",
    "rank": 3,
    "gpu_count": 1,
    "gpu_resource": "nvidia.com/gpu",
    "created_ms": 1_796_000_000_000,
    "labels": {"team": "nlp"},
    "annotations": {},
}


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("rank", 2**31, "integer out of range"),
        ("rank", -(2**31) - 1, "integer out of range"),
        ("rank", "3", "must be an integer"),
        ("rank", True, "must be an integer"),
        ("created_ms", 2**63, "integer out of range"),
        ("team", "t" * 254, "longer than 253"),
        ("team", "a\x00b", "NUL"),
        ("team", "a\ud800", "surrogate"),
        ("team", None, "missing"),
        ("team", 5, "must be text"),
        ("labels", {"k": "v\x00"}, "NUL"),
        ("labels", {"k": float("nan")}, "not finite"),
        ("labels", {"k": 10**30}, "too large"),
    ],
)
def test_the_row_guard_refuses_what_the_database_would(column: str, value: Any, says: str) -> None:
    with pytest.raises(RowError, match=says) as caught:
        check_row(pods, {**GOOD_POD, column: value}, what="pod ml/p")
    assert caught.value.field == f"pods.{column}"
    assert "pod ml/p" in str(caught.value)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("rank", None),
        ("rank", 2**31 - 1),
        ("team", "t" * 253),
        ("team", "équipe-日本"),
        ("created_ms", 2**63 - 1),
        ("labels", {"nested": {"deep": ["x", 1, 2.5, None, True]}}),
    ],
)
def test_the_row_guard_lets_storable_rows_through(column: str, value: Any) -> None:
    check_row(pods, {**GOOD_POD, column: value}, what="pod ml/p")


def test_the_guard_reads_the_column_types_of_every_table() -> None:
    row = {"name": "n" * 300, "gpu_capacity": 8, "gpu_allocatable": 8, "unschedulable": False}
    with pytest.raises(RowError, match="longer than 253"):
        check_row(nodes, {**row, "labels": {}, "updated_ms": 0}, what="node")
    with pytest.raises(RowError, match="true or false"):
        check_row(nodes, {**row, "name": "n", "unschedulable": "no"}, what="node")


@given(st.text(), st.integers(min_value=10, max_value=700))
def test_fitted_text_always_fits_and_stays_apart(text: str, limit: int) -> None:
    fitted = limits.fit_text(text, limit)
    assert len(fitted) <= limit
    assert limits.is_clean(fitted)
    if len(text) <= limit and limits.is_clean(text):
        assert fitted == text
    # two long texts with one prefix do not become one name
    other = limits.fit_text(text + "x" * (limit + 1), limit)
    assert other != limits.fit_text(text + "y" * (limit + 1), limit)


# ------------------------------------------------------------------ the CLI's small refusals

HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"


def invoke(db: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", db, *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'auditor.db'}"


def test_an_empty_pods_file_is_refused_and_an_empty_list_is_not(db: str, tmp_path: Path) -> None:
    empty = tmp_path / "pods.json"
    empty.write_text("")
    code, out = invoke(db, "import", "pods", str(empty))
    assert code == 2
    assert "pods.json:1: the file is empty" in out
    no_pods = tmp_path / "none.json"
    no_pods.write_text('{"apiVersion": "v1", "kind": "List", "items": []}')
    assert invoke(db, "import", "pods", str(no_pods))[0] == 0


@pytest.mark.parametrize(
    ("stamp", "tz", "says"),
    [
        ("1970/01/01 00:00:05.000", None, "is before 2000"),
        ("2100/01/01 00:00:00.000", None, "is in the future"),
        ("2026/03/29 02:30:00.000", "Europe/Berlin", "does not exist in Europe/Berlin"),
    ],
)
def test_a_time_no_clock_could_have_written_is_refused_with_its_line(
    db: str, tmp_path: Path, stamp: str, tz: str | None, says: str
) -> None:
    path = tmp_path / "node.csv"
    path.write_text(
        HEADER + "2026/03/29 01:59:55.000, 0, 5 %, 1 MiB\n" + f"{stamp}, 0, 5 %, 1 MiB\n"
    )
    code, out = invoke(
        db, "import", "nvidia-smi", str(path), "--node", "n1", *(["--tz", tz] if tz else [])
    )
    assert code == 2
    assert f"node.csv:3: field 'timestamp': {stamp}" in out
    assert says in out


def test_the_hour_that_happens_twice_in_autumn_is_still_read(db: str, tmp_path: Path) -> None:
    path = tmp_path / "node.csv"
    path.write_text(HEADER + "2026/10/25 02:30:00.000, 0, 5 %, 1 MiB\n")
    code, out = invoke(
        db, "import", "nvidia-smi", str(path), "--node", "n1", "--tz", "Europe/Berlin"
    )
    assert code == 0, out


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "101"])
def test_thresholds_must_be_finite_numbers(db: str, value: str) -> None:
    code, out = invoke(db, "audit", "--since", "1d", "--threshold", f"idle_threshold_pct={value}")
    assert code == 2
    assert "idle_threshold_pct" in out


def test_a_price_of_nan_in_the_config_is_refused(db: str, tmp_path: Path) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text("[prices]\ndefault = nan\n")
    result = runner.invoke(app, ["--db", db, "--config", str(config), "audit", "--since", "1d"])
    assert result.exit_code == 2
    assert "prices.default" in result.output


def test_a_reimport_says_how_much_was_stored_already(db: str, tmp_path: Path) -> None:
    path = tmp_path / "node.csv"
    path.write_text(
        HEADER + "2026/11/23 08:00:00.000, 0, 5 %, 1 MiB\n2026/11/23 08:00:05.000, 0, 9 %, 1 MiB\n"
    )
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--node", "n1")
    assert code == 0
    assert out.startswith("imported 2 samples of 1 GPUs")
    assert "already" not in out
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--node", "n1")
    assert code == 0
    assert out.startswith("imported 0 samples of 1 GPUs")
    assert "(2 already stored)" in out


def test_the_sampler_sink_leaves_out_a_card_the_store_cannot_hold(engine: Any) -> None:
    """An NVML UUID longer than the column would fail every flush: that card is left out
    and logged, the others are written."""
    from sqlalchemy import func, select

    from auditor.model import Batch, GpuRecord, GpuSample
    from auditor.store.sample_sink import StoreSink
    from auditor.store.schema import gpu_samples, gpus

    odd = "GPU-" + "f" * 300
    batch = Batch(
        gpus=(GpuRecord("GPU-good", "n1", 0), GpuRecord(odd, "n1", 1)),
        samples=(
            GpuSample("GPU-good", 1_796_000_000_000, 50.0),
            GpuSample(odd, 1_796_000_000_000, 5.0),
        ),
        holdings=(),
    )
    written = StoreSink(lambda: engine).write([batch], pending=[])
    assert written.skipped_samples == 1
    with engine.connect() as conn:
        assert [r.uuid for r in conn.execute(select(gpus.c.uuid))] == ["GPU-good"]
        assert conn.execute(select(func.count()).select_from(gpu_samples)).scalar() == 1
