"""Fleet scale, stage by stage, on SQLite and PostgreSQL: ingest, floor read, audit, report.

    .venv/bin/python bench/bench_fleet.py [--fleets 100x1,1000x1] [--memory-days 1,3,7]
        [--memory-gpus 100] [--databases sqlite,postgresql] [--keep DIR] [--profile DIR]
        [--workers N]

For each fleet (GPUs x days at a 5 s period, `bench/fleet.py`) and database, in one run:
- ingest: every sample through the store's bulk write (`auditor.store.bulk`), a transaction
  per 500,000-row time slice, into the migrated schema; against the baseline of the same
  rows, converted the same way, by raw binary COPY into an unindexed table (PostgreSQL) or a
  plain executemany of INSERT into an unindexed table (SQLite);
- floor: a plain read of the window's samples (the columns `read_card_samples` gives the
  audit: ts_ms, util, throttle_reasons, sm_active, and gpu_id to tell cards apart), fetched
  through the driver and dropped: the time just to get the rows the audit needs;
- audit: `jobs.audit` over the window, with its worker processes as `auditor audit` picks
  them (`--workers N` to set; its peak memory is this process's, and the largest worker's
  beside it); report: `jobs.build_report` by team.
Each stage runs in its own process, so its peak resident memory is its own. Then the
audit's peak memory for 1, 3 and 7 days of `--memory-gpus` GPUs (SQLite; the window is
the whole data). PostgreSQL is a throwaway server started as the tests start theirs.
Prints figures and ratios from one run: the machines are shared, so compare within a run.

`--keep DIR`: the fleets' stores live in DIR (SQLite files, the PostgreSQL server's data)
and outlast the run; a later run with the same DIR reuses a fleet's store and its ingest
figures (printed as kept) rather than loading it again, so floor, audit and report can be
measured again and again on a 17-million-sample fleet. `--profile DIR`: the audit stage
runs under cProfile, its stats written to DIR/<fleet>.prof (the audit's time then includes
the profiler's overhead: measure ratios without it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from stores import kept_stores  # noqa: E402 - after the path it lives on

STAGES = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[4])
from fleet import make_fleet, sample_batches
from auditor.allocator import keep_freed_memory

keep_freed_memory()  # every stage's process asks glibc for memory as `auditor`'s commands do

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def workers_mib():  # the largest worker process's peak (the audit's, where it used any)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

def load(url, gpus, days, baseline=True):
    from auditor.store import bulk
    from auditor.store.connection import make_engine
    from auditor.store.writes import upsert_assignments, upsert_gpus
    from auditor.store.pod_writes import upsert_pods
    fleet = make_fleet(gpus=gpus, days=days)
    engine = make_engine(url)
    with engine.begin() as conn:
        ids = upsert_gpus(conn, fleet.gpus)
        upsert_pods(conn, fleet.pods)
        by_uid = {p.uid: p for p in fleet.pods}
        upsert_assignments(conn, [(uid, ids[card], by_uid[uid].bound_ms)
                                  for uid, card in fleet.assignments], source="pod-resources")
    ingest = raw = generate = 0.0
    samples = 0
    sqlite = url.startswith("sqlite")
    raw_url = url.replace(".db", "-raw.db") if sqlite else url
    raw_engine = make_engine(raw_url)
    cols = ", ".join(bulk.ROW_COLUMNS)
    decl = ("gpu_id INTEGER, ts_ms BIGINT, util FLOAT, memory_used_mib FLOAT, "
            "memory_total_mib FLOAT, power_w FLOAT, sm_clock_mhz FLOAT, "
            "throttle_reasons VARCHAR(64), temperature_c FLOAT, sm_active FLOAT, "
            "tensor_active FLOAT, dram_active FLOAT")
    with raw_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE bench_raw ({decl})")
    t = time.perf_counter()
    for frame in sample_batches(fleet, ids):
        generate += time.perf_counter() - t
        t = time.perf_counter()
        with engine.begin() as conn:
            rows, spans, repeats = bulk.frame_rows(frame)
            bulk.write_rows(conn, rows, spans=spans, repeats=repeats)
        ingest += time.perf_counter() - t
        t = time.perf_counter()
        with raw_engine.begin() as conn:
            rows, _, _ = bulk.frame_rows(frame) if baseline else ([], None, None)
            cur = conn.connection.driver_connection.cursor()
            if sqlite:
                marks = ", ".join("?" * len(bulk.ROW_COLUMNS))
                cur.executemany(f"INSERT INTO bench_raw ({cols}) VALUES ({marks})", rows)
            else:
                with cur.copy(f"COPY bench_raw ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(bulk._PG_TYPES)
                    for row in rows:
                        copy.write_row(row)
            cur.close()
        raw += time.perf_counter() - t
        samples += len(frame)
        del rows, frame
        t = time.perf_counter()
    with raw_engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE bench_raw")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if sqlite:
            size = conn.exec_driver_sql(
                "SELECT SUM(pgsize) FROM dbstat WHERE name = 'gpu_samples'"
                " OR name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'gpu_samples')"
            ).scalar()
        else:
            conn.exec_driver_sql("VACUUM ANALYZE gpu_samples")
            size = conn.exec_driver_sql("SELECT pg_total_relation_size('gpu_samples')").scalar()
    return {"samples": samples, "ingest_s": ingest, "raw_s": raw, "generate_s": generate,
            "bytes": int(size), "start_ms": fleet.start_ms, "end_ms": fleet.end_ms,
            "pods": len(fleet.pods)}

def floor(url, start_ms, end_ms, profile=None):
    from auditor.store.connection import make_engine
    engine = make_engine(url)
    t = time.perf_counter()
    rows = 0
    with engine.connect() as conn:
        cur = conn.connection.driver_connection.cursor()
        mark = "?" if url.startswith("sqlite") else "%s"
        cur.execute("SELECT gpu_id, ts_ms, util, throttle_reasons, sm_active"
                    f" FROM gpu_samples WHERE ts_ms >= {mark} AND ts_ms < {mark}"
                    " ORDER BY gpu_id, ts_ms",
                    (start_ms, end_ms))
        while batch := cur.fetchmany(200_000):
            rows += len(batch)
        cur.close()
    return {"rows": rows, "seconds": time.perf_counter() - t}

def audit(url, start_ms, end_ms, profile=None, workers=None):
    from auditor import jobs
    from auditor.settings import Thresholds
    import auditor.classify.pipeline, auditor.classify.tenures, auditor.store.reads  # noqa: F401
    import auditor.store.writes  # noqa: F401  (imports are start-up, not audit, time)
    if profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    t = time.perf_counter()
    stats = jobs.audit(url, window=(start_ms, end_ms), thresholds=Thresholds(), workers=workers)
    seconds = time.perf_counter() - t
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    return {"seconds": seconds, "samples": stats.samples, "gpus": stats.gpus}

def report(url, start_ms, end_ms, profile=None):
    from auditor import jobs
    from auditor.report.summary import GroupBy
    t = time.perf_counter()
    jobs.build_report(url, start_ms=start_ms, end_ms=end_ms, by=GroupBy.TEAM, team=None)
    return {"seconds": time.perf_counter() - t}

stage, url, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {"load": load, "floor": floor, "audit": audit, "report": report}[stage](url, *args)
out["peak_mib"] = peak_mib()
out["workers_mib"] = workers_mib()
print(json.dumps(out))
"""


def stage(name: str, url: str, *args: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", STAGES, name, url, json.dumps(args), str(ROOT / "bench")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"stage {name} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_fleet(
    gpus: int,
    days: float,
    url: str,
    name: str,
    *,
    load: dict[str, Any] | None = None,
    profile: Path | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Every stage on a new store at `url`; with `load` (an earlier run's figures), on the
    store that run loaded there. Returns the load's figures."""
    kept = load is not None
    if load is None:
        load = stage("load", url, gpus, days)
    n = load["samples"]
    window = (load["start_ms"], load["end_ms"])
    floor = stage("floor", url, *window)
    audit = stage("audit", url, *window, str(profile) if profile else None, workers)
    report = stage("report", url, *window)
    base = "raw COPY, unindexed" if name == "postgresql" else "plain executemany, unindexed"
    print(f"\n{name}: {gpus} GPUs x {days:g} d = {n:,} samples, {load['pods']:,} pods")
    if kept:
        print("  (store and ingest figures kept from an earlier run)")
    print(
        f"  ingest  {load['ingest_s']:7.1f} s  {n / load['ingest_s']:>10,.0f} samples/s"
        f"   peak {load['peak_mib']:,.0f} MiB (generator included)"
    )
    print(f"  {base}: {load['raw_s']:.1f} s  {n / load['raw_s']:,.0f} samples/s")
    print(f"  ingest / baseline throughput: {load['raw_s'] / load['ingest_s']:.0%}")
    print(f"  on disk: {load['bytes'] / n:.1f} bytes per sample (table + indexes)")
    print(
        f"  floor   {floor['seconds']:7.1f} s  {floor['rows']:,} rows"
        f"  peak {floor['peak_mib']:,.0f} MiB"
    )
    print(
        f"  audit   {audit['seconds']:7.1f} s  {audit['samples']:,} samples"
        f"  peak {audit['peak_mib']:,.0f} MiB"
        + (f", each worker at most {audit['workers_mib']:,.0f} MiB" if audit["workers_mib"] else "")
        + f"   audit / floor: {audit['seconds'] / floor['seconds']:.2f}x"
    )
    print(f"  report  {report['seconds']:7.1f} s  peak {report['peak_mib']:,.0f} MiB")
    if profile:
        print(f"  audit profile: {profile} (the audit's time includes the profiler's)")
    sys.stdout.flush()
    return load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fleets", default="100x1,1000x1", help="GPUSxDAYS, comma-separated")
    parser.add_argument("--memory-days", default="1,3,7")
    parser.add_argument("--memory-gpus", type=int, default=100)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--keep", type=Path, help="keep and reuse the fleets' stores here")
    parser.add_argument("--profile", type=Path, help="cProfile the audit, stats written here")
    parser.add_argument(
        "--workers", type=int, help="the audit's worker processes (default: as `auditor audit`)"
    )
    args = parser.parse_args()
    databases = args.databases.split(",")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = args.keep.resolve()
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        ledger = tmp / "loaded.json"
        loaded: dict[str, dict[str, Any]] = (
            json.loads(ledger.read_text()) if args.keep and ledger.exists() else {}
        )
        with kept_stores(tmp, databases, keep=bool(args.keep)) as (make_url, kept_url):
            for spec in filter(None, args.fleets.split(",")):
                gpus, days = spec.split("x")
                for name in databases:
                    label = f"f{gpus}x{days.replace('.', '_')}_{name}"
                    url = kept_url[name](label) if label in loaded else None
                    profile = args.profile / f"{label}.prof" if args.profile else None
                    if url is None:
                        loaded.pop(label, None)
                        url = make_url[name](label)
                    loaded[label] = run_fleet(
                        int(gpus),
                        float(days),
                        url,
                        name,
                        load=loaded.get(label),
                        profile=profile,
                        workers=args.workers,
                    )
                    if args.keep:
                        ledger.write_text(json.dumps(loaded, indent=1))
            peaks: list[tuple[float, float]] = []
            for days in filter(None, args.memory_days.split(",")):
                url = make_url["sqlite"](f"m{days}")
                load = stage("load", url, args.memory_gpus, float(days), False)
                audit = stage("audit", url, load["start_ms"], load["end_ms"])
                peaks.append((float(days), audit["peak_mib"]))
                print(
                    f"\nmemory: {args.memory_gpus} GPUs x {days} d ({load['samples']:,} samples):"
                    f" audit peak {audit['peak_mib']:,.0f} MiB in {audit['seconds']:.1f} s"
                )
                Path(url.removeprefix("sqlite:///")).unlink()
            if len(peaks) > 1:
                first = peaks[0]
                for days, peak in peaks[1:]:
                    print(
                        f"  {days:g} d / {first[0]:g} d audit peak memory: {peak / first[1]:.2f}x"
                    )


if __name__ == "__main__":
    main()
