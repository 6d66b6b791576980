"""Live idle streaks (SPEC §9): how long each held card has been idle, as a Prometheus gauge.

`auditor_gpu_idle_streak_seconds{node,gpu,namespace,pod}`, one series per card a pod holds:
the time from the first idle sample of the card's current idle stretch (utilisation at or
below the classifier's idle threshold) to the latest pass, 0 while the card is active. A
sample stands for the time it covers from its own timestamp (SPEC §3), so one idle pass
after an active one already reads as idle since that sample. As in the classifier's idle
runs, an unreadable sample neither breaks a stretch nor starts one. The series resets when
the card is active again and disappears when the pod releases the card (or the holder
mapping loses it); a new holder starts from its first idle sample.

A restarted sampler resumes each stretch from the store (`restored`: the start the stored
samples give for each card and pod holding it, `auditor.store.streaks`), so an alert on a
long stretch does not start over with every restart. Only the first pass of a holding reads
`restored` (the first pass that finds any holding); from then on the live passes decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge

from auditor.model import GpuSample, Holding

METRIC = "auditor_gpu_idle_streak_seconds"
Key = tuple[str, str, str]
"""(gpu uuid, namespace, pod)."""


class IdleStreaks:
    """Tracks each held card's idle stretch and exports it (module docstring)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        node: str,
        idle_threshold_pct: float,
        restored: Mapping[Key, int] | None = None,
    ) -> None:
        self.node = node
        self.idle_threshold_pct = idle_threshold_pct
        self.gauge = Gauge(
            METRIC,
            "Seconds a held GPU has been idle in a row (utilisation at or below the idle "
            "threshold), 0 while active; one series per card and pod holding it.",
            ["node", "gpu", "namespace", "pod"],
            registry=registry,
        )
        self._since: dict[Key, int | None] = {}
        self._restored: dict[Key, int] = dict(restored or {})

    def update(
        self, *, taken_ms: int, samples: Sequence[GpuSample], held: Sequence[Holding]
    ) -> None:
        """One pass: who holds which card now, and each card's latest reading."""
        latest: dict[str, GpuSample] = {}
        for s in samples:
            if s.gpu_uuid not in latest or s.ts_ms >= latest[s.gpu_uuid].ts_ms:
                latest[s.gpu_uuid] = s
        now = {(h.gpu_uuid, h.namespace, h.pod) for h in held}
        for key in set(self._since) - now:
            del self._since[key]
            self.gauge.remove(self.node, *key)
        for key in sorted(now):
            since = self._since[key] if key in self._since else self._restored.pop(key, None)
            sample = latest.get(key[0])
            if sample is not None and sample.util is not None:
                if sample.util <= self.idle_threshold_pct:
                    since = sample.ts_ms if since is None else since
                else:
                    since = None
            self._since[key] = since
            seconds = 0.0 if since is None else max(0, taken_ms - since) / 1000.0
            self.gauge.labels(self.node, *key).set(seconds)
        if now:  # only the holdings the restarted sampler's first mapping finds resume: a
            self._restored.clear()  # later pod of the same name (a notebook) starts afresh
