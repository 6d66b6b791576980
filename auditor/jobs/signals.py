"""Store SPEC §10's signal rows given directly: what the demo computed from its simulated
exporters' counters, where no Prometheus runs (`import prometheus` reads the same series
from a real one)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from auditor.errors import InputError
from auditor.jobs.common import open_store

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SignalStoreStats:
    pod_rows: int
    card_rows: int


def _value(v: Any) -> float | None:
    """A reading, None where the source gave none (NaN)."""
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def store_signal_rows(
    url: str, pod_rows: pd.DataFrame, card_rows: pd.DataFrame
) -> SignalStoreStats:
    """Store pod signal rows (pod_uid, source, ts_ms and the pod signals) and card signal
    rows (gpu_uuid, ts_ms and the card signals); other columns are ignored. Cards must have
    been imported (their samples name them)."""
    from auditor.classify.causes import CARD_SIGNALS, POD_SIGNALS
    from auditor.store.reads import read_gpus
    from auditor.store.signals import write_card_signals, write_pod_signals

    engine = open_store(url)
    with engine.begin() as conn:
        known = read_gpus(conn)
        ids = dict(zip(known["uuid"].astype(str), known["id"], strict=True))
        pods = [
            {"pod_uid": str(r["pod_uid"]), "source": str(r["source"]), "ts_ms": int(r["ts_ms"])}
            | {c: _value(r[c]) for c in POD_SIGNALS}
            for r in pod_rows.to_dict("records")
        ]
        cards = []
        for r in card_rows.to_dict("records"):
            gpu = ids.get(str(r["gpu_uuid"]))
            if gpu is None:
                raise InputError(f"no GPU {r['gpu_uuid']} in the database", field="gpu_uuid")
            cards.append(
                {"gpu_id": int(gpu), "ts_ms": int(r["ts_ms"])}
                | {c: _value(r[c]) for c in CARD_SIGNALS}
            )
        return SignalStoreStats(write_pod_signals(conn, pods), write_card_signals(conn, cards))
