"""A throwaway VictoriaMetrics for tests and benchmarks (Debian's `victoria-metrics`).

`start_victoria_metrics` starts the single-node binary on 127.0.0.1, a free port, over a
temporary `-storageDataPath` with a 100-year retention (the tests' data is dated anywhere);
`load` sends Prometheus text with millisecond timestamps to `/api/v1/import/prometheus`
and waits until a query sees it. Where the binary is missing the caller skips (fails under
CI, where it must be installed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60
BINARY = "victoria-metrics"


def binary() -> str | None:
    """The binary's path, or None where it is not installed."""
    return shutil.which(BINARY) or (
        "/usr/bin/victoria-metrics" if os.path.exists("/usr/bin/victoria-metrics") else None
    )


MISSING = "victoria-metrics not installed (apt-get install victoria-metrics)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class VmServer:
    process: subprocess.Popen[bytes]
    url: str
    root: Path

    def load(self, lines: Iterable[str], *, check: str, at_s: int) -> None:
        """Import Prometheus text lines (`name{labels} value ts_ms`), then wait until the
        series selector `check` names a series around `at_s` (the index alone: no sample
        limit applies)."""
        body = "".join(f"{line}\n" for line in lines).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/import/prometheus", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            assert r.status in {200, 204}, r.status
        urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=60).close()
        deadline = time.monotonic() + 30
        query = urllib.parse.urlencode(
            {"match[]": check, "start": str(at_s - 3600), "end": str(at_s + 3600)}
        )
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.url}/api/v1/series?{query}", timeout=10) as r:
                if b'"data":[]' not in r.read():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"victoria-metrics never showed {check}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_victoria_metrics(root: Path, *, flags: Sequence[str] = ()) -> VmServer:
    """Start VictoriaMetrics over a fresh data directory under `root` on a free port."""
    found = binary()
    if found is None:
        raise RuntimeError(MISSING)
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = (root / "victoria-metrics.log").open("wb")
    process = subprocess.Popen(
        [
            found,
            f"-storageDataPath={root / 'data'}",
            "-retentionPeriod=100y",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-search.disableCache",
            "-loggerLevel=ERROR",
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("HTTP")},
    )
    server = VmServer(process, f"http://127.0.0.1:{port}", root)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((root / "victoria-metrics.log").read_text(errors="replace")[-3000:])
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"victoria-metrics not ready within {START_TIMEOUT_S}s")


def prometheus_lines(openmetrics: str) -> Iterable[str]:
    """OpenMetrics text with second timestamps (`promserver.write_dcgm_openmetrics`) as
    Prometheus text lines with millisecond timestamps, for `/api/v1/import/prometheus`."""
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, ts = line.rpartition(" ")
        yield f"{head} {int(ts) * 1000}"
