"""The watch loop: list, watch from the list's resourceVersion, relist on 410. No I/O of its own.

A `Reflector` drives one `Source` (pods or nodes, from `auditor.agents.watch.kube` or a test
double) into one `Sink` (the store, `auditor.jobs.watch_sinks`), after the client-go reflector:

- Start from the cursor the sink stored with the last events it committed; with none,
  list (paginated, one consistent snapshot) and hand the whole list to the sink, which
  reconciles the store with it in one transaction and stores the list's resourceVersion.
- Watch from the cursor. Each batch of events is committed together with the
  resourceVersion of its last event (BOOKMARKs move the cursor and nothing else), so a
  crash at any point resumes exactly after the last committed batch: nothing is lost,
  and a replayed batch is written again identically (the writes are idempotent).
- A stream the server ends (its timeout) is watched again from the cursor. `Expired`
  (410 Gone, at connect or in the stream) drops the cursor: relist. `Unavailable` and
  store errors wait a jittered backoff, then watch again from the cursor.
- ResourceVersions are opaque: stored, sent back, compared for equality only.

Backoff delays are data (`Backoff`); the clock, the random source and the stop signal are
parameters, so a test bounds the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from random import Random
from typing import Any, Protocol

from auditor.agents.watch.kube import Event, Expired, Page, Unavailable
from auditor.errors import StoreError
from auditor.settings import WATCH_TIMEOUT_S

log = logging.getLogger("auditor.watch")


class Source(Protocol):
    @property
    def kind(self) -> str: ...

    def list_page(self, *, limit: int, token: str | None = None) -> Page: ...

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[list[Event]]: ...


class Sink(Protocol):
    def cursor(self) -> str | None:
        """The resourceVersion stored with the last committed write, if any."""
        ...

    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        """Reconcile the store with a full list seen at `at_ms`; store the cursor."""
        ...

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        """Write one batch of events and the cursor after them, in one transaction."""
        ...


class Metrics(Protocol):
    def event(self, kind: str, etype: str) -> None: ...
    def relist(self, kind: str) -> None: ...
    def error(self, kind: str, reason: str) -> None: ...
    def synced(self, kind: str, at_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds to wait after the n-th consecutive failure (the last repeats), ± jitter."""

    delays_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
    jitter: float = 0.25
    """Each delay is scaled by a random factor in [1 - jitter, 1 + jitter]."""

    def delay(self, attempt: int, rng: Random) -> float:
        base = self.delays_s[min(attempt, len(self.delays_s) - 1)]
        return base * (1.0 + rng.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True, slots=True)
class LoopOptions:
    watch_timeout_s: int = WATCH_TIMEOUT_S
    """The server ends each watch after this long; the loop then watches again."""
    page_size: int = 500
    """Objects per list page."""
    min_watch_s: float = 1.0
    """A watch that ends sooner than this with no event counts as a failure (backs off)."""
    backoff: Backoff = Backoff()


class Reflector:
    """Keeps one sink in step with one source until `stop` is set."""

    def __init__(
        self,
        source: Source,
        sink: Sink,
        *,
        metrics: Metrics,
        stop: threading.Event,
        options: LoopOptions = LoopOptions(),
        clock: Callable[[], float] = time.time,
        rng: Random | None = None,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.source = source
        self.sink = sink
        self.metrics = metrics
        self.stop = stop
        self.options = options
        self.clock = clock
        self.rng = rng or Random()
        self.keep = keep or (lambda _obj: True)
        """Which listed objects the sink needs: a big list is thinned page by page."""
        self.failures = 0

    def run(self) -> None:
        kind = self.source.kind
        cursor: str | None = None
        resumed = False
        while not self.stop.is_set():
            try:
                if not resumed:
                    cursor = self.sink.cursor()
                    resumed = True
                    if cursor is not None:
                        log.info("resuming watch", extra={"kind": kind, "rv": cursor})
                if cursor is None:
                    cursor = self.relist()
                cursor = self.watch(cursor)
            except Expired as e:
                log.warning("relisting: %s", e, extra={"kind": kind})
                self.metrics.error(kind, "expired")
                cursor = None
                if self.failures:  # 410 again straight after a relist: do not spin
                    self._back_off(self.failures - 1)
                self.failures += 1
            except (Unavailable, StoreError) as e:
                if self.stop.is_set():
                    break  # the stream was cut to stop the watcher
                log.warning("%s", e, extra={"kind": kind})
                self.metrics.error(kind, type(e).__name__.lower())
                self._back_off(self.failures)
                self.failures += 1
                resumed = not isinstance(e, StoreError)  # re-read the cursor after a store error

    def relist(self) -> str:
        """List everything, reconcile the store with it, and return the list's version."""
        kind = self.source.kind
        at_ms = int(self.clock() * 1000)
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            try:
                page = self.source.list_page(limit=self.options.page_size, token=token)
            except Expired:
                if token is None:
                    raise
                log.info("list continue token expired: listing again", extra={"kind": kind})
                at_ms, items, token = int(self.clock() * 1000), [], None
                continue
            items.extend(i for i in page.items if self.keep(i))
            token = page.next_token
            if token is None:
                break
        written = self.sink.replace(items, resource_version=page.resource_version, at_ms=at_ms)
        self.metrics.relist(kind)
        self.metrics.synced(kind, self.clock())
        log.info(
            "listed",
            extra={"kind": kind, "rv": page.resource_version, "items": len(items), "kept": written},
        )
        return page.resource_version

    def watch(self, cursor: str) -> str:
        """Follow one watch stream; return the cursor reached when the server ends it."""
        kind = self.source.kind
        started = self.clock()
        batches = 0
        for batch in self.source.watch(
            resource_version=cursor, timeout_s=self.options.watch_timeout_s
        ):
            if self.stop.is_set():
                break
            if all(e.resource_version == cursor for e in batch):
                continue  # a repeat of what is committed already
            last = next((e.resource_version for e in reversed(batch) if e.resource_version), cursor)
            self.sink.apply(batch, resource_version=last, at_ms=int(self.clock() * 1000))
            cursor = last
            batches += 1
            for event in batch:
                self.metrics.event(kind, event.type)
            self.metrics.synced(kind, self.clock())
            self.failures = 0
        if batches == 0 and self.clock() - started < self.options.min_watch_s:
            raise Unavailable(f"{kind} watch ended at once")
        self.metrics.synced(kind, self.clock())
        self.failures = 0
        return cursor

    def _back_off(self, attempt: int) -> None:
        self.stop.wait(self.options.backoff.delay(attempt, self.rng))
