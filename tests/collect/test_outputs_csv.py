"""`auditor import outputs FILE.csv` and the per-output columns of `report --by job|team`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from records import bare_pod
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.common import open_store
from auditor.model import GpuRecord, GpuSample
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.work_done import read_outputs
from auditor.store.writes import insert_samples, upsert_gpus

T0 = 1_795_000_000_000  # 2026-11-18T11:06:40Z
HOUR = 3_600_000
STEP = 10_000


@pytest.fixture
def store(db_url: str) -> str:
    """Two one-card pods of team ml held for an hour at 50 %, audited; `b` joins at half time."""
    migrate.upgrade(make_engine(db_url))
    samples = [
        GpuSample(uuid, T0 + k * STEP, 50.0)
        for k in range(HOUR // STEP)
        for uuid in ("GPU-0", "GPU-1")
    ]
    a = bare_pod("a", "uid-a", bound_ms=T0 - 60_000)
    b = bare_pod("b", "uid-b", bound_ms=T0 + HOUR // 2)
    with open_store(db_url).begin() as conn:
        ids = upsert_gpus(
            conn, [GpuRecord("GPU-0", "node-a", 0, "H100"), GpuRecord("GPU-1", "node-a", 1, "H100")]
        )
        insert_samples(conn, samples, ids)
        upsert_pods(conn, [a, b])
    with open_store(db_url).begin() as conn:  # both pods as one job: `Job/train`
        from sqlalchemy import update

        from auditor.store.schema import pods

        conn.execute(update(pods).values(job="Job/train", gang="train"))
    jobs.audit(db_url, window=(T0, T0 + HOUR), thresholds=Thresholds())
    return db_url


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def invoke(url: str, *args: str) -> object:
    return CliRunner().invoke(app, ["--db", url, *args])


def test_a_job_row_is_shared_among_its_pods_by_time_held(store: str, tmp_path: Path) -> None:
    f = write(
        tmp_path / "out.csv",
        "job,start,end,outputs,unit,quality,quality_better\n"
        "ml/Job/train,2026-11-18T11:06:40Z,2026-11-18T12:06:40Z,3000,samples,1.9,lower\n",
    )

    result = invoke(store, "import", "outputs", str(f))

    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    with open_store(store).connect() as conn:
        rows = read_outputs(conn, window=(T0, T0 + HOUR)).set_index("pod_uid")
    # a held the whole hour, b the second half: 2/3 and 1/3 of the samples
    assert rows.loc["uid-a", "outputs"] == pytest.approx(2000)
    assert rows.loc["uid-b", "outputs"] == pytest.approx(1000)
    assert set(rows["quality"]) == {1.9}


def test_report_by_job_and_team_has_per_output_columns(store: str, tmp_path: Path) -> None:
    f = write(
        tmp_path / "out.csv",
        "pod,start,end,outputs,unit\n"
        f"ml/a,{T0 // 1000},{(T0 + HOUR) // 1000},1000,samples\n"
        f"ml/b,{(T0 + HOUR // 2) // 1000},{(T0 + HOUR) // 1000},500,samples\n"
        f"ml/b,{(T0 + HOUR) // 1000},{(T0 + 2 * HOUR) // 1000},999,samples\n",
    )
    assert invoke(store, "import", "outputs", str(f)).exit_code == 0  # type: ignore[attr-defined]

    by_job = invoke(store, "report", "--by", "job", "--format", "json")
    by_team = invoke(store, "report", "--by", "team", "--format", "csv")

    row, platform = json.loads(by_job.output)  # type: ignore[attr-defined]
    assert platform["team"] == "(platform)"
    assert platform["outputs"] is None
    # 1.5 GPU-hours held (busy 0.75) for 1,500 samples; the row after the window is not counted
    assert row["outputs"] == pytest.approx(1500)
    assert row["output_unit"] == "samples"
    assert row["gpu_hours_per_1k_outputs"] == pytest.approx(1.0)
    assert row["busy_gpu_hours_per_1k_outputs"] == pytest.approx(0.5)
    team, _ = list(csv.DictReader(io.StringIO(by_team.output)))  # type: ignore[attr-defined]
    assert float(team["outputs"]) == pytest.approx(1500)
    assert float(team["gpu_hours_per_1k_outputs"]) == pytest.approx(1.0)


def test_the_table_and_html_report_show_outputs(store: str, tmp_path: Path) -> None:
    f = write(
        tmp_path / "o.csv",
        f"pod,start,end,outputs,unit\nml/a,{T0 // 1000},{(T0 + HOUR) // 1000},1000,samples\n",
    )
    assert invoke(store, "import", "outputs", str(f)).exit_code == 0  # type: ignore[attr-defined]

    table = invoke(store, "report", "--by", "job")
    page = invoke(store, "report", "--by", "team", "--format", "html")

    # 1.5 GPU-hours (90 GPU-minutes) held for 1,000 samples: 90 GPU-minutes per 1,000
    row = next(line for line in table.output.splitlines() if "Job/train" in line)  # type: ignore[attr-defined]
    assert row.rstrip("│ ").endswith("│ 1,000 samples │         90.000")
    assert "GPU-h per 1k outputs" in page.output  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("pod,start,end,outputs\nml/a,0,1,5\n", ":1: field 'header'"),
        (
            "pod,start,end,outputs,unit\nml/a,2026-11-18T10:00,yesterday,5,samples\n",
            ":2: field 'end'",
        ),
        ("pod,start,end,outputs,unit\nml/a,100,50,5,samples\n", ":2: field 'end'"),
        ("pod,start,end,outputs,unit\nml/a,1,2,-5,samples\n", ":2: field 'outputs'"),
        ("pod,start,end,outputs,unit\nml/a,1,2,five,samples\n", ":2: field 'outputs'"),
        ("job,start,end,outputs,unit\nml/train,1,2,5,samples\n", ":2: field 'job'"),
        (
            f"pod,start,end,outputs,unit\nml/a,{T0 // 1000},{T0 // 1000 + 60},5,samples\n"
            f"ml/nobody,{T0 // 1000},{T0 // 1000 + 60},5,samples\n",
            ":3: field 'pod'",
        ),
        (
            "pod,start,end,outputs,unit,quality,quality_better\nml/a,1,2,5,samples,0.5,sideways\n",
            ":2: field 'quality_better'",
        ),
    ],
)
def test_bad_rows_name_the_file_line_and_field_and_store_nothing(
    store: str, tmp_path: Path, text: str, where: str
) -> None:
    f = write(tmp_path / "bad.csv", text)

    result = invoke(store, "import", "outputs", str(f))

    assert result.exit_code == 2  # type: ignore[attr-defined]
    out = result.output  # type: ignore[attr-defined]
    assert f"bad.csv{where}" in out, out
    assert len(out.strip().splitlines()) == 1
    with open_store(store).connect() as conn:
        assert read_outputs(conn, window=(0, 2 * T0)).empty


def test_a_csv_or_url_is_required(store: str) -> None:
    result = invoke(store, "import", "outputs")

    assert result.exit_code == 2  # type: ignore[attr-defined]
    assert "give an outputs CSV or --url" in result.output  # type: ignore[attr-defined]
