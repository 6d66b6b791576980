"""The nvidia-smi CSV reader: real captures, hand-written variants, bad input, round trips."""

from __future__ import annotations

import csv
import os
import re
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.collect.nvidia_smi import known_fields, read_nvidia_smi
from auditor.collect.nvidia_smi import reader as nvidia_smi
from auditor.errors import InputError
from auditor.model import GpuRecord, GpuSample

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvidia_smi"


def _realdata() -> Path:
    env = os.environ.get("AUDITOR_REALDATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "realdata"


CAPTURES = _realdata() / "nvidia-smi-captures"


def _ms(*args: int) -> int:
    """Epoch ms of a UTC wall-clock time, computed by the standard library."""
    year, month, day, hour, minute, second, *rest = args
    micro = rest[0] * 1000 if rest else 0
    moment = datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def _read(
    path: Path, *, tz: tzinfo = UTC, ignore_unknown_columns: bool = False
) -> list[tuple[GpuRecord, GpuSample]]:
    return list(
        read_nvidia_smi(path, node="node-a", tz=tz, ignore_unknown_columns=ignore_unknown_columns)
    )


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode())
    return path


# --- real captures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One `query-gpu` CSV block cut out of a capture, written to its own file."""

    name: str
    path: Path
    lines: list[str]


def _query_gpu_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(state, lines) for each `# <state> :: query-gpu (csv...)` section of a capture."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        match = re.match(r"# (idle|load) :: query-gpu \(csv", line)
        if not match:
            continue
        start = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("####")) + 1
        end = next(j for j in range(start, len(lines)) if lines[j].startswith("####"))
        yield match.group(1), [row for row in lines[start:end] if row.strip()]


@pytest.fixture(scope="module")
def capture_blocks(tmp_path_factory: pytest.TempPathFactory) -> list[Block]:
    """Every query-gpu block of every capture as a CSV file; Windows ones also with CRLF."""
    if not CAPTURES.is_dir():
        pytest.skip(f"real nvidia-smi captures not found at {CAPTURES} (set AUDITOR_REALDATA)")
    out = tmp_path_factory.mktemp("captures")
    blocks = []
    for capture in sorted((CAPTURES / "nvidia_gpu_exporter").glob("*__*.txt")):
        for state, lines in _query_gpu_blocks(capture.read_text()):
            name = f"{capture.stem}.{state}"
            path = out / f"{name}.csv"
            path.write_bytes(("\n".join(lines) + "\n").encode())
            blocks.append(Block(name, path, lines))
            if capture.name.startswith("windows"):
                crlf = out / f"{name}.crlf.csv"
                crlf.write_bytes(("\r\n".join(lines) + "\r\n").encode())
                blocks.append(Block(f"{name}.crlf", crlf, lines))
    return blocks


def _number(cell: str) -> float | None:
    return None if cell.startswith("[") else float(cell.split(" ", maxsplit=1)[0])


def _expected(block: Block) -> list[dict[str, object]]:
    """The values the reader must find, read from the block with the csv module."""
    reader = csv.reader(block.lines, skipinitialspace=True)
    header = [re.sub(r" \[.*\]$", "", h) for h in next(reader)]
    expected = []
    for row in reader:
        cells = dict(zip(header, (c.strip() for c in row), strict=True))
        moment = datetime.strptime(cells["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
        expected.append(
            {
                "uuid": cells["uuid"],
                "index": int(cells["index"]),
                "model": cells["name"],
                "util": _number(cells["utilization.gpu"]),
                "memory_used_mib": _number(cells["memory.used"]),
                "memory_total_mib": _number(cells["memory.total"]),
                "power_w": _number(cells["power.draw"]),
                "sm_clock_mhz": _number(cells["clocks.current.sm"]),
                "temperature_c": _number(cells["temperature.gpu"]),
                "throttle_reasons": cells["clocks_event_reasons.active"],
                "ts_ms": round(moment.replace(tzinfo=UTC).timestamp() * 1000),
            }
        )
    return expected


def _found(record: GpuRecord, sample: GpuSample) -> dict[str, object]:
    assert record.uuid == sample.gpu_uuid
    assert record.node == "node-a"
    assert record.memory_total_mib == sample.memory_total_mib
    return {
        "uuid": record.uuid,
        "index": record.index,
        "model": record.model,
        "util": sample.util,
        "memory_used_mib": sample.memory_used_mib,
        "memory_total_mib": sample.memory_total_mib,
        "power_w": sample.power_w,
        "sm_clock_mhz": sample.sm_clock_mhz,
        "temperature_c": sample.temperature_c,
        "throttle_reasons": sample.throttle_reasons,
        "ts_ms": sample.ts_ms,
    }


def test_every_capture_block_imports_with_the_values_it_shows(capture_blocks: list[Block]) -> None:
    assert len(capture_blocks) == 10 * 2 + 2 * 2  # 10 captures x idle/load, + CRLF copies
    for block in capture_blocks:
        found = [_found(r, s) for r, s in _read(block.path)]
        assert found == _expected(block), block.name


def _block(blocks: list[Block], name: str) -> tuple[GpuRecord, GpuSample]:
    (only,) = _read(next(b for b in blocks if b.name == name).path)
    return only


def test_h200_under_load(capture_blocks: list[Block]) -> None:
    record, sample = _block(capture_blocks, "linux-x86_64__nvidia-h200__590.48.01.load")
    assert record == GpuRecord(
        uuid="GPU-00000000-0000-0000-0000-000000000000",
        node="node-a",
        index=0,
        model="NVIDIA H200",
        memory_total_mib=143771.0,
    )
    assert sample == GpuSample(
        gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
        ts_ms=_ms(2026, 7, 3, 22, 11, 9, 763),
        util=100.0,
        memory_used_mib=32362.0,
        memory_total_mib=143771.0,
        power_w=627.40,
        sm_clock_mhz=1980.0,
        throttle_reasons="0x0000000000000000",
        temperature_c=52.0,
    )


def test_mig_gpu_utilisation_is_unreadable_not_zero(capture_blocks: list[Block]) -> None:
    for name in (
        "linux-x86_64__nvidia-h100-mig__590.48.01.load",
        "linux-x86_64__nvidia-h200-mig__590.48.01.idle",
    ):
        _, sample = _block(capture_blocks, name)
        assert sample.util is None, name
    _, h100_mig_load = _block(capture_blocks, "linux-x86_64__nvidia-h100-mig__590.48.01.load")
    assert h100_mig_load.memory_used_mib == 11125.0
    assert h100_mig_load.power_w == 433.78


def test_windows_capture_with_crlf_reads_like_lf(capture_blocks: list[Block]) -> None:
    name = "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.idle"
    lf = _block(capture_blocks, name)
    assert _block(capture_blocks, f"{name}.crlf") == lf
    _, sample = lf
    assert (sample.util, sample.memory_used_mib, sample.power_w) == (0.0, 702.0, 38.92)
    assert (sample.sm_clock_mhz, sample.throttle_reasons) == (300.0, "0x0000000000000001")
    assert sample.ts_ms == _ms(2026, 6, 22, 23, 4, 18, 311)


def _help_query_gpu_properties(text: str) -> set[str]:
    after = text.split("# capabilities :: help-query-gpu", maxsplit=1)[1]
    section = after.split("# capabilities ::", maxsplit=1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if re.fullmatch(r'"[\w.]+"( or "[\w.]+")*', line):
            names.update(re.findall(r'"([\w.]+)"', line))
    return names


def test_known_field_list_covers_every_driver_captured() -> None:
    if not CAPTURES.is_dir():
        pytest.skip(f"real nvidia-smi captures not found at {CAPTURES} (set AUDITOR_REALDATA)")
    for capture in sorted((CAPTURES / "nvidia_gpu_exporter").glob("*__*.txt")):
        properties = _help_query_gpu_properties(capture.read_text())
        assert len(properties) > 200, capture.name
        assert properties <= known_fields(), (capture.name, properties - known_fields())


def test_known_field_list_is_sorted_and_has_older_aliases() -> None:
    data = Path(__file__).parents[2] / "auditor" / "data" / "nvidia_smi_fields.txt"
    names = [n for n in data.read_text().splitlines() if n and not n.startswith("#")]
    assert names == sorted(set(names))
    for old in ("clocks_throttle_reasons.active", "clocks.sm", "clocks.gr", "clocks.mem"):
        assert old in known_fields()


@pytest.mark.parametrize(
    "relative",
    ["netdata_xml/tesla-p100_query-gpu.csv", "nvidia_gpu_exporter/query.txt"],
)
def test_snapshot_without_timestamp_is_refused_naming_the_field(relative: str) -> None:
    path = CAPTURES / relative
    if not path.is_file():
        pytest.skip(f"real nvidia-smi capture not found at {path} (set AUDITOR_REALDATA)")
    with pytest.raises(InputError) as caught:
        _read(path)
    assert (caught.value.line, caught.value.field) == (1, "timestamp")
    assert f"{path}:1: field 'timestamp': missing required column" in str(caught.value)


# --- hand-written variants ----------------------------------------------------------------


def _default_rows() -> list[tuple[GpuRecord, GpuSample]]:
    rows = [
        (_ms(2026, 6, 24, 10, 26, 34, 977), 0, 38.0, 575.0),
        (_ms(2026, 6, 24, 10, 26, 34, 981), 1, 0.0, 3.0),
        (_ms(2026, 6, 24, 10, 26, 39, 977), 0, 41.0, 575.0),
        (_ms(2026, 6, 24, 10, 26, 39, 981), 1, 100.0, 80000.0),
    ]
    return [
        (
            GpuRecord(uuid=f"node-a/{i}", node="node-a", index=i),
            GpuSample(gpu_uuid=f"node-a/{i}", ts_ms=ts, util=util, memory_used_mib=used),
        )
        for ts, i, util, used in rows
    ]


@pytest.mark.parametrize(
    "fixture",
    [
        "default_header.csv",
        "noheader.csv",
        "nounits.csv",
        "noheader_nounits.csv",
        "repeated_header.csv",
        "truncated_last_line.csv",
    ],
)
def test_format_variants_read_the_same_samples(fixture: str) -> None:
    assert _read(FIXTURES / fixture) == _default_rows()


def test_crlf_line_endings(tmp_path: Path) -> None:
    text = (FIXTURES / "default_header.csv").read_text()
    path = _write(tmp_path / "windows.csv", text.replace("\n", "\r\n"))
    assert b"\r\n" in path.read_bytes()
    assert _read(path) == _default_rows()


@pytest.mark.parametrize(
    ("encoding", "prefix"),
    [("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe")],
    ids=["utf-8 with BOM", "utf-16 (PowerShell 5 redirect)"],
)
def test_byte_order_marked_files(tmp_path: Path, encoding: str, prefix: bytes) -> None:
    text = (FIXTURES / "default_header.csv").read_text().replace("\n", "\r\n")
    path = tmp_path / "bom.csv"
    path.write_bytes(prefix + text.encode(encoding))
    assert _read(path) == _default_rows()


def test_fields_in_any_order_with_older_aliases() -> None:
    uuid = "GPU-1b6e2c4d-8f0a-4b3c-9d2e-7a6f5e4d3c2b"
    assert _read(FIXTURES / "reordered.csv") == [
        (
            GpuRecord(
                uuid=uuid,
                node="node-a",
                index=3,
                model="NVIDIA A100-SXM4-40GB",
                memory_total_mib=40960.0,
            ),
            GpuSample(
                gpu_uuid=uuid,
                ts_ms=_ms(2026, 1, 15, 8, 0, 0),
                util=87.0,
                memory_used_mib=1024.0,
                memory_total_mib=40960.0,
                power_w=251.37,
                sm_clock_mhz=1410.0,
                throttle_reasons="0x0000000000000004",
                temperature_c=61.0,
            ),
        )
    ]


def test_bracketed_values_are_none_never_zero() -> None:
    uuid = "GPU-5f1d0c2a-3b4e-4f60-8a7b-9c0d1e2f3a4b"
    (first_record, first), (second_record, second) = _read(FIXTURES / "missing_values.csv")
    assert first_record.model == "NVIDIA H100 80GB HBM3"
    assert first == GpuSample(
        gpu_uuid=uuid,
        ts_ms=_ms(2026, 7, 14, 9, 0, 27, 792),
        util=None,
        memory_used_mib=59.0,
        memory_total_mib=81559.0,
        power_w=71.15,  # power.draw is [N/A]: power.draw.instant stands in
    )
    # No uuid: the GPU is NODE/index.
    assert second_record == GpuRecord(uuid="node-a/1", node="node-a", index=1)
    assert second == GpuSample(
        gpu_uuid="node-a/1",
        ts_ms=_ms(2026, 7, 14, 9, 0, 27, 801),
        util=None,
        sm_clock_mhz=345.0,
        temperature_c=42.0,
    )


def test_node_local_time_is_read_in_its_zone_across_dst() -> None:
    found = [s.ts_ms for _, s in _read(FIXTURES / "berlin.csv", tz=ZoneInfo("Europe/Berlin"))]
    assert found == [
        _ms(2026, 1, 15, 11, 0, 0),  # CET, UTC+1
        _ms(2026, 7, 15, 10, 0, 0),  # CEST, UTC+2
        _ms(2026, 3, 29, 0, 59, 59),  # last second of CET
        _ms(2026, 3, 29, 1, 0, 0),  # 03:00 CEST, the clocks went forward an hour
        _ms(2026, 10, 25, 0, 30, 0),  # 02:30 CEST, first time round
        _ms(2026, 10, 25, 0, 59, 55),
        _ms(2026, 10, 25, 1, 0, 0),  # 02:00 again, now CET: the repeated hour
        _ms(2026, 10, 25, 1, 30, 0),
        _ms(2026, 10, 25, 2, 0, 0),
    ]


def test_default_zone_is_utc_and_fixed_offsets_work() -> None:
    (_, utc), *_ = _read(FIXTURES / "noheader.csv")
    (_, new_york), *_ = _read(FIXTURES / "noheader.csv", tz=timezone(timedelta(hours=-4)))
    assert utc.ts_ms == _ms(2026, 6, 24, 10, 26, 34, 977)
    assert new_york.ts_ms == _ms(2026, 6, 24, 14, 26, 34, 977)


def test_unterminated_last_line_cut_in_its_last_cell_is_dropped(tmp_path: Path) -> None:
    text = (FIXTURES / "default_header.csv").read_text()
    cut = _write(tmp_path / "cut.csv", text + "2026/06/24 10:26:44.977, 0, 38 %, 575 Mi")
    assert _read(cut) == _default_rows()


def test_unterminated_but_complete_last_line_is_kept(tmp_path: Path) -> None:
    text = (FIXTURES / "default_header.csv").read_text().rstrip("\n")
    assert _read(_write(tmp_path / "no-eol.csv", text)) == _default_rows()


def test_unknown_columns_can_be_ignored(tmp_path: Path) -> None:
    text = (FIXTURES / "default_header.csv").read_text().splitlines()
    rows = [text[0] + ", vendor.new_counter [W]"] + [line + ", 12.5 W" for line in text[1:]]
    path = _write(tmp_path / "newer-driver.csv", "\n".join(rows) + "\n")
    assert _read(path, ignore_unknown_columns=True) == _default_rows()
    with pytest.raises(InputError, match="--ignore-unknown-columns"):
        _read(path)


def test_duplicate_rows_are_all_yielded(tmp_path: Path) -> None:
    text = (FIXTURES / "noheader.csv").read_text()
    assert _read(_write(tmp_path / "twice.csv", text + text)) == _default_rows() * 2


def test_concatenated_logs_with_different_headers(tmp_path: Path) -> None:
    second = "timestamp, uuid, index, utilization.gpu [%], memory.used [MiB]\n"
    second += "2026/06/24 11:00:00.000, GPU-0a, 0, 5 %, 10 MiB\n"
    text = (FIXTURES / "default_header.csv").read_text() + second
    *_, (record, sample) = _read(_write(tmp_path / "cat.csv", text))
    assert (record.uuid, record.index, sample.util, sample.memory_used_mib) == (
        "GPU-0a",
        0,
        5.0,
        10.0,
    )


# --- bad input ----------------------------------------------------------------------------

HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
ROW = "2026/06/24 10:26:34.977, 0, 38 %, 575 MiB\n"
TOTAL_HEADER = HEADER.replace("\n", ", memory.total [MiB]\n")
TOTAL_ROW = ROW.replace("\n", ", 81559 MiB\n")


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (HEADER + ROW + "2026/06/24 10:26:35.977, 0, 38 %\n" + ROW, 3, "memory.used", "cells"),
        (HEADER + ROW + ROW.rstrip("\n") + ", 1 W\n" + ROW, 3, None, "expected 4 cells"),
        (HEADER.rstrip("\n") + ", gpu.magic\n" + ROW, 1, "gpu.magic", "unknown column"),
        (HEADER + ROW.replace("2026/06/24", "2026-06-24"), 2, "timestamp", "YYYY/MM/DD"),
        (HEADER + ROW.replace("2026/06/24", "2026/02/30"), 2, "timestamp", "no such date"),
        (HEADER + ROW.replace("10:26", "25:26"), 2, "timestamp", "no such time"),
        (HEADER + ROW.replace("38 %", "abc"), 2, "utilization.gpu", "expected a number"),
        (HEADER + ROW.replace("38 %", "150 %"), 2, "utilization.gpu", "0-100"),
        (HEADER + ROW.replace("38 %", "38 MiB"), 2, "utilization.gpu", "number in %"),
        (HEADER + ROW.replace("38 %", "nan"), 2, "utilization.gpu", "expected a number"),
        (HEADER + ROW.replace("38 %", ""), 2, "utilization.gpu", "empty value"),
        (HEADER + ROW.replace("575 MiB", "-5 MiB"), 2, "memory.used", "negative"),
        (TOTAL_HEADER + TOTAL_ROW + TOTAL_ROW.replace("575 MiB", "81560 MiB"), 3,
         "memory.used", "memory.used 81560 MiB is above memory.total 81559 MiB"),
        (HEADER + ROW.replace(", 0,", ", gpu0,"), 2, "index", "GPU index"),
        (HEADER.replace(", memory.used [MiB]", "") + "2026/06/24 10:26:34.977, 0, 38 %\n", 1,
         "memory.used", "missing required column"),
        ("2026/06/24 10:26:34.977, 0, 38 %, 575 MiB, 81559 MiB\n", 1, None,
         "without a header line the columns must be"),
        (HEADER + ROW + ROW.replace("38 %", "abc").rstrip("\n"), 3, "utilization.gpu",
         "expected a number"),
    ],
    ids=[
        "short line in the middle",
        "long line in the middle",
        "unknown column",
        "timestamp format",
        "no such date",
        "no such hour",
        "non-numeric utilization",
        "utilization 150",
        "utilization in the wrong unit",
        "utilization nan",
        "empty utilization",
        "negative memory",
        "memory used above the total",
        "index not a number",
        "missing required column",
        "noheader with extra columns",
        "unterminated last line bad before its last cell",
    ],
)  # fmt: skip
def test_bad_input_names_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, message: str
) -> None:
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(InputError) as caught:
        _read(path)
    error = caught.value
    assert (error.file, error.line, error.field) == (str(path), line, field)
    where = f"{path}:{line}: " + (f"field {field!r}: " if field else "")
    assert str(error).startswith(where)
    assert message in str(error)


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", HEADER, HEADER + "2026/06/24 10:26:34.977, 0, 3"],
    ids=["empty", "blank lines", "header only", "header and a cut line"],
)
def test_file_without_samples_is_an_error(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "empty.csv", text)
    with pytest.raises(InputError, match="no samples") as caught:
        _read(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(InputError) as caught:
        _read(path)
    assert str(caught.value).startswith(f"{path}: cannot read the file")


def test_binary_garbage_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.csv"
    path.write_bytes(HEADER.encode() + b"\x93\xff\xfe garbage\n")
    with pytest.raises(InputError) as caught:
        _read(path)
    assert str(caught.value) == f"{path}:2: not text: bytes that are not UTF-8"


# --- streaming ----------------------------------------------------------------------------


def _big_log(path: Path, rows: int) -> Path:
    with path.open("w") as out:
        out.write(HEADER)
        for i in range(rows):
            second = i // 8
            out.write(
                f"2026/06/24 {second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
                f".{i % 1000:03d}, {i % 8}, {i % 101} %, {i % 80000} MiB\n"
            )
    return path


def test_progress_reports_bytes_read(tmp_path: Path) -> None:
    path = _big_log(tmp_path / "big.csv", 25_000)
    seen: list[int] = []
    count = sum(1 for _ in read_nvidia_smi(path, node="n", on_progress=seen.append))
    assert count == 25_000
    assert len(seen) == 3  # at lines 10,000 and 20,000, and at the end
    assert seen == sorted(seen)
    assert seen[-1] == path.stat().st_size


def _peak_reading(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        count = 0
        for _ in read_nvidia_smi(path, node="n"):
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return count, peak


def test_reads_lazily_in_constant_memory(tmp_path: Path) -> None:
    small = _peak_reading(_big_log(tmp_path / "small.csv", 30_000))
    big_path = _big_log(tmp_path / "big.csv", 150_000)
    big = _peak_reading(big_path)
    assert (small[0], big[0]) == (30_000, 150_000)
    assert big[1] < small[1] * 1.5, (small, big)  # five times the file, not more memory
    assert big[1] < 32 * 2**20  # a chunk of lines at a time


def test_an_error_far_down_surfaces_only_when_reached(tmp_path: Path) -> None:
    path = _big_log(tmp_path / "late.csv", 30_000)
    with path.open("a") as out:
        out.write("garbage\n" + ROW)
    rows = read_nvidia_smi(path, node="n")
    assert next(rows)[1].util == 0.0
    with pytest.raises(InputError, match=":30002: "):
        list(rows)


# --- round trip ---------------------------------------------------------------------------

DEFAULT_FIELDS = ["timestamp", "index", "utilization.gpu", "memory.used"]
OPTIONAL = ("uuid", "name", "memory.total", "power.draw", "clocks.sm", "temperature.gpu",
            "clocks_event_reasons.active", "pci.bus_id")  # fmt: skip
UNITS = {"utilization.gpu": "%", "memory.used": "MiB", "memory.total": "MiB",
         "power.draw": "W", "clocks.sm": "MHz"}  # fmt: skip
MISSING = st.sampled_from(["[N/A]", "[Not Supported]", "[Unknown Error]"])


Log = tuple[str, list[tuple[GpuRecord, GpuSample]], timezone]


def _maybe(draw: st.DrawFn, values: st.SearchStrategy[float]) -> float | None:
    return draw(st.none() | values)


@st.composite
def logs(draw: st.DrawFn) -> Log:
    """A log nvidia-smi could write, and the records a reader must find in it."""
    optional = draw(st.lists(st.sampled_from(OPTIONAL), unique=True))
    fields = draw(st.permutations(DEFAULT_FIELDS))
    for name in optional:
        fields.insert(draw(st.integers(0, len(fields))), name)
    header = draw(st.booleans()) or fields != DEFAULT_FIELDS
    units = draw(st.booleans())
    tz = timezone(timedelta(minutes=draw(st.integers(-12 * 60, 14 * 60))))
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in fields))
    expected = []
    models: dict[int, str | None] = {}
    """One card, one model: a log naming card 0 a T4 and then an H200 is refused."""
    for _ in range(draw(st.integers(1, 6))):
        ts_ms = draw(st.integers(_ms(2000, 1, 1, 0, 0, 0), _ms(2099, 12, 31, 0, 0, 0)))
        local = (
            datetime(1970, 1, 1)
            + timedelta(milliseconds=ts_ms)
            + timedelta(minutes=tz.utcoffset(None) // timedelta(minutes=1))
        )
        index = draw(st.integers(0, 15))
        uuid = f"GPU-{draw(st.uuids())}"
        util = _maybe(draw, st.integers(0, 100).map(float))
        total = _maybe(draw, st.integers(0, 200_000).map(float))
        top = 200_000 if total is None else int(total)  # a card never uses more than it has
        used = _maybe(draw, st.integers(0, top).map(float))
        power = _maybe(draw, st.integers(0, 100_000).map(lambda centiwatts: centiwatts / 100))
        clock = _maybe(draw, st.integers(0, 3000).map(float))
        temperature = _maybe(draw, st.integers(0, 110).map(float))
        throttle = draw(st.none() | st.integers(0, 2**16).map("0x{:016X}".format))
        model = models.get(index) or draw(
            st.none() | st.sampled_from(["NVIDIA H200", "Tesla T4", "NVIDIA L40S"])
        )
        models[index] = model
        rendered: dict[str, str | float | None] = {
            "timestamp": local.strftime("%Y/%m/%d %H:%M:%S.") + f"{ts_ms % 1000:03d}",
            "index": str(index),
            "uuid": uuid,
            "pci.bus_id": f"00000000:{index + 0x10:02X}:00.0",
            "name": model,
            "utilization.gpu": util,
            "memory.used": used,
            "memory.total": total,
            "power.draw": power,
            "clocks.sm": clock,
            "temperature.gpu": temperature,
            "clocks_event_reasons.active": throttle,
        }
        cells = []
        for f in fields:
            value = rendered[f]
            if value is None:
                cells.append(draw(MISSING))
            elif isinstance(value, float):
                number = f"{value:.2f}" if f == "power.draw" else f"{value:.0f}"
                cells.append(f"{number} {UNITS[f]}" if units and f in UNITS else number)
            else:
                cells.append(value)
        lines.append(", ".join(cells))
        gpu = uuid if "uuid" in fields else f"node-a/{index}"
        if "uuid" not in fields and "pci.bus_id" in fields:
            gpu = f"node-a/00000000:{index + 0x10:02X}:00.0"
        total = total if "memory.total" in fields else None
        expected.append(
            (
                GpuRecord(
                    uuid=gpu,
                    node="node-a",
                    index=index,
                    model=model if "name" in fields else None,
                    memory_total_mib=total,
                ),
                GpuSample(
                    gpu_uuid=gpu,
                    ts_ms=ts_ms,
                    util=util,
                    memory_used_mib=used,
                    memory_total_mib=total,
                    power_w=power if "power.draw" in fields else None,
                    sm_clock_mhz=clock if "clocks.sm" in fields else None,
                    throttle_reasons=throttle if "clocks_event_reasons.active" in fields else None,
                    temperature_c=temperature if "temperature.gpu" in fields else None,
                ),
            )
        )
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + newline, expected, tz


@settings(max_examples=200, deadline=None)
@given(log=logs())
def test_written_logs_read_back_equal(tmp_path_factory: pytest.TempPathFactory, log: Log) -> None:
    text, expected, tz = log
    path = tmp_path_factory.mktemp("roundtrip") / "log.csv"
    path.write_bytes(text.encode())
    assert _read(path, tz=tz) == expected


# --- GPU identity, --columns, what is not a CSV -------------------------------------------


def test_gpus_named_by_uuid_without_index() -> None:
    found = [(r.uuid, r.index, s.util) for r, s in _read(FIXTURES / "uuid_only.csv")]
    assert found == [("GPU-aaaa", None, 38.0), ("GPU-bbbb", None, 0.0)]


def test_gpus_named_by_pci_bus_id_on_their_node() -> None:
    found = [(r.uuid, r.index) for r, _ in _read(FIXTURES / "pci_only.csv")]
    assert found == [("node-a/00000000:83:00.0", None), ("node-a/00000000:84:00.0", None)]


def test_log_without_gpu_columns_is_one_gpu_index_0() -> None:
    rows = _read(FIXTURES / "one_gpu.csv")
    assert [(r.uuid, r.index, s.util, s.memory_used_mib) for r, s in rows] == [
        ("node-a/0", 0, 38.0, 575.0),
        ("node-a/0", 0, 41.0, 575.0),
    ]


def test_headerless_log_with_its_columns_named() -> None:
    path = FIXTURES / "headerless_columns.csv"
    fields = ["timestamp", "uuid", "utilization.gpu", "memory.used", "memory.total"]
    rows = list(read_nvidia_smi(path, node="node-a", columns=fields))
    assert [(r.uuid, s.util, s.memory_used_mib, s.memory_total_mib) for r, s in rows] == [
        ("GPU-aaaa", 38.0, 575.0, 81559.0),
        ("GPU-bbbb", 0.0, 3.0, 81559.0),
    ]
    with pytest.raises(InputError, match="--columns"):
        _read(path)  # five cells, not the default four
    with pytest.raises(InputError) as caught:
        list(read_nvidia_smi(path, node="n", columns=["timestamp", "gpu.magic"]))
    assert caught.value.field == "gpu.magic"


@pytest.mark.parametrize("fixture", ["table_output.txt", "query_q_output.txt"])
def test_table_and_q_output_are_refused_as_not_csv(fixture: str) -> None:
    """Cut from a real H200 capture (nvidia_gpu_exporter, MIT): `nvidia-smi` and `-q`."""
    with pytest.raises(InputError) as caught:
        _read(FIXTURES / fixture)
    message = str(caught.value)
    assert "not a CSV" in message
    assert "nvidia-smi --query-gpu=timestamp,uuid,index,utilization.gpu" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize(
    ("fixture", "field"),
    [("power_only.csv", "utilization.gpu"), ("util_missing.csv", "utilization.gpu")],
)
def test_file_without_utilisation_names_it(fixture: str, field: str) -> None:
    with pytest.raises(InputError) as caught:
        _read(FIXTURES / fixture)
    assert (caught.value.line, caught.value.field) == (1, field)
    assert "missing required column 'utilization.gpu'" in str(caught.value)


# --- the vectorised reader equals the row parser ------------------------------------------


def _row_parser_only(
    monkeypatch: pytest.MonkeyPatch, path: Path, **kwargs: object
) -> list[tuple[GpuRecord, GpuSample]]:
    with monkeypatch.context() as patch:
        patch.setattr(nvidia_smi, "_fast_block", lambda *_: None)
        return list(read_nvidia_smi(path, node="node-a", **kwargs))  # type: ignore[arg-type]


def _fast_chunks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, per chunk the fast path tried, whether it took it."""
    taken: list[bool] = []
    real = nvidia_smi._fast_block

    def spy(*args: object) -> object:
        block = real(*args)  # type: ignore[arg-type]
        taken.append(block is not None)
        return block

    monkeypatch.setattr(nvidia_smi, "_fast_block", spy)
    return taken


def _variants(tmp_path: Path) -> list[Path]:
    """Every fixture, each long enough for the fast path (past the first chunk)."""
    out = []
    for fixture in sorted(FIXTURES.glob("*.csv")):
        text = fixture.read_bytes()
        header, _, rest = text.partition(b"\n")
        if not rest.strip() or fixture.name in ("power_only.csv", "util_missing.csv"):
            continue
        body = rest if header[:1].isalpha() else text
        lines = body.rstrip(b"\n").split(b"\n") if not fixture.name.startswith("trunc") else []
        if not lines or fixture.name == "berlin.csv":
            continue
        path = tmp_path / fixture.name
        path.write_bytes(text.rstrip(b"\n") + b"\n" + b"\n".join(lines * 40) + b"\n")
        out.append(path)
    return out


def test_fast_path_reads_what_the_row_parser_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _variants(tmp_path)
    assert len(paths) >= 8
    taken = _fast_chunks(monkeypatch)
    for path in paths:
        extra = {"columns": ["timestamp", "uuid", "utilization.gpu", "memory.used",
                             "memory.total"]} if "headerless" in path.name else {}  # fmt: skip
        fast = list(read_nvidia_smi(path, node="node-a", **extra))  # type: ignore[arg-type]
        assert fast == _row_parser_only(monkeypatch, path, **extra), path.name
    assert sum(taken) >= 8  # the fast path was taken, not only tried


def test_fast_path_gives_the_row_parsers_error_line(tmp_path: Path) -> None:
    path = _big_log(tmp_path / "bad.csv", 25_000)
    text = path.read_text().splitlines(keepends=True)
    text[15_000] = text[15_000].replace(" %", " MiB")
    text.insert(12_000, HEADER)
    text.insert(12_001, "\n")
    path.write_text("".join(text))
    with pytest.raises(InputError) as caught:
        list(read_nvidia_smi(path, node="n"))
    assert (caught.value.line, caught.value.field) == (15_003, "utilization.gpu")


def test_fast_path_reads_numbers_of_every_width_and_dot_place_as_the_row_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power readings of 1 to 16 characters, the dot at every place or none, with and
    without the unit, and missing ones: the same values (to the bit) on both paths."""
    digits = "9071358246" * 2
    cells = ["[N/A]", "N/A"]
    for width in range(1, 17):
        number = digits[:width]
        cells.append(number if width < 16 else number[:15])
        cells += [f"{number[:i]}.{number[i:]}"[:16] for i in range(width)]
    cells += [f"{c} W" for c in cells if c[0].isdigit() or c[0] == "."]
    short = [c for c in cells if len(c.removesuffix(" W")) <= 8]  # 8 bytes: one word
    path = tmp_path / "power.csv"
    with path.open("w") as out:
        out.write("timestamp, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W]\n")
        for i in range(30_000):  # chunks of short cells only, then chunks of all
            power = short[i % len(short)] if i < 20_000 else cells[i % len(cells)]
            out.write(f"2026/06/24 {i // 36_000:02d}:{i // 600 % 60:02d}:{i // 10 % 60:02d}."
                      f"{i % 10:03d}, GPU-{i % 4}, {i % 101} %, 575 MiB, {power}\n")  # fmt: skip
    taken = _fast_chunks(monkeypatch)
    fast = list(read_nvidia_smi(path, node="node-a"))
    assert fast == _row_parser_only(monkeypatch, path)
    assert sum(taken) >= 3
    powers = {s.power_w for _, s in fast}
    assert powers >= {None, 0.9071, 9071358.2, 907135824690713.0, 9.0, 0.9}


def test_fast_path_tells_cards_apart_by_every_identity_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cards told apart by the uuid's last character, a model's, or the total memory, the
    uuid last on its line (up to the chunk's last byte): the records the row parser makes."""
    path = tmp_path / "cards.csv"
    with path.open("w") as out:
        out.write(
            "timestamp, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], uuid\n"
        )
        for i in range(12_000):
            uuid = f"GPU-0123456789abcdef-0123456789-{i % 3}"
            out.write(f"2026/06/24 10:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10:03d}, "
                      f"NVIDIA A100-SXM4-40GB{'x' * (i % 3 // 2)}, {i % 101} %, 575 MiB, "
                      f"{40960 + i % 5 // 4} MiB, {uuid}\n")  # fmt: skip
    taken = _fast_chunks(monkeypatch)
    fast = list(read_nvidia_smi(path, node="node-a"))
    assert fast == _row_parser_only(monkeypatch, path)
    assert len({r for r, _ in fast}) == 6  # 3 cards, each seen with two totals
    assert sum(taken) >= 1


def test_memory_used_above_the_total_deep_in_a_long_log_names_its_line(tmp_path: Path) -> None:
    """The fast path gives such a chunk up; the row parser names the line (used equal to
    the total is a full card, and is read)."""
    path = tmp_path / "full.csv"
    lines = [TOTAL_HEADER] + [TOTAL_ROW.replace("575 MiB", "81559 MiB")] * 25_000
    lines[17_000] = TOTAL_ROW.replace("575 MiB", "81559.5 MiB")
    path.write_text("".join(lines))
    with pytest.raises(InputError) as caught:
        list(read_nvidia_smi(path, node="n"))
    assert (caught.value.line, caught.value.field) == (17_001, "memory.used")
    assert "above memory.total" in str(caught.value)
    lines[17_000] = lines[17_001]
    path.write_text("".join(lines))
    assert sum(1 for _ in read_nvidia_smi(path, node="n")) == 25_000


@settings(max_examples=60, deadline=None)
@given(log=logs(), copies=st.integers(70, 90))
def test_long_written_logs_read_the_same_on_both_paths(
    tmp_path_factory: pytest.TempPathFactory, log: Log, copies: int
) -> None:
    """A generated log repeated past the first chunk: the fast path reads it as the row
    parser does (same GPUs, values and None), repeats and all."""
    text, expected, tz = log
    lines = text.splitlines(keepends=True)
    head = lines[:1] if lines[0][:1].isalpha() else []
    body = lines[len(head) :]
    path = tmp_path_factory.mktemp("long") / "log.csv"
    path.write_bytes("".join(head + body * copies).encode())
    with pytest.MonkeyPatch.context() as patch:
        slow = _row_parser_only(patch, path, tz=tz)
    assert list(read_nvidia_smi(path, node="node-a", tz=tz)) == slow == expected * copies


# --- several files through the CLI --------------------------------------------------------


def test_several_files_each_its_node_and_a_bad_one_refused_alone(tmp_path: Path) -> None:
    from sqlalchemy import select
    from typer.testing import CliRunner

    from auditor.cli import app
    from auditor.store.connection import make_engine
    from auditor.store.schema import gpus

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node-a.csv").write_bytes((FIXTURES / "default_header.csv").read_bytes())
    (logs / "node-b.csv").write_bytes((FIXTURES / "uuid_only.csv").read_bytes())
    (logs / "node-c.csv").write_bytes((FIXTURES / "table_output.txt").read_bytes())
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    files = [str(p) for p in sorted(logs.iterdir())]
    result = CliRunner().invoke(app, ["--db", url, "import", "nvidia-smi", *files])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("imported 4 samples of 2 GPUs from ")
    assert lines[1].startswith("imported 2 samples of 2 GPUs from ")
    assert lines[2].startswith(f"auditor: error: {logs / 'node-c.csv'}:1: not a CSV")
    assert lines[3] == (
        f"auditor: error: 1 of 3 files refused (nothing of them written): {Path(files[2]).name}"
    )
    engine = make_engine(url)
    with engine.connect() as conn:
        stored = sorted(conn.execute(select(gpus.c.uuid, gpus.c.node)).all())
    engine.dispose()
    assert stored == [
        ("GPU-aaaa", "node-b"),
        ("GPU-bbbb", "node-b"),
        ("node-a/0", "node-a"),
        ("node-a/1", "node-a"),
    ]
    again = CliRunner().invoke(
        app, ["--db", url, "import", "nvidia-smi", files[1], "--node", "node-b"]
    )
    assert again.exit_code == 0
    assert "(2 already stored)" in again.output
