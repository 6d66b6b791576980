"""A watcher wired to the stand-in API server through the real Kubernetes client, for tests.

`Harness` runs the pod (and node) reflectors in threads against a store, with short
timeouts and backoff so faults resolve in well under a second, and reads back what the
store holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubeapi import FakeApiServer
from sqlalchemy import Engine, select

from auditor.agents.watch import kube
from auditor.agents.watch.metrics import WatchMetrics
from auditor.agents.watch.watcher import Backoff, LoopOptions, Reflector
from auditor.jobs import open_store
from auditor.jobs.watch_dra import DraSink, WatchedDra
from auditor.jobs.watch_sinks import NodeSink, PodSink, requests_gpus, scope_filter
from auditor.settings import TeamRules
from auditor.store import migrate
from auditor.store.schema import nodes, pods

FAST = LoopOptions(
    watch_timeout_s=5, min_watch_s=0.0, backoff=Backoff(delays_s=(0.02, 0.05, 0.1), jitter=0.2)
)
TIMEOUTS = kube.Timeouts(connect_s=2.0, read_s=1.0)
TENURE = ("namespace", "name", "node", "created_ms", "bound_ms", "started_ms", "finished_ms")


class Harness:
    def __init__(self, server: FakeApiServer, db_url: str, tmp: Path) -> None:
        self.server = server
        self.cluster = server.cluster
        migrate.upgrade(db_url)
        self.engine: Engine = open_store(db_url)
        self.api = kube.connect(kubeconfig=str(server.kubeconfig(tmp / "kubeconfig")))
        self.metrics = WatchMetrics(("pods", "nodes", "resourceclaims", "resourceslices"))
        self.dra: WatchedDra | None = None
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def reflector(
        self,
        *,
        kind: kube.Kind = kube.Kind.PODS,
        namespace: str | None = None,
        timeouts: kube.Timeouts = TIMEOUTS,
    ) -> Reflector:
        version = kube.dra_version(self.api) if kind in kube.DRA_KINDS else None
        source = kube.KubeSource(
            self.api,
            kind=kind,
            namespace=namespace,
            timeouts=timeouts,
            version=version or kube.DRA_VERSIONS[0],
        )
        sink: Any
        if kind is kube.Kind.PODS:
            sink = PodSink(
                self.engine,
                scope=source.scope,
                teams=TeamRules(),
                in_scope=scope_filter(namespace, None),
                on_skip=lambda reason: self.metrics.skipped("pods", reason),
                after=self.dra.retry if self.dra is not None else None,
            )
        elif kind in kube.DRA_KINDS:
            assert self.dra is not None
            sink = DraSink(
                self.dra,
                kind=str(kind),
                scope=source.scope,
                on_skip=lambda reason: self.metrics.skipped(str(kind), reason),
            )
        else:
            sink = NodeSink(
                self.engine,
                scope=source.scope,
                on_skip=lambda reason: self.metrics.skipped("nodes", reason),
            )
        keep = requests_gpus if kind is kube.Kind.PODS else None
        return Reflector(
            source, sink, metrics=self.metrics, stop=self.stop, options=FAST, keep=keep
        )

    @contextmanager
    def running(
        self, *, namespace: str | None = None, nodes: bool = False, dra: bool = False
    ) -> Iterator[Harness]:
        """Watch while the block runs; the loops are stopped (and joined) after it. With
        `dra`, claims and slices too (a fresh memory of them, as a started watcher has)."""
        self.stop = threading.Event()
        kinds = [kube.Kind.PODS, kube.Kind.NODES] if nodes else [kube.Kind.PODS]
        self.dra = WatchedDra(self.engine) if dra else None
        if dra:
            kinds += [kube.Kind.CLAIMS, kube.Kind.SLICES]
        self.threads = [
            threading.Thread(target=self.reflector(kind=k, namespace=namespace).run, daemon=True)
            for k in kinds
        ]
        for t in self.threads:
            t.start()
        try:
            yield self
        finally:
            self.stop.set()
            for t in self.threads:
                t.join(timeout=10)
            assert not any(t.is_alive() for t in self.threads), "a watch loop did not stop"

    def rows(self) -> dict[str, dict[str, Any]]:
        """The pods table by UID: tenure columns, deletion time and whether it is estimated."""
        cols = [pods.c[c] for c in (*TENURE, "deleted_ms", "deleted_estimated")]
        with self.engine.connect() as conn:
            result = conn.execute(select(pods.c.uid, *cols))
            return {r.uid: {c: getattr(r, c) for c in r._fields if c != "uid"} for r in result}

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.engine.connect() as conn:
            return {r.name: dict(r._mapping) for r in conn.execute(select(nodes))}

    def count(self, what: str) -> float:
        """A metric's value summed over its labels (`relists`, `errors`, `events`,
        `skipped_objects`)."""
        total = 0.0
        for family in self.metrics.registry.collect():
            if family.name == f"auditor_watch_{what}":
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
        return total
