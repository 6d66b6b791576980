"""The rest of what nvidia-smi prints, derived from utilisation: power, clocks, heat, reasons.

An H100 SXM idles near 70 W at 345 MHz and draws up to its 700 W cap near full load; an idle
card reports the GPU-idle clock event reason (0x1), a card at its power cap the software power
cap (0x4), and a card too hot the software thermal slowdown (0x20).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.simulate.utilisation import Frames

IDLE_PCT = 5
REASON_NONE = 0x0
REASON_IDLE = 0x1
REASON_POWER_CAP = 0x4
REASON_THERMAL = 0x20
REASON_CODES = (REASON_NONE, REASON_IDLE, REASON_POWER_CAP, REASON_THERMAL)
POWER_CAP_W = 700.0


@dataclass(frozen=True, slots=True)
class Telemetry:
    """Per card and tick: power (centiwatts), SM clock (MHz), temperature (°C), and the index
    into REASON_CODES of the active clock event reasons."""

    power_cw: np.ndarray
    clock_mhz: np.ndarray
    temp_c: np.ndarray
    reason: np.ndarray


def derive(frames: Frames, rng: np.random.Generator) -> Telemetry:
    cards, n = frames.util.shape
    u = frames.util.astype(np.float64)
    idle_w = rng.uniform(62.0, 76.0, size=(cards, 1))
    per_pct = rng.uniform(5.9, 6.3, size=(cards, 1))
    loaded = frames.mem > 0
    power = idle_w + u * per_pct + np.where(loaded, 18.0, 0.0) + rng.normal(0, 3.0, (cards, n))
    power = np.clip(power, 55.0, POWER_CAP_W)
    active = frames.util > IDLE_PCT
    capped = active & (power > 650.0)
    clock = np.where(active, 1980, np.where(loaded, 1755, 345))
    clock = np.where(capped, rng.integers(1860, 1966, size=(cards, n)), clock)
    clock = np.where(frames.hot, rng.integers(1365, 1531, size=(cards, n)), clock)
    temp = 29.0 + rng.uniform(-2, 3, size=(cards, 1)) + u * 0.38 + rng.normal(0, 0.8, (cards, n))
    temp = np.where(frames.hot, rng.integers(86, 90, size=(cards, n)), temp)
    reason = np.where(active, REASON_CODES.index(REASON_NONE), REASON_CODES.index(REASON_IDLE))
    reason = np.where(capped, REASON_CODES.index(REASON_POWER_CAP), reason)
    reason = np.where(frames.hot, REASON_CODES.index(REASON_THERMAL), reason)
    return Telemetry(
        power_cw=np.rint(power * 100).astype(np.int64),
        clock_mhz=clock.astype(np.int32),
        temp_c=np.rint(temp).astype(np.int32),
        reason=reason.astype(np.int8),
    )
