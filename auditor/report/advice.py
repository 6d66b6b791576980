"""The one-line next step a report gives for each category, and NVML throttle-reason names."""

from __future__ import annotations

from auditor.model import WasteCategory, WorkloadKind

# NVML clocks-event (throttle) reason bits, as nvmlClocksEventReason* / nvidia-smi name them.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


STALLED_BUSY_STEP = (
    "a kernel spins without work (busy, SM idle): look for a hung rank or a collective"
    " waiting on one; dump its stacks (py-spy dump) and set NCCL/collective timeouts"
)
"""The next step of a `stalled_busy` finding (SPEC §8)."""


def throttle_names(mask: str | None) -> list[str]:
    """Names of the reasons set in a hex mask like `0x0000000000000024`; [] when unreadable."""
    if not mask:
        return []
    try:
        value = int(mask, 16)
    except ValueError:
        return []
    return [name for bit, name in THROTTLE_BITS if value & bit and name != "gpu_idle"]


def next_step(
    category: WasteCategory | str,
    *,
    workload: str | None = None,
    straggler: str | None = None,
) -> str:
    """The standard advice for a category; `straggler` describes the slow card when known."""
    cat = WasteCategory(category)
    if cat is WasteCategory.RESERVED_IDLE:
        if workload == WorkloadKind.NOTEBOOK:
            return "cull idle notebooks (idle timeout) and cap notebook GPUs with a quota"
        return "cull pods that hold GPUs without using them; enforce idle timeouts and quotas"
    if cat is WasteCategory.STARTUP:
        return "pre-pull images on GPU nodes and cache models/datasets on node-local storage"
    if cat is WasteCategory.TEARDOWN:
        return "exit as soon as work ends; upload artifacts asynchronously or from a CPU pod"
    if cat is WasteCategory.CHECKPOINT:
        return "checkpoint asynchronously and sharded (e.g. torch.distributed.checkpoint)"
    if cat is WasteCategory.STRAGGLER_WAIT:
        where = f"the slow rank is {straggler}" if straggler else "find the slow rank"
        return f"{where}: check its node's clocks/thermals and the data skew between ranks"
    if cat is WasteCategory.COMPUTE_IDLE:
        if workload == WorkloadKind.INFERENCE:
            return "batch requests and raise concurrency per replica; scale replicas to traffic"
        if workload == WorkloadKind.NOTEBOOK:
            return "move interactive work to smaller or shared GPUs (MIG, time-slicing)"
        return (
            "more DataLoader workers, pinned memory and prefetch; larger batches; overlap CPU work"
        )
    if cat is WasteCategory.UNOBSERVED:
        return "fix collection: the sampler or exporter was not reporting for this card"
    if cat is WasteCategory.UNALLOCATED:
        return "right-size GPU node pools and team quotas to demand"
    return "nothing to do: the card was busy"
