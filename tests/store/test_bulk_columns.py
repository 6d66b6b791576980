"""`bulk.write_columns`, the import's hot path: it stores exactly what `write_rows` of the
same rows as tuples stores, NULLs and text included, whichever path a batch takes (direct
COPY, the merge after a collision, SQLite's executemany), and counts the rows newly stored."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Engine, select

from auditor.store import bulk
from auditor.store.schema import gpu_samples


def _batch(n: int, *, seed: int) -> bulk.Columns:
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray[Any, Any]] = {}
    for name in bulk.SAMPLE_COLUMNS:
        if name == "dram_active":
            continue  # a column the batch lacks: NULL
        if name == "throttle_reasons":
            texts = np.array([None, "0x0000000000000001", "0x4", ""], dtype=object)
            values[name] = texts[rng.integers(0, 4, n)]
            continue
        column = rng.random(n) * 100
        column[rng.random(n) < 0.3] = np.nan
        values[name] = column
    gpu = rng.integers(1, 4, n).astype(np.int64)
    ts = np.arange(n, dtype=np.int64) * 1000 + 1_700_000_000_000
    return bulk.Columns(gpu, ts, values)


def _part(batch: bulk.Columns, part: slice) -> bulk.Columns:
    return bulk.Columns(
        batch.gpu_id[part], batch.ts_ms[part], {k: v[part] for k, v in batch.values.items()}
    )


def _stored(engine: Engine, *, tag: bool = False) -> list[tuple[Any, ...]]:
    """The samples in `ROW_COLUMNS` order, then (`tag`) the import that wrote each."""
    columns = [gpu_samples.c[c] for c in bulk.ROW_COLUMNS]
    if tag:
        columns.append(gpu_samples.c.import_id)
    with engine.connect() as conn:
        query = select(*columns).order_by(gpu_samples.c.gpu_id, gpu_samples.c.ts_ms)
        return [tuple(r) for r in conn.execute(query)]


def test_every_path_tags_the_rows_it_stores_and_only_those(engine: Engine) -> None:
    """Import 5 appends (direct COPY), import 6 overlaps it (the merge), import 7 comes as
    tuples over both, the sampler's rows carry none: each stored row names its writer, and
    a key stored already keeps the import that wrote it."""
    batch = _batch(4000, seed=2)
    rows = list(batch.rows())
    with engine.begin() as conn:
        assert bulk.write_columns(conn, _part(batch, slice(0, 1000)), import_id=5) == 1000
        assert bulk.write_columns(conn, _part(batch, slice(500, 2000)), import_id=6) == 1000
        spans, repeats = bulk.object_spans(rows[:3000])
        stored = bulk.write_rows(conn, rows[:3000], spans=spans, repeats=repeats, import_id=7)
        assert stored == 1000
        spans, repeats = bulk.object_spans(rows[3000:])
        assert bulk.write_rows(conn, rows[3000:], spans=spans, repeats=repeats) == 1000
    tags = {r[:2]: r[-1] for r in _stored(engine, tag=True)}
    expected = [5] * 1000 + [6] * 1000 + [7] * 1000 + [None] * 1000
    assert [tags[r[:2]] for r in rows] == expected
    assert _stored(engine) == sorted(rows)


def test_columns_store_what_tuples_store_on_every_path(engine: Engine) -> None:
    batch = _batch(3000, seed=1)
    with engine.begin() as conn:
        first = bulk.write_columns(conn, _part(batch, slice(0, 1000)))  # appending: direct
        again = bulk.write_columns(conn, _part(batch, slice(0, 3000)))  # overlaps: merge
    assert (first, again) == (1000, 2000)
    stored = _stored(engine)
    rows = list(batch.rows())
    assert stored == sorted(rows)
    assert any(r[2] is None for r in stored)
    assert any(r[7] == "" for r in stored)
    assert all(r[11] is None for r in stored)  # the column the batch lacks
    with engine.begin() as conn:
        assert bulk.write_columns(conn, batch) == 0  # a replay stores nothing new
    assert _stored(engine) == stored


def test_a_key_twice_in_one_batch_is_stored_once(engine: Engine) -> None:
    batch = _batch(10, seed=2)
    twice = bulk.Columns(
        np.concatenate([batch.gpu_id, batch.gpu_id[:3]]),
        np.concatenate([batch.ts_ms, batch.ts_ms[:3]]),
        {k: np.concatenate([v, v[:3]]) for k, v in batch.values.items()},
    )
    spans, repeats = twice.spans()
    assert repeats
    assert spans == {
        g: (int(batch.ts_ms[batch.gpu_id == g].min()), int(batch.ts_ms[batch.gpu_id == g].max()))
        for g in set(batch.gpu_id.tolist())
    }
    with engine.begin() as conn:
        assert bulk.write_columns(conn, twice) == 10
    assert len(_stored(engine)) == 10
