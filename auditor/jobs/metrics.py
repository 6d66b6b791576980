"""The latest complete audit of the watcher's cluster on its `/metrics`.

`AuditCollector` is a Prometheus collector that reads the store at most once every
`min_interval_s` (a minute), whatever the scrape rate, and renders the figures with
`auditor.report.audit_metrics`. A failed read is logged and counted
(`auditor_audit_read_errors_total`); the last figures read stay served, so a database
outage never fails a scrape, and the audit's timestamps let alerts tell stale figures.

One database may hold several clusters (SPEC §11): each watcher serves its own cluster's
latest complete audit, every series labelled `cluster`, the read metrics included (they
are all there is of a cluster before its first audit).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from auditor.report.audit_metrics import CLUSTER_LABEL, TOP_JOBS, AuditFigures, audit_families

if TYPE_CHECKING:
    from sqlalchemy import Engine

log = logging.getLogger("auditor.metrics")

READ_EVERY_S = 60.0
"""The store is read at most this often for the audit metrics."""
ALL_TIME = (-(2**62), 2**62)
"""Window bounds that take in every stored audit run."""

READ_METRIC_NAMES = frozenset(
    {"auditor_audit_read_errors_total", "auditor_audit_last_read_timestamp_seconds"}
)


def latest_audit_figures(engine: Engine, *, cluster: str) -> AuditFigures | None:
    """The figures of `cluster`'s most recently stored complete audit, or None before its
    first: another cluster's audits neither hide it nor complete its shards."""
    from auditor.report.audit_metrics import audit_figures
    from auditor.report.windows import latest_complete
    from auditor.store import reads
    from auditor.store.signals import read_causes

    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=ALL_TIME[0], end_ms=ALL_TIME[1], cluster=cluster)
        latest = latest_complete(runs, cluster=cluster)
        if latest is None:
            return None
        results = reads.read_results(conn, latest.run_ids)
        causes = read_causes(conn, latest.run_ids)
    return audit_figures(
        results,
        cluster=latest.cluster,
        window=latest.window,
        completed_ms=latest.completed_ms,
        causes=causes,
    )


class AuditCollector(Collector):
    """Serves `read()`'s figures (those of `cluster`), calling it at most once every
    `min_interval_s`."""

    def __init__(
        self,
        read: Callable[[], AuditFigures | None],
        *,
        cluster: str,
        top_jobs: int = TOP_JOBS,
        min_interval_s: float = READ_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._read = read
        self._cluster = cluster
        self._top_jobs = top_jobs
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._families: list[Metric] = []
        self._errors = 0
        self._last_ok_s: float | None = None
        self.reads = 0
        """Reads of the store so far (tests check the once-a-minute bound)."""

    def refresh(self) -> None:
        """Read the store now if the last read is `min_interval_s` old (or never happened)."""
        with self._lock:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < self._min_interval_s:
                return
            self._read_at = now
            self.reads += 1
            try:
                figures = self._read()
                self._families = audit_families(figures, top_jobs=self._top_jobs)
                self._last_ok_s = self._wall_clock()
            except Exception as e:  # a scrape must never fail for the store: keep the last
                self._errors += 1
                log.warning("cannot read the latest audit for /metrics: %s", e)

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not read the store

    def collect(self) -> Iterable[Metric]:
        self.refresh()
        with self._lock:
            families = list(self._families)
            errors, last_ok = self._errors, self._last_ok_s
        yield from families
        failed = CounterMetricFamily(
            "auditor_audit_read_errors",
            "Failed reads of the latest audit from the store (the last figures read stay served).",
            labels=[CLUSTER_LABEL],
        )
        failed.add_metric([self._cluster], errors)
        yield failed
        if last_ok is not None:
            at = GaugeMetricFamily(
                "auditor_audit_last_read_timestamp_seconds",
                "When the latest audit was last read from the store.",
                labels=[CLUSTER_LABEL],
            )
            at.add_metric([self._cluster], last_ok)
            yield at
