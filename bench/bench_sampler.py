"""The node sampler's own cost: CPU time per GPU-sample and resident memory.

Runs the real `auditor sample` command (a subprocess, as the DaemonSet runs it) over the
fake NVML library (tests/fake_nvml, built with gcc) scripted with N GPUs whose driver
buffers hold a utilisation sample every 1/6 s, with a fake kubelet pod-resources server
mapping every GPU to a pod, writing to a SQLite store (a flush every 30 s). From its first
flush on (start-up and creating the store excluded) it reads the passes from the sampler's
/metrics and CPU time and resident memory from /proc, and prints the steady-state CPU time
per GPU-sample, flushes included. Run: .venv/bin/python bench/bench_sampler.py
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_nvml.build import SCRIPT_ENV, build, render_script, write_script
from fake_podresources import FakeContainer, FakePodResources

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(auditor_sampler_\w+) (\S+)$", text, re.MULTILINE)
    }


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) if match else -1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fake_pod_tree(tmp: Path, gpus: int) -> list[str]:
    """A /proc with one process per card, each in its pod, and those pods' cgroup v2 files
    (the real k0s pod's cpu.stat); the sampler's flags that read them."""
    real = ROOT / "tests" / "fixtures" / "signals"
    proc, cgroup = tmp / "proc", tmp / "cgroup"
    (cgroup).mkdir()
    (cgroup / "cgroup.controllers").write_text("cpu io memory\n")
    for i in range(gpus):
        uid = f"{i:08d}-0000-4000-8000-000000000000"
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        rel = f"kubepods.slice/kubepods-burstable.slice/{slice_}"
        (proc / str(10_000 + i)).mkdir(parents=True)
        (proc / str(10_000 + i) / "cgroup").write_text(f"0::/{rel}/cri-containerd-{i}.scope\n")
        pod = cgroup / rel
        pod.mkdir(parents=True)
        (pod / "cpu.stat").write_text((real / "cgroupv2-pod-cpu.stat").read_text())
        (pod / "cpu.max").write_text("200000 100000\n")
        (pod / "cpu.pressure").write_text((real / "cgroupv2-cpu.pressure").read_text())
        (pod / "io.pressure").write_text((real / "cgroupv2-cpu.pressure").read_text())
    return ["--process-util", "--proc-root", str(proc), "--cgroup-root", str(cgroup)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--period", type=float, default=5.0)
    parser.add_argument("--passes", type=int, default=12, help="measured after the first flush")
    parser.add_argument(
        "--signals",
        action="store_true",
        help="also read SPEC §10 signals: each card's PCIe/NVLink, and the cgroup of the pod "
        "of a process on each card (--process-util, a fake /proc and cgroup v2 tree)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sampler-", dir="/tmp"))
    try:
        library = build(tmp / "lib")
        script = tmp / "script"
        devices = [
            {
                "uuid": f"GPU-{i:08d}",
                "name": "NVIDIA H100 80GB HBM3",
                "mem_total": 81559,
                "mem_used": 20000,
                "util": 37,
                "power_mw": 350000,
                "sm_clock": 1980,
                "throttle": 0,
                "temp": 60,
                "samples": "synthetic",
            }
            for i in range(args.gpus)
        ]
        procs: dict[int, list[dict[str, object]]] = {}
        extra: list[str] = []
        if args.signals:
            for i, dev in enumerate(devices):
                dev.update(pcie_tx=1000, pcie_rx=2000, pcie_gen=5, pcie_width=16)
                dev.update(nvlinks=18, nvlink_tx=10, nvlink_rx=10)
                procs[i] = [{"pid": 10_000 + i, "sm": 30}]
            extra = fake_pod_tree(tmp, args.gpus)
        write_script(script, render_script(devices, procs=procs))
        kubelet = FakePodResources(tmp / "kubelet.sock").start()
        kubelet.containers = [
            FakeContainer("team-a", f"job-{i}", "main", "nvidia.com/gpu", [f"GPU-{i:08d}"])
            for i in range(args.gpus)
        ]
        port = free_port()
        env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent), SCRIPT_ENV: str(script)}
        command = [sys.executable, "-m", "auditor", "--db", f"sqlite:///{tmp / 'a.db'}"]
        command += ["sample", "--node", "bench", "--buffer-dir", str(tmp / "buffer")]
        command += ["--pod-resources", str(kubelet.socket), "--period", str(args.period)]
        command += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1", *extra]
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/metrics"
        # Scraping costs the sampler CPU too: two scrapes only, after the first flush (at
        # flush_every = 30 s: start-up and creating the store done) and at the end.
        time.sleep(35)
        first = scrape(url)
        cpu0 = cpu_seconds(proc.pid)
        time.sleep(args.passes * args.period)
        last = scrape(url)
        cpu1 = cpu_seconds(proc.pid)
        peak_rss = rss_kib(proc.pid)
        proc.terminate()
        proc.wait(timeout=60)
        kubelet.stop()
        passes = last["auditor_sampler_passes_total"] - first["auditor_sampler_passes_total"]
        samples = passes * args.gpus
        cpu = cpu1 - cpu0
        print(
            f"{args.gpus} GPUs, {args.period:g}s period, {passes:.0f} passes measured"
            f"{' (with signals)' if args.signals else ''}: "
            f"CPU {cpu * 1000 / passes:.2f} ms per pass, "
            f"{cpu * 1000 / samples:.3f} ms per GPU-sample "
            f"({cpu / (passes * args.period) * 100:.3f}% of one core), "
            f"resident memory {peak_rss / 1024:.1f} MiB (VmRSS), "
            f"max RSS {last['auditor_sampler_max_resident_bytes'] / 2**20:.1f} MiB"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
