"""The sampler's fault cases: database outage, full buffer, lost GPU, failing kubelet, no
driver library; and its own /metrics and /healthz.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script
from fake_podresources import FakePodResources
from test_sampler import GPU_A, GPU_B, T0, Rig, kubelet, script, store, stored

from auditor.agents.sample.buffer import DiskBuffer
from auditor.agents.sample.metrics import serve

__all__ = ["fake_nvml_library", "kubelet", "script", "store"]


def test_store_outage_keeps_passes_on_disk_and_flushes_them_in_order(
    script: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'not-yet' / 'auditor.db'}"  # its directory is missing: down
    rig = Rig(url, tmp=tmp_path, socket=None)
    rig.passes(3)
    assert not rig.sampler.flush()
    assert rig.metric("store_errors_total") == 1
    assert len(rig.buffer) == 3
    rig.buffer.close()  # the sampler restarts during the outage: the buffer is on disk
    rig.buffer = rig.sampler.buffer = DiskBuffer(tmp_path / "buffer.db", max_batches=100)
    rig.passes(1)
    (tmp_path / "not-yet").mkdir()  # the database is back
    assert rig.sampler.flush()
    t0 = int(T0 * 1000)
    assert [ts for uuid, ts, _ in stored(url) if uuid == "GPU-aaaa"] == [
        t0 - 5000,
        t0,
        t0 + 5000,
        t0 + 10_000,
    ]
    assert len(rig.buffer) == 0


def test_a_full_buffer_drops_the_oldest_passes_and_counts_them(
    script: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'down' / 'auditor.db'}"
    rig = Rig(url, tmp=tmp_path, socket=None, max_batches=3)
    rig.passes(5)
    rig.sampler.flush()
    assert len(rig.buffer) == 3
    assert rig.metric("dropped_passes_total") == 2
    assert rig.buffer.dropped == 2
    (tmp_path / "down").mkdir()
    rig.sampler.flush()
    t0 = int(T0 * 1000)
    assert sorted({ts for _, ts, _ in stored(url)}) == [t0 + 5000, t0 + 10_000, t0 + 15_000]


class Proxy:
    """A TCP forwarder to PostgreSQL that can be cut, as a network outage would."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def cut(self) -> None:
        self.up = False
        for s in self.open:
            s.close()
        self.open.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.mark.postgres
def test_postgresql_outage_and_recovery(pg_db_url: str, script: Path, tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    from auditor.store import migrate
    from auditor.store.connection import make_engine

    real = make_url(pg_db_url)
    proxy = Proxy(real.port or 5432)
    url = real.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        migrate.upgrade(make_engine(url))
        rig = Rig(url, tmp=tmp_path, socket=None)
        rig.passes(1)
        assert rig.sampler.flush()
        proxy.cut()
        rig.passes(2)
        assert not rig.sampler.flush()
        assert len(rig.buffer) == 2
        proxy.up = True
        assert rig.sampler.flush()
        assert len(stored(pg_db_url)) == 6
    finally:
        proxy.close()


def test_a_gpu_lost_mid_run_is_counted_and_the_others_go_on(
    store: str, script: Path, tmp_path: Path
) -> None:
    rig = Rig(store, tmp=tmp_path, socket=None)
    rig.passes(1)
    write_script(script, render_script([GPU_A, {**GPU_B, "lost": 1}]))
    rig.passes(1)
    write_script(script, render_script([GPU_A, GPU_B]))
    rig.passes(1)
    rig.sampler.flush()
    uuids = [u for u, _, _ in stored(store)]
    assert (uuids.count("GPU-aaaa"), uuids.count("GPU-bbbb")) == (3, 2)
    assert rig.metric("device_problems_total") == 1


def test_a_card_using_more_memory_than_it_has_is_logged_counted_and_skipped(
    store: str, script: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(store, tmp=tmp_path, socket=None)
    rig.passes(1)
    write_script(script, render_script([GPU_A, {**GPU_B, "mem_used": 81560, "mem_total": 81559}]))
    with caplog.at_level("WARNING"):
        rig.passes(1)
    write_script(script, render_script([GPU_A, GPU_B]))
    rig.passes(1)
    rig.sampler.flush()
    uuids = [u for u, _, _ in stored(store)]
    assert (uuids.count("GPU-aaaa"), uuids.count("GPU-bbbb")) == (3, 2)
    assert rig.metric("device_problems_total") == 1
    assert "memory used 81560 MiB is above its total 81559 MiB" in caplog.text


def test_a_failing_kubelet_costs_only_the_mapping(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
    rig = Rig(store, tmp=tmp_path, socket=kubelet.socket)
    rig.passes(2)
    rig.sampler.flush()
    assert len(stored(store)) == 4
    assert rig.metric("pod_resources_errors_total") == 2


def test_metrics_and_health_over_http(store: str, script: Path, tmp_path: Path) -> None:
    rig = Rig(store, tmp=tmp_path, socket=None)
    server = serve(rig.metrics, address="127.0.0.1", port=0, max_age_s=15)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
        rig.passes(1)
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "auditor_sampler_passes_total 1.0" in text
        assert "auditor_sampler_gpus 2.0" in text
        rig.clock.t += 60  # no pass for a minute: stuck
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
    finally:
        server.shutdown()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_sample_command_runs_on_the_real_pynvml(
    fake_nvml_library: Path, script: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fake_nvml_library.parent),
        SCRIPT_ENV: str(script),
    }
    args = ["--db", db, "sample", "--node", "node-a", "--buffer-dir", str(tmp_path / "buf")]
    args += ["--no-pod-resources", "--metrics-port", "-1", "--period", "0.2", "--passes", "3"]
    done = run_cli(args, env)
    assert done.returncode == 0, done.stderr
    assert len(stored(db)) == 6


@pytest.mark.parametrize("how", ["flag", "env"])
def test_sample_command_logs_json_through_the_watchers_logging_setup(
    fake_nvml_library: Path, script: Path, tmp_path: Path, how: str
) -> None:
    """`--log-format json` (or AUDITOR_LOG_FORMAT=json), as the watcher takes it: the
    sampler's warnings (here: the store cannot be opened) are one JSON object a line."""
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fake_nvml_library.parent),
        SCRIPT_ENV: str(script),
    }
    down = f"sqlite:///{tmp_path / 'no-such-dir' / 'a.db'}"
    args = ["--db", down, "sample", "--node", "node-a", "--buffer-dir", str(tmp_path / "buf")]
    args += ["--no-pod-resources", "--metrics-port", "-1", "--period", "0.2", "--passes", "2"]
    if how == "flag":
        args += ["--log-format", "json"]
    else:
        env["AUDITOR_LOG_FORMAT"] = "json"
    done = run_cli(args, env)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    failed = [r for r in records if r["message"].startswith("store write failed")]
    assert failed, done.stderr
    assert {(r["level"], r["logger"]) for r in failed} == {
        ("warning", "auditor.agents.sample.sampler")
    }


def test_sample_command_without_the_driver_library_exits_with_a_clear_error(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    args = ["--db", f"sqlite:///{tmp_path / 'a.db'}", "sample", "--buffer-dir", str(tmp_path)]
    done = run_cli([*args, "--no-pod-resources", "--metrics-port", "-1"], env)
    assert done.returncode == 4
    assert done.stderr.strip() == (
        "auditor: error: cannot initialise NVML: NVML Shared Library Not Found"
    )


def test_a_pass_the_store_refuses_for_its_data_is_dropped_not_retried_forever(
    script: Path, tmp_path: Path
) -> None:
    """A limit no check foresaw (here a trigger refusing one instant): the passes are written
    one by one, the refused one dropped and counted, the others stored; the buffer empties."""
    from sqlalchemy import text

    from auditor.jobs import open_store

    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    t0 = int(T0 * 1000)
    with open_store(url).begin() as conn:
        conn.execute(
            text(
                f"CREATE TRIGGER refuse BEFORE INSERT ON gpu_samples WHEN NEW.ts_ms = {t0} "
                "BEGIN SELECT RAISE(ABORT, 'refused by policy'); END"
            )
        )
    rig = Rig(url, tmp=tmp_path, socket=None)
    rig.passes(3)
    assert rig.sampler.flush()
    assert rig.metric("refused_passes_total") == 1
    assert rig.metric("store_errors_total") == 0
    assert len(rig.buffer) == 0
    assert [ts for uuid, ts, _ in stored(url) if uuid == "GPU-aaaa"] == [t0 - 5000, t0 + 5000]
    rig.passes(1)  # and the loop goes on
    assert rig.sampler.flush()
    assert [ts for uuid, ts, _ in stored(url) if uuid == "GPU-aaaa"][-1] == t0 + 10_000
