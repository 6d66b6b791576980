"""The Prometheus import's column path (`card_samples`) against the row-by-row join it
replaced: the same samples, holdings, utilisation sources and memory totals, or the same
one-line error, for random answers (series overlapping in time, repeated timestamps, NaN,
the same time in several series of a card, pods changing, bad values)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.collect.prometheus import BOUNDS, GPU_UTIL, GR_ENGINE, METRICS, read_chunk
from auditor.collect.prometheus.decode import COLUMNS, SLOT, matrix, reading
from auditor.errors import InputError
from auditor.model import GpuSample, Holding

T0 = 1_767_225_600
STEP_MS = 30_000
TEXTS = {
    "DCGM_FI_DEV_GPU_UTIL": ["0", "7", "100", "55.5", "NaN"],
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ["0.07", "0.5", "1", "NaN"],
    "DCGM_FI_DEV_FB_USED": ["1000", "2000.5", "NaN"],
    "DCGM_FI_DEV_FB_FREE": ["79000", "0"],
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ["0", "4", "32", "NaN"],
    "DCGM_FI_PROF_SM_ACTIVE": ["0.25", "1", "NaN"],
}
BAD = ["-1", "abc", "1e999", "101", "0.5e1"]  # refused somewhere (not all for every metric)


def reference(
    answers: dict[str, list[dict[str, Any]]],
) -> tuple[list[GpuSample], list[Holding], dict[str, tuple[str | None, float | None]]]:
    """What the row-by-row import made of these answers: a row of slots per GPU and time,
    filled metric by metric, a later point winning; holdings of consecutive held times."""
    rows: dict[str, dict[int, list[float | None]]] = {}
    held: dict[tuple[str, int], tuple[str, str]] = {}
    for metric, column in METRICS.items():
        slot = SLOT[column]
        low, high = BOUNDS.get(column, (0.0, 0.0))
        for series in answers.get(metric, []):
            labels, points = series["metric"], series["values"]
            if not points:
                continue
            uuid = labels["UUID"]
            times = rows.setdefault(uuid, {})
            holder = (labels["namespace"], labels["pod"]) if "pod" in labels else None
            for ts, text in points:
                ms = round(ts * 1000)
                row = times.setdefault(ms, [None] * len(COLUMNS))
                try:
                    value: float | None = float(text)
                except ValueError:
                    value = None
                if value is None or not low <= value <= high:
                    value = reading(text, metric=metric, column=column, labels=labels, ts=ts)
                row[slot] = value
                if holder is not None:
                    held[(uuid, ms)] = holder
    samples: list[GpuSample] = []
    gpus: dict[str, tuple[str | None, float | None]] = {}
    for uuid in sorted(rows):
        from_util = from_engine = 0
        total_seen: float | None = None
        for ms in sorted(rows[uuid]):
            v = dict(zip(COLUMNS, rows[uuid][ms], strict=True))
            util, engine = v["util"], v["gr_engine_active"]
            if util is None and engine is not None:
                util = round(engine * 100.0, 6)
                from_engine += 1
            elif util is not None:
                from_util += 1
            used, free, throttle = v["memory_used_mib"], v["memory_free_mib"], v["throttle_reasons"]
            total = used + free if used is not None and free is not None else None
            total_seen = total if total_seen is None else total_seen
            samples.append(
                GpuSample(
                    uuid, ms, util, used, total, v["power_w"], v["sm_clock_mhz"],
                    None if throttle is None else f"0x{int(throttle):016x}",
                    v["temperature_c"], v["sm_active"], v["tensor_active"], v["dram_active"],
                )
            )  # fmt: skip
        source = None
        if from_util or from_engine:
            source = GR_ENGINE if from_engine > from_util else GPU_UTIL
        gpus[uuid] = (source, total_seen)
    result: list[Holding] = []
    current: dict[str, Holding] = {}
    for (uuid, ts), (namespace, pod) in sorted(held.items()):
        h = current.get(uuid)
        if h is not None and (h.namespace, h.pod) == (namespace, pod) and ts - h.last_ms <= STEP_MS:
            current[uuid] = Holding(namespace, pod, uuid, h.first_ms, ts)
            continue
        if h is not None:
            result.append(h)
        current[uuid] = Holding(namespace, pod, uuid, ts, ts)
    return samples, result + list(current.values()), gpus


@st.composite
def answers(draw: st.DrawFn) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for metric in draw(st.lists(st.sampled_from(sorted(TEXTS)), min_size=1, max_size=6)):
        for _ in range(draw(st.integers(1, 3))):
            uuid = draw(st.sampled_from(["GPU-a", "GPU-b"]))
            labels = {"UUID": uuid, "gpu": "0", "Hostname": "dcgm-x", "kubernetes_node": "node-a"}
            pod = draw(st.sampled_from([None, "p1", "p2"]))
            if pod is not None:
                labels |= {"namespace": "ml", "pod": pod}
            texts = TEXTS[metric] + (BAD if draw(st.integers(0, 9)) == 0 else [])
            steps = draw(st.lists(st.integers(0, 12), max_size=10))
            if draw(st.booleans()):
                steps = sorted(set(steps))  # as Prometheus answers; else repeats, disorder
            jitter = draw(st.sampled_from([0.0, 0.0004, 0.0005, 0.001]))  # rounds to the ms
            values = [[T0 + 30 * k + jitter, draw(st.sampled_from(texts))] for k in steps]
            out.setdefault(metric, []).append({"metric": labels, "values": values})
    return out


def columns_path(answers: dict[str, list[dict[str, Any]]]) -> Any:
    def fetch(metric: str) -> Any:
        answer = {"data": {"resultType": "matrix", "result": list(answers.get(metric, []))}}
        return matrix(answer, metric)

    return read_chunk(
        None,  # type: ignore[arg-type]  # every series names its node: no query made
        first_ms=T0 * 1000,
        last_ms=T0 * 1000 + 12 * STEP_MS,
        step_ms=STEP_MS,
        fetch=fetch,
    )


@settings(max_examples=150, deadline=None)
@given(answers())
def test_the_columns_give_what_the_rows_gave(given_answers: dict[str, Any]) -> None:
    import copy

    try:
        expected = reference(copy.deepcopy(given_answers))
    except InputError as e:
        refused = e.message
    else:
        refused = None
    if refused is not None:
        with pytest.raises(InputError) as got:
            columns_path(given_answers)
        assert got.value.message == refused
        return
    samples, holdings, gpus = expected
    chunk = columns_path(given_answers)
    assert chunk.samples == samples
    assert chunk.holdings == holdings
    assert {u: (g.util_source, g.memory_total_mib) for u, g in chunk.gpus.items()} == gpus


@pytest.mark.parametrize("stamp", [1e13, -1e13, 10**23, 10**400])
def test_a_timestamp_past_any_clock_is_a_one_line_error(stamp: float) -> None:
    answer = {
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"UUID": "GPU-a"}, "values": [[T0, "1"], [stamp, "2"]]}],
        }
    }
    with pytest.raises(InputError) as e:
        list(matrix(answer, "DCGM_FI_DEV_GPU_UTIL"))
    assert "is not [timestamp, " in e.value.message
    assert "\n" not in e.value.message
