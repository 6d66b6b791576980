"""A sharded audit (`--shard i/N`, by node) stores exactly what one unsharded run stores."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from auditor import jobs
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate
from auditor.store import migrate, reads

KEY = ["gpu", "pod_uid", "category"]


def stored(url: str, run_ids: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        results = reads.read_results(conn, run_ids)
        findings = reads.read_findings(conn, run_ids)
    engine.dispose()
    res = results.groupby(KEY, dropna=False)["seconds"].sum().reset_index()
    res["pod_uid"] = res["pod_uid"].astype(object).where(res["pod_uid"].notna(), None)
    cols = ["kind", "gang", "gpu", "pod_uid", "start_ms", "end_ms", "seconds", "detail"]
    fnd = findings[cols].sort_values(cols[:6], na_position="first").reset_index(drop=True)
    return res.sort_values(KEY, na_position="first").reset_index(drop=True), fnd


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_add_up_to_one_unsharded_run(db_url: str, tmp_path: Path, shards: int) -> None:
    migrate.upgrade(db_url)
    sim = simulate(tmp_path / "c", scenario=SCENARIOS["small"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(db_url, path, node=node)
    jobs.import_pods(db_url, sim.pods_json, config=Config())
    window = (sim.window_start_ms, sim.window_end_ms)
    whole = jobs.audit(db_url, window=window, thresholds=Thresholds())
    expected_results, expected_findings = stored(db_url, [whole.run_id])
    # the distributed jobs of this scenario span nodes, so some gangs span shards
    nodes = {jobs.shard_of(n, shards) for n in sim.node_csvs}
    assert len(nodes) > 1
    ids = [jobs.audit(db_url, window=window, thresholds=Thresholds(), shard=(i, shards)).run_id
           for i in range(shards)]  # fmt: skip
    got_results, got_findings = stored(db_url, ids)
    pd.testing.assert_frame_equal(
        got_results, expected_results, check_exact=False, rtol=1e-9, check_dtype=False
    )
    pd.testing.assert_frame_equal(got_findings, expected_findings, check_dtype=False)
    # the report reads the complete set of shards, and the unsharded run is gone
    report = jobs.build_report(db_url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    assert report.totals["capacity_gpu_hours"] == pytest.approx(
        expected_results["seconds"].sum() / 3600, rel=1e-9
    )


def test_chunked_audit_equals_one_chunk(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    sim = simulate(tmp_path / "c", scenario=SCENARIOS["small"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    window = (sim.window_start_ms, sim.window_end_ms)
    one = jobs.audit(
        url, window=window, thresholds=Thresholds(), chunk_samples=10**12, min_chunks=1
    )
    expected = stored(url, [one.run_id])
    # a node per chunk (the budget is below one node): the distributed jobs' gangs are
    # split across chunks
    per_node = jobs.audit(url, window=window, thresholds=Thresholds(), chunk_samples=1)
    got = stored(url, [per_node.run_id])
    pd.testing.assert_frame_equal(got[0], expected[0], check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(got[1], expected[1], check_dtype=False)
    assert per_node.samples == one.samples  # context cards are read, not counted, twice


def test_chunked_audit_splits_free_time_as_one_chunk(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    window = load_waiting(url, tmp_path)
    one = jobs.audit(
        url, window=window, thresholds=Thresholds(), chunk_samples=10**12, min_chunks=1
    )
    one_causes = causes(url, one.run_id)  # read before the next run of the window replaces it
    assert one_causes.loc[("unallocated", "blocked")] > 0
    one_rows = cause_rows(url, [one.run_id])
    # a node per chunk: pods waited while cards sat free on other nodes, so a chunk that
    # matched the waiting demand against its own free cards alone over-counted `blocked`
    per_node = jobs.audit(url, window=window, thresholds=Thresholds(), chunk_samples=1)
    pd.testing.assert_series_equal(
        causes(url, per_node.run_id), one_causes, check_exact=False, rtol=1e-9
    )
    # and card by card: each card's free time is split as in one pass
    pd.testing.assert_frame_equal(
        cause_rows(url, [per_node.run_id]), one_rows, check_exact=False, rtol=1e-9
    )


def test_shards_split_free_time_as_one_run_once_the_last_is_stored(
    db_url: str, tmp_path: Path
) -> None:
    """Pods waited while cards sat free on other shards' nodes: each shard alone would
    share the waiting demand among its own free cards. The shard that completes the
    window's set splits every shard's free time at once, in whichever order they ran."""
    window = load_waiting(db_url, tmp_path)
    whole = jobs.audit(db_url, window=window, thresholds=Thresholds())
    expected = cause_rows(db_url, [whole.run_id])
    assert expected.query("cause == 'blocked'")["seconds"].sum() > 0
    shards = 3

    def audit(i: int) -> int:
        return jobs.audit(db_url, window=window, thresholds=Thresholds(), shard=(i, shards)).run_id

    ids = {i: audit(i) for i in (2, 0)}
    alone = cause_rows(db_url, list(ids.values()))  # two of three: each split its own
    ids[1] = audit(1)
    got = cause_rows(db_url, list(ids.values()))
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-9)
    # the first two alone had counted more of their cards' free time blocked
    assert blocked(alone) > 1.01 * blocked(got[got["gpu"].isin(alone["gpu"])])
    ids[0] = audit(0)  # one shard again: the set is complete, and split again
    again = cause_rows(db_url, list(ids.values()))
    pd.testing.assert_frame_equal(again, expected, check_exact=False, rtol=1e-9)


def test_shards_run_at_once_split_free_time_as_one_run(db_url: str, tmp_path: Path) -> None:
    """As an Indexed Job runs them: every shard at once. They take turns on the window's
    write lock, so whichever stores its run last sees every other's and splits them all."""
    window = load_waiting(db_url, tmp_path)
    expected = cause_rows(
        db_url, [jobs.audit(db_url, window=window, thresholds=Thresholds()).run_id]
    )

    def audit(i: int) -> int:
        return jobs.audit(db_url, window=window, thresholds=Thresholds(), shard=(i, 3)).run_id

    with ThreadPoolExecutor(max_workers=3) as pool:
        ids = list(pool.map(audit, range(3)))
    pd.testing.assert_frame_equal(cause_rows(db_url, ids), expected, check_exact=False, rtol=1e-9)


def load_waiting(url: str, tmp: Path) -> tuple[int, int]:
    """The demo scenario stored, with the pods that waited for GPUs and the cordoned node:
    its window."""
    migrate.upgrade(url)
    sim = simulate(tmp / "c", scenario=SCENARIOS["demo"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    for pods in (sim.pods_json, sim.watch_json, sim.nodes_json):
        if pods is not None:
            jobs.import_pods(url, pods, config=Config())
    return sim.window_start_ms, sim.window_end_ms


def cause_rows(url: str, run_ids: list[int]) -> pd.DataFrame:
    """Runs' cause rows per card, pod, category and cause, in key order."""
    from auditor.store.signals import read_causes

    engine = jobs.open_store(url)
    with engine.connect() as conn:
        rows = read_causes(conn, run_ids)
    engine.dispose()
    keys = ["gpu", "pod_uid", "category", "cause"]
    summed = rows.groupby(keys, dropna=False)[["seconds", "signalled_seconds"]].sum()
    return summed.reset_index().sort_values(keys).reset_index(drop=True)


def blocked(rows: pd.DataFrame) -> float:
    return float(rows.loc[rows["cause"] == "blocked", "seconds"].sum())


def causes(url: str, run_id: int) -> pd.Series:
    """Seconds per (category, cause) of a run's cause rows."""
    from auditor.store.signals import read_causes

    engine = jobs.open_store(url)
    with engine.connect() as conn:
        rows = read_causes(conn, [run_id])
    engine.dispose()
    return rows.groupby(["category", "cause"])["seconds"].sum()
