"""How long one relist of 10,000 GPU pods takes against the stand-in API server.

The list goes through the real client in pages of 500, every pod through `pod_record`, and
the reconcile (upsert by UID, close what is missing, store the cursor) in one transaction.
`pytest -s` prints the figures.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeapi import FakeApiServer
from kubeobjects import T0, pod
from watchharness import Harness

from auditor.agents.watch.kube import Timeouts

PODS = 10_000


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        for i in range(PODS):
            srv.cluster.put(
                "pods",
                pod(f"p{i:05d}", uid=f"uid-{i}", created=T0, bound=T0 + 1000, started=T0 + 2000),
            )
        yield srv


@pytest.mark.slow
def test_one_relist_of_10000_pods(server: FakeApiServer, db_url: str, tmp_path: Path) -> None:
    h = Harness(server, db_url, tmp_path)
    reflector = h.reflector(timeouts=Timeouts(connect_s=5, read_s=60))

    started = time.perf_counter()
    reflector.relist()
    first = time.perf_counter() - started
    server.cluster.delete("pods", "ml", "p00000")
    started = time.perf_counter()
    reflector.relist()
    again = time.perf_counter() - started

    rows = h.rows()
    store = db_url.partition(":")[0]
    print(f"\nrelist of {PODS} pods ({store}): first {first:.2f}s, again {again:.2f}s")
    assert len(rows) == PODS
    assert rows["uid-0"]["deleted_estimated"] is True
    assert sum(r["deleted_ms"] is not None for r in rows.values()) == 1
    assert first < 60
    assert again < 60
