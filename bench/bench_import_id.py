"""What tagging each sample with its import costs: bytes per sample and nvidia-smi import time.

    PYTHONPATH=<tree> .venv/bin/python bench/bench_import_id.py [--cards 200] [--rows 2500]
        [--databases sqlite,postgresql] [--runs 2]

Imports one nvidia-smi log of CARDS x ROWS samples (`bench_nvidia_smi.write_log`) with
`jobs.import_nvidia_smi` into fresh stores, RUNS times, and prints the best time and the
bytes the samples table takes per sample (SQLite: its B-tree's pages, from `dbstat`;
PostgreSQL: `pg_total_relation_size`, heap and key index). Where the tree under PYTHONPATH
has the ledger (`gpu_samples.import_id`), the same rows are also written untagged, as the
sampler writes them (`bulk.write_columns` without an id). It uses only what both sides of
the change have, so running it under the tree before and the tree after (alternately, in
one shell command: the machines are shared) compares the two.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # pgserver; not the tree: PYTHONPATH's wins
sys.path.insert(0, str(HERE))

from bench_nvidia_smi import write_log  # noqa: E402 - after the path it lives on
from stores import stores  # noqa: E402


def table_bytes(url: str) -> int:
    from sqlalchemy import text

    from auditor.store.connection import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            query = "SELECT SUM(pgsize) FROM dbstat WHERE name LIKE '%gpu_samples'"
        else:  # freshly loaded: no dead rows to vacuum
            query = "SELECT pg_total_relation_size('gpu_samples')"
        size = int(conn.execute(text(query)).scalar_one())
    engine.dispose()
    return size


def untagged(url: str, path: Path) -> int:
    """The log's rows written as the sampler writes them (no import id): table bytes."""
    import numpy as np

    from auditor.collect.nvidia_smi import read_nvidia_smi_blocks
    from auditor.jobs import open_store
    from auditor.model import GpuRecord
    from auditor.store.bulk import Columns, write_columns
    from auditor.store.writes import upsert_gpus

    engine = open_store(url)
    ids: dict[str, int] = {}
    with engine.begin() as conn:
        for block in read_nvidia_smi_blocks(path, node="bench"):
            new: list[GpuRecord] = [g for g in block.records if g.uuid not in ids]
            ids.update(upsert_gpus(conn, new))
            gpu_of = np.array([ids[r.uuid] for r in block.records], np.int64)
            write_columns(conn, Columns(gpu_of[block.which], block.ts_ms, block.columns))
    engine.dispose()
    return table_bytes(url)


def earlier(url: str, count: int) -> None:
    """`count` empty ledger rows, so that the next import gets id `count + 1`."""
    from auditor.jobs import open_store
    from auditor.store import ledger  # type: ignore[attr-defined, unused-ignore]

    engine = open_store(url)
    with engine.begin() as conn:
        for _ in range(count):
            ledger.begin(conn, kind="bench", source="-", options={}, now_ms=0)
    engine.dispose()


def main() -> None:
    from auditor import jobs
    from auditor.store import bulk

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cards", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2500)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--import-id",
        type=int,
        default=1000,
        help="the id the import gets (ledger rows made before it): ids 0 and 1 take no "
        "bytes in a SQLite record, up to 127 one, up to 32767 two",
    )
    args = parser.parse_args()
    databases = args.databases.split(",")
    tagged = "import_id" in inspect.signature(bulk.write_columns).parameters
    print(f"tree: {Path(jobs.__file__).parents[2]} ({'with' if tagged else 'without'} import_id)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "node.csv"
        n = write_log(log, cards=args.cards, rows=args.rows)
        with stores(tmp, databases) as urls:
            for name in databases:
                times = []
                for run in range(args.runs):
                    url = urls[name](f"import_{name}_{run}")
                    if tagged:
                        earlier(url, args.import_id - 1)
                    started = time.perf_counter()
                    stats = jobs.import_nvidia_smi(url, log, node="bench")
                    times.append(time.perf_counter() - started)
                    assert stats.rows == n
                    assert getattr(stats, "import_id", None) in (None, args.import_id)
                size = table_bytes(url)
                line = (
                    f"{name}: {n:,} samples, import best of {args.runs} {min(times):.2f} s "
                    f"({', '.join(f'{t:.2f}' for t in times)}), {size / n:.2f} bytes/sample"
                )
                if tagged:
                    bare = untagged(urls[name](f"bare_{name}"), log)
                    line += f"; untagged (the sampler's rows) {bare / n:.2f} bytes/sample"
                print(line, flush=True)


if __name__ == "__main__":
    main()
