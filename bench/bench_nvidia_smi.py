"""nvidia-smi CSV import speed, on SQLite and PostgreSQL: parse, end to end, bulk baseline.

    .venv/bin/python bench/bench_nvidia_smi.py [--cards 1000] [--rows 10000]
        [--databases sqlite,postgresql] [--cli-rows 70000] [--repeat 3]

Writes one nvidia-smi log of CARDS x ROWS samples (`--query-gpu=timestamp,name,uuid,index,
utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm`, with units,
every card every 5 s), then for each database, in one run:
- parse: `read_nvidia_smi_blocks` over the file, blocks dropped: parsing alone;
- import: `jobs.import_nvidia_smi` into a fresh migrated store: end to end, one transaction
  (`--repeat` times, alternating with the keyed floor; the best of each is printed);
- baseline: the same rows, prepared beforehand as the store's input (`bulk.Columns`), by
  `bulk.write_columns` into another fresh store: what the store alone costs, against which
  the import's throughput is a ratio; and as tuples by `bulk.write_rows` (the generic path);
- keyed floor (SQLite): the same rows as plain tuples (GPU id, time and the log's values),
  one plain `sqlite3` `executemany` per block into a table keyed (GPU, time) `WITHOUT
  ROWID`, one transaction, the store's journal settings: what any importer pays SQLite;
- cli: `auditor import nvidia-smi` of a CLI_ROWS-row file as a subprocess (a fresh process of
  this tree's code, SQLite): wall time including process start.
PostgreSQL is a throwaway server started as the tests start theirs. Prints figures and ratios
from one run: the machines are shared, so compare within a run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stores import stores  # noqa: E402 - after the path it lives on

HEADER = (
    "timestamp, name, uuid, index, utilization.gpu [%], memory.used [MiB], "
    "memory.total [MiB], power.draw [W], temperature.gpu, clocks.sm [MHz]\n"
)


def write_log(path: Path, *, cards: int, rows: int) -> int:
    """CARDS cards sampled ROWS times, 5 s apart, in nvidia-smi's csv format."""
    import datetime as dt

    start = dt.datetime(2026, 6, 24)
    uuids = [f"GPU-{c:08x}-1c2d-4e5f-8a9b-{c * 7919 % 16**12:012x}" for c in range(cards)]
    with path.open("w") as out:
        out.write(HEADER)
        for r in range(rows):
            stamp = (start + dt.timedelta(seconds=5 * r)).strftime("%Y/%m/%d %H:%M:%S")
            out.writelines(
                f"{stamp}.{(c * 3) % 1000:03d}, NVIDIA H100 80GB HBM3, {uuids[c]}, {c % 8}, "
                f"{(r + c) % 101} %, {(r * 37 + c) % 81559} MiB, 81559 MiB, "
                f"{(r + c) % 700}.{c % 100:02d} W, {30 + (r + c) % 50}, {1980 - c % 400} MHz\n"
                for c in range(cards)
            )
    return cards * rows


def parse_only(path: Path) -> float:
    from auditor.collect.nvidia_smi import read_nvidia_smi_blocks

    started = time.perf_counter()
    for _ in read_nvidia_smi_blocks(path, node="bench"):
        pass
    return time.perf_counter() - started


CPU: list[float] = []
"""The CPU seconds (this process, all threads) of each `end_to_end` and `keyed_floor`, in
the order run: less swayed than wall time by other work on a shared machine."""


def end_to_end(url: str, path: Path) -> float:
    from auditor import jobs

    cpu = time.process_time()
    started = time.perf_counter()
    stats = jobs.import_nvidia_smi(url, path, node="bench")
    assert stats.already == 0
    seconds = time.perf_counter() - started
    CPU.append(time.process_time() - cpu)
    return seconds


def baseline(url: str, path: Path, *, tuples: bool = False) -> float:
    """Rows prepared first (as `bulk.Columns`, or as tuples); only the write is timed."""
    import numpy as np

    from auditor.collect.nvidia_smi import read_nvidia_smi_blocks
    from auditor.jobs.common import open_store
    from auditor.store.bulk import Columns, write_columns, write_rows
    from auditor.store.writes import upsert_gpus

    engine = open_store(url)
    prepared = []
    with engine.begin() as conn:
        ids: dict[str, int] = {}
        for block in read_nvidia_smi_blocks(path, node="bench"):
            ids.update(upsert_gpus(conn, [r for r in block.records if r.uuid not in ids]))
            gpu_of = np.array([ids[r.uuid] for r in block.records], np.int64)
            batch = Columns(gpu_of[block.which], block.ts_ms, block.columns)
            prepared.append((batch, (list(batch.rows()), *batch.spans()) if tuples else None))
    started = time.perf_counter()
    with engine.begin() as conn:
        for batch, as_rows in prepared:
            if as_rows is None:
                write_columns(conn, batch)
            else:
                rows, spans, repeats = as_rows
                write_rows(conn, rows, spans=spans, repeats=repeats)
    seconds = time.perf_counter() - started
    engine.dispose()
    return seconds


def keyed_floor(path: Path, log: Path) -> float:
    """A plain executemany of the log's rows into a (gpu_id, ts_ms)-keyed WITHOUT ROWID
    table: rows prepared first as tuples, only the inserts and the commit timed."""
    import sqlite3

    import numpy as np

    from auditor.collect.nvidia_smi import read_nvidia_smi_blocks

    ids: dict[str, int] = {}
    blocks: list[list[tuple[object, ...]]] = []
    names: list[str] = []
    for block in read_nvidia_smi_blocks(log, node="bench"):
        for r in block.records:
            ids.setdefault(r.uuid, len(ids) + 1)
        gpu_of = np.array([ids[r.uuid] for r in block.records], np.int64)
        names = [n for n in block.columns if block.columns[n].dtype.kind == "f"]
        columns = [gpu_of[block.which].tolist(), block.ts_ms.tolist()]
        columns += [block.columns[n].tolist() for n in names]
        blocks.append(list(zip(*columns, strict=True)))
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    fields = ", ".join(f"{n} FLOAT" for n in names)
    db.execute(
        f"CREATE TABLE samples (gpu_id INTEGER NOT NULL, ts_ms BIGINT NOT NULL, {fields}, "
        "PRIMARY KEY (gpu_id, ts_ms)) WITHOUT ROWID"
    )
    insert = f"INSERT INTO samples VALUES ({', '.join('?' * (2 + len(names)))})"
    cpu = time.process_time()
    started = time.perf_counter()
    db.execute("BEGIN")
    for rows in blocks:
        db.executemany(insert, rows)
    db.execute("COMMIT")
    seconds = time.perf_counter() - started
    CPU.append(time.process_time() - cpu)
    db.close()
    return seconds


def cli_wall(tmp: Path, rows: int) -> float:
    path = tmp / "node-cli.csv"
    write_log(path, cards=8, rows=rows // 8)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    db = f"sqlite:///{tmp / 'cli.db'}"
    command = [sys.executable, "-c", "from auditor.cli import main; main()",
               "--db", db, "import", "nvidia-smi", str(path)]  # fmt: skip

    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def cli_walls(tmp: Path, rows: int, *, runs: int = 3) -> list[float]:
    """`cli_wall` a few times, each into a fresh store (the machine's load varies)."""
    walls = []
    for _ in range(runs):
        for stale in tmp.glob("cli.db*"):
            stale.unlink()
        walls.append(cli_wall(tmp, rows))
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cards", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--cli-rows", type=int, default=70_000)
    parser.add_argument("--repeat", type=int, default=3, help="imports and floors; best of each")
    args = parser.parse_args()
    databases = args.databases.split(",")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "node.csv"
        started = time.perf_counter()
        n = write_log(log, cards=args.cards, rows=args.rows)
        print(f"log: {n:,} samples, {log.stat().st_size / 2**20:,.0f} MiB, "
              f"written in {time.perf_counter() - started:.0f} s")  # fmt: skip
        parse_s = parse_only(log)
        print(f"parse:    {parse_s:6.1f} s  {n / parse_s:,.0f} samples/s")
        with stores(tmp, databases) as urls:
            for name in databases:
                imports, floors = [], []
                CPU.clear()
                for run in range(args.repeat):  # alternating, best of each: a shared machine
                    imports.append(end_to_end(urls[name](f"import_{name}_{run}"), log))
                    if name == "sqlite":
                        floors.append(keyed_floor(tmp / f"floor-{run}.db", log))
                import_s = min(imports)
                base_s = baseline(urls[name](f"base_{name}"), log)
                rows_s = baseline(urls[name](f"rows_{name}"), log, tuples=True)
                print(f"\n{name}:")
                rate = f"{n / import_s:,.0f}"
                print(f"  import:   {import_s:6.1f} s  {rate} samples/s end to end")
                print(f"  baseline: {base_s:6.1f} s  {n / base_s:,.0f} samples/s write_columns")
                print(f"  tuples:   {rows_s:6.1f} s  {n / rows_s:,.0f} samples/s write_rows")
                print(f"  import / baseline throughput: {base_s / import_s:.0%}")
                if floors:
                    floor_s = min(floors)
                    print(f"  floor:    {floor_s:6.1f} s  {n / floor_s:,.0f} samples/s plain "
                          "executemany, keyed WITHOUT ROWID")  # fmt: skip
                    print(f"  import / keyed floor throughput: {floor_s / import_s:.0%} "
                          f"(imports {', '.join(f'{x:.2f}' for x in imports)} s; floors "
                          f"{', '.join(f'{x:.2f}' for x in floors)} s; best of each)")  # fmt: skip
                    cpu_import, cpu_floor = min(CPU[0::2]), min(CPU[1::2])
                    print(f"  CPU seconds: import {cpu_import:.2f}, floor {cpu_floor:.2f}: "
                          f"import / keyed floor {cpu_floor / cpu_import:.0%} (best of each)"
                          )  # fmt: skip
        walls = ", ".join(f"{w:.2f}" for w in cli_walls(tmp, args.cli_rows))
        print(f"\ncli: auditor import nvidia-smi of {args.cli_rows:,} rows: {walls} s wall")


if __name__ == "__main__":
    main()
