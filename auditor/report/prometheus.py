"""The report as Prometheus exposition text, for node-exporter's textfile collector or a push.

`gpu_waste_hours{<grouping keys>, category}` carries GPU-hours per category of the report's
window, so an existing Grafana can chart where GPU time goes; the window's bounds come along
as timestamps so a dashboard can tell stale figures. Label values are names made
`terminal_safe` (the text may well be printed, and a lone surrogate cannot be encoded), then
escaped by the exposition writer (backslash, double quote, newline).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from auditor.model import CATEGORIES
from auditor.report.render import Report, group_keys
from auditor.report.text import terminal_safe


class _ReportCollector(Collector):
    def __init__(self, report: Report) -> None:
        self.report = report

    def collect(self) -> Iterable[Metric]:
        keys = group_keys(self.report.rows)
        hours = GaugeMetricFamily(
            "gpu_waste_hours",
            "GPU-hours per waste category in the audited window (SPEC §3 taxonomy).",
            labels=[*keys, "category"],
        )
        for rec in self.report.rows.to_dict("records"):
            labels = [terminal_safe(str(rec[k])) for k in keys]
            for cat in CATEGORIES:
                hours.add_metric([*labels, cat.value], float(rec[f"{cat.value}_gpu_hours"]))
        yield hours
        start = GaugeMetricFamily(
            "gpu_waste_window_start_timestamp_seconds", "Start of the audited window."
        )
        start.add_metric([], self.report.window[0] / 1000)
        yield start
        end = GaugeMetricFamily(
            "gpu_waste_window_end_timestamp_seconds", "End of the audited window."
        )
        end.add_metric([], self.report.window[1] / 1000)
        yield end


def render_prometheus(report: Report) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report))
    return generate_latest(registry).decode("utf-8")
