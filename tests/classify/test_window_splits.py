"""Adjacent audit windows add up to their union (SPEC §3 "Whole tenures", §11).

The audit CronJob audits day by day; finance and the reports sum those days. Whatever the
split, the results of the split windows must sum to the results of one audit of the whole,
per (card, pod, category): idle runs are classified over the whole tenure, reading stored
samples outside the window, then clipped. The shapes that break it are tenures the window
cuts: a pod still running where the data ends (an open tenure, whose idle tail is a middle
run), a tenure crossing several windows, a gang whose cards held at other times (its
checkpoint series is over all its gaps), and shared cards (SPEC §7). The causes inside
`compute_idle` and `unallocated` (SPEC §10) add up too, with signals that change inside
tenures and a node cordoned for a while.

Cases are drawn at 60 s sampling, as dcgm-exporter is often scraped, from the records the
real system stores: cards, samples, pods with their bound and finished times, exact
assignments with shares.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine

from auditor import jobs
from auditor.classify import build_tenures, classify
from auditor.model import Window
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine

T0 = 1_795_392_000_000  # 2026-11-23 00:00 UTC
MINUTE = 60_000
PERIOD_MS = 60_000
TH = Thresholds()
Key = tuple[str, str, str]


@dataclass(frozen=True)
class Pod:
    uid: str
    gang: str
    card: str
    bound_ms: int
    finished_ms: int | None
    """None: still running where the data ends."""
    share: float | None
    """None: the whole card."""


@dataclass(frozen=True)
class Case:
    cards: tuple[str, ...]
    samples: pd.DataFrame
    pods: tuple[Pod, ...]

    @property
    def window(self) -> Window:
        return Window(T0 - 60 * MINUTE, int(self.samples["ts_ms"].max()) + PERIOD_MS)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A few cards sampled every minute for a few hours: stretches of work, idle (long and
    short) and outages; a few pods, some still running, some sharing a card, some in one
    gang across cards."""
    n_cards = draw(st.integers(1, 3))
    minutes = draw(st.integers(3, 8)) * 60
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cards = tuple(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(n_cards))
    rows: list[tuple[str, int, float]] = []
    stretch = st.tuples(st.sampled_from(["active", "idle", "idle", "gap"]), st.integers(1, 80))
    for card in cards:
        t = 0
        while t < minutes:
            kind, length = draw(stretch)
            for k in range(t, min(t + length, minutes)):
                if kind == "gap" and length > 3:
                    continue
                util = float(rng.uniform(0, 4)) if kind != "active" else float(rng.uniform(10, 100))
                rows.append(
                    (card, T0 - 60 * MINUTE + k * PERIOD_MS + int(rng.integers(0, 50)), util)
                )
            t += length
    assume(rows)  # every stretch an outage: no data whose windows could be split
    samples = pd.DataFrame(rows, columns=["gpu", "ts_ms", "util"]).astype(
        {"gpu": object, "ts_ms": np.int64, "util": np.float64}
    )
    pods: list[Pod] = []
    for i in range(draw(st.integers(1, 4))):
        bound = T0 + draw(st.integers(-90, minutes - 70)) * MINUTE + draw(st.integers(0, 59_999))
        held = draw(st.one_of(st.none(), st.integers(5, minutes)))
        pods.append(
            Pod(
                uid=f"pod-{i}",
                gang=draw(st.sampled_from([f"pod-{i}", "job-1"])),
                card=draw(st.sampled_from(cards)),
                bound_ms=bound,
                finished_ms=None if held is None else bound + held * MINUTE,
                share=draw(st.sampled_from([None, None, 0.5])),
            )
        )
    return Case(cards=cards, samples=samples, pods=tuple(pods))


@st.composite
def splits(draw: st.DrawFn, window: Window) -> list[Window]:
    """The window cut at one to four points (whole minutes, as a CronJob's days are)."""
    lo, hi = window.start_ms // MINUTE + 1, window.end_ms // MINUTE - 1
    cuts = sorted(set(draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4))))
    edges = [window.start_ms, *(c * MINUTE for c in cuts), window.end_ms]
    return [Window(a, b) for a, b in itertools.pairwise(edges)]


def frames(case: Case) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """gpus, pods and assignments as the store's reads hand them to `build_tenures`."""
    gpus = pd.DataFrame(
        {"uuid": list(case.cards), "node": "n1", "gpu_index": range(len(case.cards))}
    )
    pods = pd.DataFrame(
        {
            "uid": [p.uid for p in case.pods],
            "namespace": "ml",
            "name": [p.uid for p in case.pods],
            "node": "n1",
            "gang": [p.gang for p in case.pods],
            "gpu_count": 1,
            "bound_ms": pd.array([p.bound_ms for p in case.pods], dtype="Int64"),
            "finished_ms": pd.array([p.finished_ms for p in case.pods], dtype="Int64"),
            "deleted_ms": pd.array([None for _ in case.pods], dtype="Int64"),
        }
    )
    assignments = pd.DataFrame(
        {
            "pod_uid": [p.uid for p in case.pods],
            "gpu_uuid": [p.card for p in case.pods],
            "replicas": pd.array([None for _ in case.pods], dtype="Int64"),
            "share": [math.nan if p.share is None else p.share for p in case.pods],
        }
    )
    return gpus, pods, assignments


def totals(frames_: list[pd.DataFrame]) -> dict[Key, float]:
    out: dict[Key, float] = defaultdict(float)
    for frame in frames_:
        keyed = frame.fillna({"pod_uid": "-"})
        for g, p, c, s in keyed[["gpu", "pod_uid", "category", "seconds"]].itertuples(index=False):
            out[(str(g), str(p), str(c))] += float(s)
    return dict(out)


def assert_add_up(parts: dict[Key, float], whole: dict[Key, float], *, abs_s: float = 1e-6) -> None:
    for key in set(parts) | set(whole):
        a, b = parts.get(key, 0.0), whole.get(key, 0.0)
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=abs_s), (key, a, b)


PERIOD_TOLERANCE_S = 0.5
"""Through the store each audit estimates a card's period from the samples it reads (the
median spacing, to the millisecond): with timestamps jittered by tens of milliseconds, a
window's estimate may differ from the week's by a few milliseconds, and so does what the
sample before an outage covers. Far below one misjudged sample (a minute here)."""


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_windows_add_up_to_the_whole_through_the_classifier(data: st.DataObject) -> None:
    case = data.draw(cases())
    whole = case.window
    windows = data.draw(splits(whole))
    gpus, pods, assignments = frames(case)
    # the tenures as the audit builds them: an open pod holds its card past the data's end
    tenures = build_tenures(pods, gpus, assignments, now_ms=whole.end_ms + 15 * MINUTE)

    def run(window: Window) -> pd.DataFrame:
        return classify(case.samples, tenures, window=window, thresholds=TH).results

    assert_add_up(totals([run(w) for w in windows]), totals([run(whole)]))


# ----------------------------------------------------------------------------- the store


def write_case(url: str, case: Case) -> None:
    """The case through the store's own writes, as the importers and the watcher write."""
    from auditor.jobs.common import open_store
    from auditor.model import GpuRecord, GpuSample, PodRecord, WorkloadKind
    from auditor.store import pod_writes, writes

    engine = open_store(url)
    try:
        with engine.begin() as conn:
            ids = writes.upsert_gpus(
                conn, [GpuRecord(c, "n1", i, "NVIDIA H100") for i, c in enumerate(case.cards)]
            )
            write_signals(conn, case, ids)
            writes.insert_samples(
                conn,
                [
                    GpuSample(str(g), int(t), float(u))
                    for g, t, u in case.samples[["gpu", "ts_ms", "util"]].itertuples(index=False)
                ],
                ids,
            )
            pod_writes.upsert_pods(
                conn,
                [
                    PodRecord(
                        uid=p.uid,
                        namespace="ml",
                        name=p.uid,
                        node="n1",
                        team="ml",
                        job=f"Job/{p.gang}",
                        job_kind="Job",
                        workload=WorkloadKind.TRAINING,
                        gang=p.gang,
                        gpu_count=1,
                        bound_ms=p.bound_ms,
                        finished_ms=p.finished_ms,
                    )
                    for p in case.pods
                ],
            )
            writes.upsert_assignments(
                conn,
                [(p.uid, ids[p.card], p.bound_ms) for p in case.pods],
                source="test",
                shares={(p.uid, ids[p.card]): (None, p.share) for p in case.pods},
            )
    finally:
        engine.dispose()


def write_signals(conn: Connection, case: Case, ids: dict[str, int]) -> None:
    """Signals as the sampler stores them (SPEC §10), every minute off the sampling grid:
    each pod's CPU now at its limit, now not; each card's PCIe traffic now high, now low;
    and the node cordoned for a stretch. So the causes change inside tenures, and windows
    cut pieces whose halves lie on either side of a signal's change."""
    from auditor.store.signals import write_card_signals, write_node_outages, write_pod_signals

    rng = np.random.default_rng(int(case.samples["ts_ms"].sum()) % 2**32)
    start = int(case.samples["ts_ms"].min()) - 10 * MINUTE
    end = int(case.samples["ts_ms"].max()) + 10 * MINUTE
    ticks = np.arange(start + 17_000, end, MINUTE)
    write_pod_signals(
        conn,
        [
            {"pod_uid": p.uid, "source": "cgroup", "ts_ms": int(t),
             "cpu_limit_ratio": float(rng.choice([0.3, 0.95])), "throttled_ratio": 0.0}
            for p in case.pods
            for t in ticks
            if rng.random() < 0.8  # a pass that missed a pod: its last row stands for it
        ],
    )  # fmt: skip
    write_card_signals(
        conn,
        [
            {"gpu_id": ids[c], "ts_ms": int(t) + 5_000,
             "pcie_bytes_s": float(rng.choice([1e8, 5e9])), "pcie_link_bytes_s": 8e9}
            for c in case.cards
            for t in ticks
        ],
    )  # fmt: skip
    cordon = int(rng.integers(start, end))
    write_node_outages(
        conn,
        [{"node": "n1", "reason": "cordoned", "start_ms": cordon,
          "end_ms": cordon + int(rng.integers(1, 120)) * MINUTE + 7_000}],
    )  # fmt: skip


def stored(url: str, run_ids: list[int]) -> dict[Key, float]:
    """Seconds per (card, pod, category) and per (card, pod, category/cause) of the runs;
    checks on the way that each run's causes sum to its categories."""
    from auditor.jobs.common import open_store
    from auditor.store import reads
    from auditor.store.signals import read_causes

    engine = open_store(url)
    try:
        with engine.connect() as conn:
            results = [reads.read_results(conn, [r]) for r in run_ids]
            causes = [read_causes(conn, [r]) for r in run_ids]
    finally:
        engine.dispose()
    for res, cau in zip(results, causes, strict=True):
        split = res[res["category"].isin(["compute_idle", "unallocated"])]
        assert_add_up(totals([cau]), totals([split]))
    named = [c.assign(category=c["category"] + "/" + c["cause"]) for c in causes]
    return totals(results) | totals(named)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of fresh empty stores, one per hypothesis example, SQLite or PostgreSQL."""
    made: list[str] = []

    def make() -> str:
        if request.param == "sqlite":
            made.append(f"sqlite:///{tmp_path / f'store-{len(made)}.db'}")
            return made[-1]
        from pgserver import new_database_name

        server = request.getfixturevalue("pg_server")
        name = new_database_name()
        server.admin(f"CREATE DATABASE {name}")
        made.append(name)
        engine = make_engine(server.url(name))
        migrate.upgrade(engine)
        engine.dispose()
        return str(server.url(name))

    yield make
    if request.param == "postgresql":
        server = request.getfixturevalue("pg_server")
        for name in made:
            server.admin(f"DROP DATABASE {name} WITH (FORCE)")


def audit_splits(url: str, windows: list[Window]) -> list[int]:
    return [jobs.audit(url, window=w, thresholds=TH).run_id for w in windows]


@settings(
    max_examples=6,
    deadline=None,
    # `new_store` is a factory: each example makes its own store
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_split_audits_store_what_the_whole_audit_stores(
    new_store: Callable[[], str], data: st.DataObject
) -> None:
    case = data.draw(cases())
    windows = data.draw(splits(case.window))
    url = new_store()
    write_case(url, case)

    parts = stored(url, audit_splits(url, windows))
    whole = stored(url, audit_splits(url, [case.window]))

    assert_add_up(parts, whole, abs_s=PERIOD_TOLERANCE_S)


def test_a_notebook_idle_across_midnight_is_reserved_idle_in_the_dailies(
    db_url: str, engine: Engine
) -> None:
    """The case as reported: a notebook still running, idle from 23:40 to 00:20 (40 min,
    past `reserved_after`), audited day by day: both days call the stretch `reserved_idle`,
    as the audit of both days together does."""
    day = 86_400_000
    ts = np.arange(T0 - day, T0 + 2 * 3600_000, PERIOD_MS, dtype=np.int64)
    idle = (ts >= T0 - 20 * MINUTE) & (ts < T0 + 20 * MINUTE)
    samples = pd.DataFrame({"gpu": "GPU-nb", "ts_ms": ts, "util": np.where(idle, 0.0, 40.0)})
    case = Case(
        cards=("GPU-nb",),
        samples=samples.astype({"gpu": object}),
        pods=(Pod("nb-0", "nb-0", "GPU-nb", T0 - day + 5 * MINUTE, None, None),),
    )
    write_case(db_url, case)
    end = T0 + 2 * 3600_000
    dailies = stored(db_url, audit_splits(db_url, [Window(T0 - day, T0), Window(T0, end)]))
    both = stored(db_url, audit_splits(db_url, [Window(T0 - day, end)]))

    key = ("GPU-nb", "nb-0", "reserved_idle")
    assert both[key] == pytest.approx(40 * 60, abs=1)
    assert dailies.get(key, 0.0) == pytest.approx(both[key])
    assert_add_up(dailies, both)


# ----------------------------------------------------------------------------- hour buckets


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_hour_bucket_is_what_classifying_that_hour_alone_gives(data: st.DataObject) -> None:
    """SPEC §11: results stored per UTC hour serve any window of whole hours. Each bucket
    of a window (the edge ones clipped to it) is the classification of that bucket alone,
    and the buckets sum to the window's results."""
    from auditor.classify.hours import HOUR_MS, hour_buckets

    case = data.draw(cases())
    shift = data.draw(st.integers(0, 59)) * MINUTE + data.draw(st.integers(0, 59_999))
    window = Window(case.window.start_ms + shift, case.window.end_ms)
    gpus, pods, assignments = frames(case)
    tenures = build_tenures(pods, gpus, assignments, now_ms=window.end_ms + 15 * MINUTE)
    got = classify(case.samples, tenures, window=window, thresholds=TH, hour_ms=HOUR_MS)
    assert got.hourly is not None
    assert_add_up(totals([got.hourly]), totals([got.results]))
    buckets = hour_buckets(window)
    assert buckets[0].start_ms == window.start_ms
    assert buckets[-1].end_ms == window.end_ms
    for bucket in buckets:
        alone = classify(case.samples, tenures, window=bucket, thresholds=TH).results
        mine = got.hourly[got.hourly["hour_ms"] == bucket.start_ms]
        assert_add_up(totals([mine]), totals([alone]))
    # summed an hour at a time (as a long window of many tenures is), the same rows
    with mock.patch("auditor.classify.hours.CELLS", 1):
        hourly = classify(case.samples, tenures, window=window, thresholds=TH, hour_ms=HOUR_MS)
    assert hourly.hourly is not None
    pd.testing.assert_frame_equal(hourly.hourly, got.hourly)
