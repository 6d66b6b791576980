"""The sampler's on-disk buffer under pressure: a byte bound, a full disk, a broken file.

What users rely on: during a store outage the buffer holds at most `max_bytes` of passes;
a full disk (SQLite's own page limit, and a real 1 MiB tmpfs) drops the oldest passes,
counted, and never stops the sampling loop, nor a restart on that disk; when the store is
back the newest surviving passes reach it; every pass is either stored or counted dropped.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script
from prometheus_client import CollectorRegistry
from smalldisk import tmpfs
from test_sampler import GPU_A, stored

from auditor.agents.sample.buffer import DiskBuffer, encode_batch
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.nvml import NvmlReader
from auditor.agents.sample.sampler import NodeReading, Sampler, SamplerSettings
from auditor.jobs import open_store
from auditor.model import Batch, GpuRecord, GpuSample, Holding
from auditor.store.sample_sink import StoreSink

__all__ = ["fake_nvml_library"]

GPUS = 32  # about 7 KB a pass: a small disk fills within the test's passes


@pytest.fixture
def script(fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    devices = [{**GPU_A, "uuid": f"GPU-{i:04d}-{'e' * 28}"} for i in range(GPUS)]
    write_script(path, render_script(devices))
    return path


class Recording:
    """The real NVML reader, remembering the sample time of each pass."""

    def __init__(self, reader: NvmlReader) -> None:
        self.reader = reader
        self.times: list[int] = []

    def read(self) -> NodeReading:
        reading = self.reader.read()
        self.times.append(reading.samples[0].ts_ms)
        return reading


class Loop:
    """The real sampler loop at a 5 ms period over the fake library, on a real clock."""

    def __init__(self, url: str, buffer: DiskBuffer) -> None:
        self.url = url
        nvml = NvmlReader(node="node-a")
        nvml.open()
        self.reader = Recording(nvml)
        self.buffer = buffer
        self.metrics = SamplerMetrics(CollectorRegistry())
        self.sampler = Sampler(
            reader=self.reader,
            holders=None,
            sink=StoreSink(lambda: open_store(self.url)),
            buffer=buffer,
            metrics=self.metrics,
            settings=SamplerSettings(period_s=0.005, flush_every_s=0.2),
        )

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(f"auditor_sampler_{name}")
        assert value is not None, name
        return value

    def run(self, passes: int) -> None:
        self.sampler.stop.clear()
        self.sampler.run(max_passes=passes)


def batch(n: int, *, size: int = 1000) -> Batch:
    """A batch of about `size` bytes, told apart by `n`."""
    return Batch(
        (GpuRecord(f"GPU-{n}", "node-a", 0, "x" * size),),
        (GpuSample(f"GPU-{n}", n, 1.0),),
        (Holding("ml", "p", f"GPU-{n}", n, n),),
    )


def kept(buffer: DiskBuffer) -> list[int]:
    return [b.samples[0].ts_ms for _, b in buffer.oldest(10_000)]


def test_the_bound_counts_bytes_and_drops_the_oldest(tmp_path: Path) -> None:
    one = len(encode_batch(batch(0)))
    buffer = DiskBuffer(tmp_path / "b.db", max_bytes=10 * one + one // 2)
    dropped = sum(buffer.push(batch(n)) for n in range(25))
    assert kept(buffer) == list(range(15, 25))
    assert dropped == buffer.dropped == 15
    assert buffer.body_bytes <= buffer.max_bytes
    assert len(buffer) == 10
    big = Batch((GpuRecord("GPU-big", "node-a", 0, "x" * 40 * one),), (), ())
    assert buffer.push(big) == 10  # larger than the bound: kept alone, as the newest pass
    assert len(buffer) == 1
    buffer.close()
    again = DiskBuffer(tmp_path / "b.db", max_bytes=10 * one)  # the totals survive a restart
    assert (len(again), again.body_bytes, again.dropped) == (1, buffer.body_bytes, 25)
    assert DiskBuffer(tmp_path / "c.db", max_bytes=1000, max_batches=2).push(batch(1)) == 0


@pytest.mark.parametrize("size", [1800, 7000])  # a pass of 8 GPUs; of 32
def test_the_file_stays_near_the_bound(tmp_path: Path, size: int) -> None:
    """What DEFAULT_MAX_BYTES's margin rests on: the file and its journal within 1.2 x the
    bound (bodies fill whole pages)."""
    bound = 8 * 2**20
    buffer = DiskBuffer(tmp_path / "b.db", max_bytes=bound)
    buffer._db.execute("PRAGMA synchronous=OFF")  # sizes are the same, minutes faster
    for n in range(3 * bound // size):
        buffer.push(batch(n, size=size))
    files = sum(p.stat().st_size for p in tmp_path.glob("b.db*"))
    assert buffer.body_bytes <= bound
    assert buffer.body_bytes > bound - 2 * size
    assert files <= 1.2 * bound, files


def assert_recovers(loop: Loop, tmp_path: Path) -> None:
    """Every pass is stored or counted dropped; the newest surviving ones reach the store."""
    survivors = len(loop.buffer)
    assert survivors > 0
    assert survivors + loop.metric("dropped_passes_total") == len(loop.reader.times)
    assert loop.buffer.dropped <= loop.metric("dropped_passes_total")  # unsaved on a full disk
    (tmp_path / "down").mkdir()  # the store is back
    assert loop.sampler.flush()
    times = sorted({ts for _, ts, _ in stored(loop.url)})
    assert times == loop.reader.times[-survivors:]
    assert len(loop.buffer) == 0


def test_sqlite_full_mid_outage_drops_the_oldest_and_the_loop_goes_on(
    script: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'down' / 'auditor.db'}"
    buffer = DiskBuffer(tmp_path / "buffer.db", max_bytes=64 * 2**20)
    # SQLite's page limit raises the very error a full disk does ("database or disk is full")
    buffer._db.execute("PRAGMA max_page_count=100")  # 400 KiB: about 50 passes
    loop = Loop(url, buffer)
    loop.run(200)
    assert loop.metric("passes_total") == 200
    assert loop.metric("store_errors_total") >= 1
    assert loop.buffer.dropped > 100
    assert buffer._db.execute("PRAGMA page_count").fetchone()[0] <= 100
    buffer.close()
    # a restart on the full buffer: its passes are still there, and the loop goes on
    loop.buffer = loop.sampler.buffer = DiskBuffer(tmp_path / "buffer.db", max_bytes=64 * 2**20)
    loop.buffer._db.execute("PRAGMA max_page_count=100")
    assert len(loop.buffer) == len(buffer)
    loop.run(50)
    assert_recovers(loop, tmp_path)


def test_a_real_full_disk_mid_outage_and_at_restart(
    script: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'down' / 'auditor.db'}"
    with tmpfs(tmp_path / "small", "1m") as disk:
        loop = Loop(url, DiskBuffer(disk / "buffer.db"))  # the default bound: 200 MiB
        loop.run(200)
        assert loop.metric("passes_total") == 200
        assert loop.buffer.dropped > 50
        assert not loop.buffer.in_memory
        loop.buffer.close()
        loop.buffer = loop.sampler.buffer = DiskBuffer(disk / "buffer.db")
        assert not loop.buffer.in_memory
        loop.run(50)
        assert_recovers(loop, tmp_path)


def test_a_full_disk_at_start_buffers_in_memory(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "256k") as disk:
        with contextlib.suppress(OSError), (disk / "filler").open("wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        buffer = DiskBuffer(disk / "buffer.db")
        assert buffer.in_memory
        assert buffer.max_bytes == 16 * 2**20
        assert buffer.push(batch(1)) == 0
        assert kept(buffer) == [1]


def test_a_broken_file_is_moved_aside_and_a_fresh_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "buffer.db"
    path.write_bytes(b"this is not a database, a half-written copy maybe" * 100)
    with caplog.at_level(logging.WARNING, logger="auditor.agents.sample.buffer"):
        buffer = DiskBuffer(path)
    aside = list(tmp_path.glob("buffer.db.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_bytes().startswith(b"this is not a database")
    assert not buffer.in_memory
    assert buffer.push(batch(1)) == 0
    assert kept(buffer) == [1]
    assert any("moved aside" in r.getMessage() for r in caplog.records)
