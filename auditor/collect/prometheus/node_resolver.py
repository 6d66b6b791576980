"""Which node each dcgm-exporter series names (SPEC §2.1), and what the import summary says
of where nodes came from.

The first node label present (`NODE_LABELS`, `--node-label`: what Prometheus relabelling
adds); else the node the user names for the card or its `Hostname` (`--node`); else, where
`Hostname` is an exporter pod that kube-state-metrics' `kube_pod_info` knows, the node that
pod ran on at the time; else the node the store already holds the card on (the sampler's,
an earlier import's: a UUID is one physical card); else the first `Hostname` (else
`instance`) the card came under. Without host networking `Hostname` is the exporter pod's
name, and a replaced exporter pod gives the card a second one: it is the same card on the
same node, so the first name seen is kept (`NodeResolver.fallback`), in this chunk and the
ones after. Prometheus drops empty labels, so a series without `pod` is a card no pod held;
a GPU whose series name two nodes otherwise is refused (`same_node`), as the store refuses
a card moved to another node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from auditor.collect.prometheus.decode import GR_ENGINE
from auditor.collect.prometheus.matchers import selector
from auditor.errors import GpuConflictError

if TYPE_CHECKING:
    from auditor.collect.prometheus.client import PrometheusClient

NODE_LABELS: tuple[str, ...] = ("kubernetes_node", "node", "nodename")
"""Labels that name the node, first present wins (`--node-label`): what Prometheus
relabelling adds in kube-prometheus-stack and usual ServiceMonitor configs."""

KUBE_POD_INFO = "kube_pod_info"
"""kube-state-metrics' series of each pod, with its node: how an exporter pod's name
(dcgm-exporter's `Hostname` without host networking) becomes the node it ran on."""


_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes pod name (a DNS subdomain): only such a `Hostname` is looked up."""


@dataclass
class NodeResolver:
    """Which node each series of a GPU names (SPEC §2.1): the first of `labels` present;
    else, where `Hostname` is an exporter pod that kube-state-metrics' `kube_pod_info` knows,
    the node that pod ran on at the time; else `Hostname` (else `instance`).

    An exporter pod is replaced now and then, so a card's series come under several pod
    names over a window: each name is resolved at the times of its samples, from the spans
    kube_pod_info shows it on a node (kept across chunks, merged where contiguous)."""

    labels: tuple[str, ...] = NODE_LABELS
    spans: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    """Exporter pod name -> [(first_ms, last_ms, node)], sorted."""
    given: Mapping[str, str] = field(default_factory=dict)
    """GPU UUID or `Hostname` -> node, as the user says (`--node`): before kube_pod_info."""
    stored: Mapping[str, str] = field(default_factory=dict)
    """GPU UUID -> the node the store holds it on: before a bare `Hostname`."""
    chosen: dict[str, tuple[str, str]] = field(default_factory=dict)
    """GPU UUID -> (node, source) the fallback gave it first: kept across chunks."""

    def node_label(self, labels: Mapping[str, str]) -> tuple[str, str] | None:
        """(node, `label NAME`) where a node label is present."""
        for name in self.labels:
            value = labels.get(name)
            if value:
                return value, f"label {name}"
        return None

    def learn(
        self,
        client: PrometheusClient,
        names: set[str],
        *,
        first_ms: int,
        last_ms: int,
        step_ms: int,
    ) -> None:
        """Read kube_pod_info of the pods named `names` over the chunk into `spans`."""
        wanted = sorted(n for n in names if _POD_NAME.fullmatch(n))
        for i in range(0, len(wanted), 200):
            pattern = "|".join(n.replace(".", "\\\\.") for n in wanted[i : i + 200])
            window = f"[{max(step_ms - 1, 1)}ms]"
            mine = getattr(client, "matchers", "")
            by_pod = selector(KUBE_POD_INFO, f'pod=~"{pattern}"', mine)
            by_exported = selector(KUBE_POD_INFO, f'exported_pod=~"{pattern}"', mine)
            query = f"last_over_time({by_pod}{window}) or last_over_time({by_exported}{window})"
            series = client.query_range(
                query, start_s=first_ms / 1000, end_s=last_ms / 1000, step_s=step_ms / 1000
            )
            for labels, points in series:
                pod = labels.get("exported_pod") or labels.get("pod")
                node = labels.get("exported_node") or labels.get("node")
                kind = labels.get("created_by_kind")
                if not pod or not node or not points or pod not in names:
                    continue
                if kind is not None and kind != "DaemonSet" and "dcgm" not in pod.lower():
                    continue  # a pod of the same name that is no exporter
                for ts, _ in points:
                    self._add(pod, round(ts * 1000), node, step_ms=step_ms)

    def named(self, uuid: str, host: str) -> tuple[str, str] | None:
        """(node, `--node`) where the user names the node of `uuid` or of `host`."""
        node = self.given.get(uuid) or self.given.get(host)
        return None if node is None else (node, GIVEN)

    def fallback(self, uuid: str, host: str, which: str) -> tuple[str, str]:
        """The node of a series whose only evidence is its `Hostname` (or `instance`): the
        card's stored node, else the first name this card came under (an exporter pod
        replaced later is the same card on the same node), else `host`."""
        if uuid in self.stored:
            return self.stored[uuid], STORED
        return self.chosen.setdefault(uuid, (host, which))

    def _add(self, pod: str, ms: int, node: str, *, step_ms: int) -> None:
        spans = self.spans.setdefault(pod, [])
        for i, (a, b, n) in enumerate(spans):
            if n == node and a - step_ms <= ms <= b + step_ms:
                spans[i] = (min(a, ms), max(b, ms), n)
                return
        spans.append((ms, ms, node))
        spans.sort()

    def pod_node(self, pod: str, ms: int) -> str | None:
        """The node exporter pod `pod` ran on at `ms`: the span holding it, else the
        nearest (kube-state-metrics and the exporter are scraped apart); None if unknown."""
        best: tuple[int, str] | None = None
        for a, b, node in self.spans.get(pod, ()):
            gap = 0 if a <= ms <= b else min(abs(ms - a), abs(ms - b))
            if best is None or gap < best[0]:
                best = (gap, node)
        return None if best is None else best[1]


GIVEN = "--node"
STORED = "stored GPU"
"""Sources of a node (`node_sources`): the user's `--node`; the store's record of the card."""

HOSTNAME_CAVEAT = (
    "no node label and no kube_pod_info: if dcgm-exporter does not run with host "
    "networking these are pod names; see --node-label and --node"
)


def describe_sources(nodes: Mapping[str, int], utils: Mapping[str, int]) -> str:
    """What the import summary says of where nodes (and, where not GPU_UTIL, utilisation)
    came from: `nodes from label kubernetes_node`, with GPU counts where mixed."""

    def gpus(n: int) -> str:
        return f"{n} GPU" if n == 1 else f"{n} GPUs"

    parts = [source if len(nodes) == 1 else f"{source} ({gpus(n)})" for source, n in nodes.items()]
    text = f"nodes from {', '.join(parts)}" if parts else ""
    if "Hostname" in nodes:
        text += f" ({HOSTNAME_CAVEAT})"
    if "instance" in nodes:
        text += " (no Hostname label: the scrape target)"
    if utils.get(GR_ENGINE):
        text += f"; utilisation of {gpus(utils[GR_ENGINE])} from {GR_ENGINE} (MIG instances)"
    return text


def same_node(named: dict[str, tuple[str, str]], uuid: str, found: tuple[str, str]) -> None:
    """Record the node one series of `uuid` names; another node than an earlier series
    named is the card on two nodes, refused."""
    seen = named.setdefault(uuid, found)
    if seen[0] != found[0]:
        raise GpuConflictError(uuid=uuid, field="node", stored=seen[0], new=found[0])
