"""A throwaway Prometheus for tests and benchmarks, holding backfilled dcgm-exporter data.

`write_dcgm_openmetrics` writes dcgm-exporter-style series as OpenMetrics text; `backfill`
turns them into TSDB blocks with `promtool tsdb create-blocks-from openmetrics`;
`start_prometheus` starts Debian's `prometheus` over them on 127.0.0.1, a free port. Where the
binaries are missing the caller skips (fails under CI, where they must be installed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

START_TIMEOUT_S = 60


def binaries() -> tuple[str, str] | str:
    """(prometheus, promtool), or why they cannot be used."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        return "prometheus/promtool not installed (apt-get install prometheus)"
    return prometheus, promtool


@dataclass(frozen=True)
class Card:
    """One dcgm-exporter GPU: labels, and who held it when ([start_s, end_s) -> ns/pod)."""

    uuid: str
    gpu: int
    hostname: str
    model: str = "NVIDIA H100 80GB HBM3"
    mig_instance: int | None = None
    mig_profile: str = "1g.10gb"
    holders: Sequence[tuple[int, int, str, str]] = field(default_factory=tuple)
    profiling: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
    """More labels (what Prometheus relabelling adds: `kubernetes_node`)."""
    hostnames: Sequence[tuple[int, int, str]] = field(default_factory=tuple)
    """[start_s, end_s) -> Hostname where it changes (an exporter pod replaced); the card
    exports nothing outside these spans. Empty: `hostname` always."""
    only: frozenset[str] | None = None
    """The metrics this card exports (a MIG instance: GR_ENGINE_ACTIVE only); None: all."""
    when: Mapping[str, Sequence[tuple[int, int]]] = field(default_factory=dict)
    """Metric -> the [start_s, end_s) spans it is exported in (a card whose MIG mode goes on
    stops exporting GPU_UTIL); a metric not named: whenever the card exports."""

    def hostname_at(self, t: int) -> str | None:
        if not self.hostnames:
            return self.hostname
        return next((h for start, end, h in self.hostnames if start <= t < end), None)

    def exports_at(self, metric: str, t: int) -> bool:
        spans = self.when.get(metric)
        return spans is None or any(start <= t < end for start, end in spans)

    def exports(self, metric: str) -> bool:
        if self.only is not None:
            return metric in self.only
        return self.profiling or not metric.startswith("DCGM_FI_PROF_")

    def labels(self, t: int) -> str:
        parts = [
            f'gpu="{self.gpu}"',
            f'UUID="{self.uuid}"',
            f'device="nvidia{self.gpu}"',
            f'modelName="{self.model}"',
            f'Hostname="{self.hostname_at(t)}"',
            *(f'{k}="{v}"' for k, v in self.extra.items()),
        ]
        if self.mig_instance is not None:
            parts += [f'GPU_I_ID="{self.mig_instance}"', f'GPU_I_PROFILE="{self.mig_profile}"']
        for start, end, namespace, pod in self.holders:
            if start <= t < end:
                parts += ['container="main"', f'namespace="{namespace}"', f'pod="{pod}"']
        return ",".join(parts)


Value = Callable[[Card, int], float]


@dataclass(frozen=True)
class Plain:
    """Any other gauge series (kube-state-metrics' `kube_pod_info`): 1 over [start_s, end_s)."""

    name: str
    labels: Mapping[str, str]
    start_s: int
    end_s: int
    value: float = 1.0


def write_dcgm_openmetrics(
    out: TextIO,
    cards: Sequence[Card],
    *,
    start_s: int,
    end_s: int,
    interval_s: int,
    metrics: dict[str, Value],
    plain: Sequence[Plain] = (),
) -> int:
    """Samples every `interval_s` in [start_s, end_s); returns the lines of samples written."""
    lines = 0
    for name, value in metrics.items():
        out.write(f"# TYPE {name} gauge\n")
        for card in cards:
            if not card.exports(name):
                continue
            for t in range(start_s, end_s, interval_s):
                if card.hostname_at(t) is None or not card.exports_at(name, t):
                    continue
                out.write(f"{name}{{{card.labels(t)}}} {value(card, t):g} {t}\n")
                lines += 1
    for name in dict.fromkeys(p.name for p in plain):
        out.write(f"# TYPE {name} gauge\n")
        for p in plain:
            if p.name != name:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in p.labels.items())
            first = max(start_s, p.start_s)
            first += (start_s - first) % interval_s  # on the grid of the cards' samples
            for t in range(first, min(end_s, p.end_s), interval_s):
                out.write(f"{name}{{{labels}}} {p.value:g} {t}\n")
                lines += 1
    out.write("# EOF\n")
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class PromServer:
    process: subprocess.Popen[bytes]
    url: str
    root: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


BLOCK_S = 7200
"""promtool's block length: it re-reads its whole input once per block, so the data is
written and converted one two-hour file at a time, in parallel."""


def backfill(
    cards: Sequence[Card],
    data: Path,
    *,
    start_s: int,
    end_s: int,
    interval_s: int,
    metrics: dict[str, Value],
    plain: Sequence[Plain] = (),
) -> int:
    """Write the series into TSDB blocks under `data`; returns the samples written."""
    found = binaries()
    if isinstance(found, str):
        raise RuntimeError(found)
    promtool = found[1]
    work = data.parent / "openmetrics"
    work.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)

    def one_block(block_start: int) -> int:
        source = work / f"{block_start}.om.txt"
        with source.open("w", encoding="utf-8") as out:
            first = max(start_s, block_start + (start_s - block_start) % interval_s)
            lines = write_dcgm_openmetrics(
                out,
                cards,
                start_s=first,
                end_s=min(end_s, block_start + BLOCK_S),
                interval_s=interval_s,
                metrics=metrics,
                plain=plain,
            )
        out_dir = work / f"{block_start}.blocks"
        subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                str(source),
                str(out_dir),
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        for block in out_dir.iterdir():
            block.rename(data / block.name)
        source.unlink()
        return lines

    blocks = range(start_s - start_s % BLOCK_S, end_s, BLOCK_S)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        return sum(pool.map(one_block, blocks))


def backfill_text(text: str, data: Path) -> None:
    """Turn OpenMetrics text (any series, ending `# EOF`) into TSDB blocks under `data`."""
    found = binaries()
    if isinstance(found, str):
        raise RuntimeError(found)
    work = data.parent / "openmetrics-text"
    work.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    source = work / "series.om.txt"
    source.write_text(text, encoding="utf-8")
    out_dir = work / "blocks"
    subprocess.run(
        [found[1], "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(out_dir)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    for block in out_dir.iterdir():
        block.rename(data / block.name)


def start_prometheus(
    data: Path, root: Path, *, config_text: str | None = None, flags: Sequence[str] = ()
) -> PromServer:
    """Serve the TSDB at `data` (filled by `backfill`) on a free loopback port; with
    `config_text`, that configuration (scrape jobs, rule files) instead of an empty one;
    `flags`, more flags (`--query.max-samples=1000`)."""
    found = binaries()
    if isinstance(found, str):
        raise RuntimeError(found)
    prometheus = found[0]
    config = root / "prometheus.yml"
    config.write_text(config_text or "global:\n  scrape_interval: 30s\n", encoding="utf-8")
    port = _free_port()
    log = (root / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("HTTP")},
    )
    server = PromServer(process, f"http://127.0.0.1:{port}", root)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((root / "prometheus.log").read_text(errors="replace")[-3000:])
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"prometheus not ready within {START_TIMEOUT_S}s")


def serve_openmetrics(source: Path, root: Path) -> PromServer:
    """Backfill one OpenMetrics file (the simulator's `dcgm.om.txt`) with promtool and serve
    it from a fresh Prometheus under `root`."""
    found = binaries()
    if isinstance(found, str):
        raise RuntimeError(found)
    data = root / "tsdb"
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [found[1], "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return start_prometheus(data, root)
