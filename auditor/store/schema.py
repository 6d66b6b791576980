"""The one schema. Natural keys make every write idempotent; times are epoch milliseconds UTC.

Migrations in `migrations/` must produce exactly this (a test compares them).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
)

from auditor import limits
from auditor.model import DEFAULT_CLUSTER, SAMPLE_FIELDS, SAMPLE_TEXT_FIELDS

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

gpus = Table(
    "gpus",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uuid", String(limits.GPU_UUID_MAX), nullable=False, unique=True),
    Column("node", String(limits.NAME_MAX), nullable=False),
    Column("gpu_index", Integer, nullable=True),
    Column("model", String(limits.GPU_MODEL_MAX), nullable=True),
    Column("memory_total_mib", Float, nullable=True),
    Column("parent_uuid", String(limits.GPU_UUID_MAX), nullable=True),
    Column("util_source", String(limits.UTIL_SOURCE_MAX), nullable=True),
    Column("mig_profile", String(limits.SHARE_TEXT_MAX), nullable=True),
    Column("cluster", String(limits.NAME_MAX), nullable=False, server_default=DEFAULT_CLUSTER),
    Index("ix_gpus_node_index", "node", "gpu_index"),
    Index("ix_gpus_cluster_node", "cluster", "node"),
)

gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("ts_ms", BigInteger, primary_key=True),
    *(
        Column(
            name,
            String(limits.THROTTLE_MAX) if name in SAMPLE_TEXT_FIELDS else Float,
            nullable=True,
        )
        for name in SAMPLE_FIELDS
    ),
    Column("import_id", Integer, nullable=True),
    sqlite_with_rowid=False,
)
"""One row per GPU and timestamp, the table that grows (121 million rows a week at 1,000 GPUs).

`gpu_id` names a `gpus` row but is not a foreign key: a per-row referential check made
PostgreSQL's COPY into this table 3.75x slower (bench: 2.1 s against 7.8 s per million
rows), and the one writer (`store.bulk`, called with ids `upsert_gpus` returned in the same
transaction) cannot break it; nothing deletes GPUs. On SQLite the table is clustered on its
key (`WITHOUT ROWID`): one B-tree instead of a table and an index, a third fewer bytes per
sample, and the audit's per-GPU time-range read is one contiguous scan.

`import_id` is the `imports` row of the import that wrote the sample (NULL for the sampler's
and for samples stored before the ledger): a sample an import skipped as stored already
keeps the import that wrote it, so taking an import back deletes only what it wrote."""

gpu_samples_1m = Table(
    "gpu_samples_1m",
    metadata,
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True),
    Column("minute_ms", BigInteger, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("covered_ms", BigInteger, nullable=False),
    Column("readable_ms", BigInteger, nullable=False),
    Column("util_min", Float, nullable=True),
    Column("util_mean", Float, nullable=True),
    Column("util_max", Float, nullable=True),
    Column("covered_from_ms", BigInteger, nullable=False),
    Column("covered_to_ms", BigInteger, nullable=False),
    Column("memory_used_max_mib", Float, nullable=True),
    Column("power_mean_w", Float, nullable=True),
)
"""Raw samples older than the retention age, rolled up per GPU and UTC minute
(`auditor.store.rollup`). `samples` counts the raw samples stamped in the minute;
`covered_ms` is the time of the minute their coverage (SPEC §3) spans, `readable_ms` the
part with readable utilisation, which `util_mean` is weighted over (so busy time
`util_mean/100 * readable_ms` is kept exactly). `covered_from_ms`/`covered_to_ms` bound the
covered time, so a GPU's observed span (its capacity) survives the rollup to the ms."""

pods = Table(
    "pods",
    metadata,
    Column("uid", String(limits.UID_MAX), primary_key=True),
    Column("namespace", String(limits.NAME_MAX), nullable=False),
    Column("name", String(limits.NAME_MAX), nullable=False),
    Column("node", String(limits.NAME_MAX), nullable=True),
    Column("team", String(limits.NAME_MAX), nullable=False),
    Column("job", String(limits.JOB_MAX), nullable=False),
    Column("job_kind", String(limits.KIND_MAX), nullable=False),
    Column("workload", String(limits.WORKLOAD_MAX), nullable=False),
    Column("gang", String(limits.GANG_MAX), nullable=False),
    Column("rank", Integer, nullable=True),
    Column("gpu_count", Integer, nullable=False),
    Column("gpu_resource", String(limits.RESOURCE_MAX), nullable=False),
    Column("created_ms", BigInteger, nullable=True),
    Column("bound_ms", BigInteger, nullable=True),
    Column("started_ms", BigInteger, nullable=True),
    Column("finished_ms", BigInteger, nullable=True),
    Column("deleted_ms", BigInteger, nullable=True),
    Column("phase", String(limits.PHASE_MAX), nullable=True),
    Column("resource_version", String(limits.VERSION_MAX), nullable=True),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("deleted_estimated", Boolean, nullable=False, server_default=false()),
    Column("share_kind", String(limits.SHARE_TEXT_MAX), nullable=True),
    Column("gpu_share", Float, nullable=True),
    Column("gpu_mem_mib", Float, nullable=True),
    Column("gpu_mem_share", Float, nullable=True),
    Column("wait_reason", String(limits.REASON_MAX), nullable=True),
    Column("wait_message", String(limits.MESSAGE_MAX), nullable=True),
    Column("wanted_model", String(limits.GPU_MODEL_MAX), nullable=True),
    Column("wait_seen_ms", BigInteger, nullable=True),
    Column("cluster", String(limits.NAME_MAX), nullable=False, server_default=DEFAULT_CLUSTER),
    Index("ix_pods_node_bound", "node", "bound_ms"),
    Index("ix_pods_namespace_name", "namespace", "name"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("cluster", String(limits.NAME_MAX), primary_key=True, server_default=DEFAULT_CLUSTER),
    Column("name", String(limits.NAME_MAX), primary_key=True),
    Column("gpu_model", String(limits.GPU_MODEL_MAX), nullable=True),
    Column("gpu_capacity", Integer, nullable=False),
    Column("gpu_allocatable", Integer, nullable=False),
    Column("unschedulable", Boolean, nullable=False),
    Column("labels", JSON, nullable=False),
    Column("resource_version", String(limits.VERSION_MAX), nullable=True),
    Column("updated_ms", BigInteger, nullable=False),
)
"""Nodes as the watcher last saw them: GPU model, GPU count, cordoned or not. A node's name
is unique only inside its `cluster` (SPEC §11): two clusters may both have `gpu-node-1`."""

watch_cursors = Table(
    "watch_cursors",
    metadata,
    Column("scope", String(600), primary_key=True),
    Column("resource_version", String(64), nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
)
"""Where each watch (kind, namespace, selector) got to, written in the same transaction as
the events it covers, so a restarted watcher resumes there and loses nothing."""

gpu_assignments = Table(
    "gpu_assignments",
    metadata,
    Column("pod_uid", String(64), ForeignKey("pods.uid", ondelete="CASCADE"), primary_key=True),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True),
    Column("first_seen_ms", BigInteger, nullable=False),
    Column("last_seen_ms", BigInteger, nullable=False),
    Column("source", String(32), nullable=False),
    Column("replicas", Integer, nullable=True),
    Column("share", Float, nullable=True),
)
"""Exact GPU -> pod mapping seen by a source (pod-resources, dcgm labels, HAMi's annotation).
`replicas`: time-slicing device IDs `GPU-…::j` of the card the pod holds (pod-resources);
`share`: an exact share of the card where a source says it (HAMi's cores / 100, else its
memory / the card's)."""

gpu_tenant_util = Table(
    "gpu_tenant_util",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("pod_uid", String(64), primary_key=True),
    Column("ts_ms", BigInteger, primary_key=True),
    Column("util", Float, nullable=True),
    sqlite_with_rowid=False,
)
"""One pod's utilisation of one physical card (percent of the whole card, summed over its
processes) per sample time (SPEC §7). Not foreign keys, for the reason `gpu_samples` gives."""

audit_runs = Table(
    "audit_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("window_start_ms", BigInteger, nullable=False),
    Column("window_end_ms", BigInteger, nullable=False),
    Column("shard", String(32), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("thresholds", JSON, nullable=False),
    Column("version", String(32), nullable=False),
    Column("rolled_up_seconds", Float, nullable=False, server_default=text("0")),
    Column("hourly", Boolean, nullable=False, server_default=false()),
    Column("cluster", String(limits.NAME_MAX), nullable=False, server_default=DEFAULT_CLUSTER),
    Index(
        "ix_audit_runs_window",
        "cluster",
        "window_start_ms",
        "window_end_ms",
        "shard",
        unique=True,
    ),
)
"""One row per audit run (a window, or one shard of it). `rolled_up_seconds`: GPU-seconds of
the window audited from 1-minute rollups rather than raw samples (the report flags them).
`hourly`: its results, causes and SM rows are stored per UTC hour (SPEC §11), so any
whole-hour window inside it can be read; false for a run stored before that (migration
0011), whose rows are one bucket, the whole run. `cluster`: the one cluster it audited (a
run reads that cluster's cards, pods, nodes and waits only), so its results are that
cluster's."""

audit_results = Table(
    "audit_results",
    metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("pod_uid", String(64), nullable=True),
    Column("category", String(32), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("inferred", Boolean, nullable=False),
    Column("estimated", Boolean, nullable=False, server_default=false()),
    Column("share", Float, nullable=True),
    Column("hour_ms", BigInteger, nullable=False),
    Index("ix_audit_results_run_hour", "run_id", "hour_ms"),
)
"""GPU-seconds per (run, UTC hour, card, pod or none, category); pod attributes are joined
on read. `hour_ms` is the start of the row's bucket, `[max(hour, run start), min(hour + 1 h,
run end))`: a run not on whole hours keeps its edge buckets."""

audit_findings = Table(
    "audit_findings",
    metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("gang", String(600), nullable=True),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=True),
    Column("pod_uid", String(64), nullable=True),
    Column("start_ms", BigInteger, nullable=True),
    Column("end_ms", BigInteger, nullable=True),
    Column("seconds", Float, nullable=False),
    Column("detail", Text, nullable=True),
    Index("ix_audit_findings_run", "run_id"),
)
"""What a report names: startup/teardown/checkpoint episodes, and each gang's straggler."""

audit_sm = Table(
    "audit_sm",
    metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("pod_uid", String(limits.UID_MAX), nullable=True),
    Column("sm_active_seconds", Float, nullable=False),
    Column("sm_busy_seconds", Float, nullable=False),
    Column("hour_ms", BigInteger, nullable=False),
    Index("ix_audit_sm_run_hour", "run_id", "hour_ms"),
)
"""SM activity per (run, card, pod) held in the window (SPEC §8): `sm_active_seconds` is the
sum of `sm_active · dt`, `sm_busy_seconds` the busy seconds whose sample had SM data (so a
report can say what share of busy time SM activity covers); per hour as `audit_results`."""

outputs = Table(
    "outputs",
    metadata,
    Column("pod_uid", String(limits.UID_MAX), primary_key=True),
    Column("metric", String(limits.METRIC_MAX), primary_key=True),
    Column("start_ms", BigInteger, primary_key=True),
    Column("end_ms", BigInteger, nullable=False),
    Column("outputs", Float, nullable=False),
    Column("unit", String(limits.UNIT_MAX), nullable=False),
    Column("source", String(32), nullable=False),
    Column("quality", Float, nullable=True),
    Column("quality_better", String(8), nullable=True),
    Index("ix_outputs_start", "start_ms"),
)
"""Useful output per pod and interval `[start_ms, end_ms)` (SPEC §8): counter increases
from Prometheus (resets handled) or rows of an outputs CSV, with an optional quality figure
(`quality_better`: `lower` or `higher`). Re-importing an interval replaces it."""

latency_buckets = Table(
    "latency_buckets",
    metadata,
    Column("pod_uid", String(limits.UID_MAX), primary_key=True),
    Column("metric", String(limits.METRIC_MAX), primary_key=True),
    Column("start_ms", BigInteger, primary_key=True),
    Column("le", Float, primary_key=True),
    Column("end_ms", BigInteger, nullable=False),
    Column("count", Float, nullable=False),
)
"""Latency histogram increases per pod, interval and cumulative bucket bound `le` (seconds;
+inf for the last): summed over pods and intervals they give any window's quantiles."""

pod_signals = Table(
    "pod_signals",
    metadata,
    Column("pod_uid", String(limits.UID_MAX), primary_key=True),
    Column("source", String(16), primary_key=True),
    Column("ts_ms", BigInteger, primary_key=True),
    Column("cpu_limit_ratio", Float, nullable=True),
    Column("throttled_ratio", Float, nullable=True),
    Column("cpu_pressure", Float, nullable=True),
    Column("io_pressure", Float, nullable=True),
    Column("net_bytes_s", Float, nullable=True),
    Column("requests_running", Float, nullable=True),
    Column("requests_waiting", Float, nullable=True),
    Index("ix_pod_signals_ts", "ts_ms"),
)
"""A pod's infrastructure signals over time (SPEC §10), one row per pod, source (`cgroup`:
the sampler; `cadvisor`: Prometheus; `serving`: a server's queue gauges) and instant; a
signal the source does not give is NULL. Each row stands for the interval up to the pod's
next row of the same source (at most `signal_stale_s`)."""

card_signals = Table(
    "card_signals",
    metadata,
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True),
    Column("ts_ms", BigInteger, primary_key=True),
    Column("pcie_bytes_s", Float, nullable=True),
    Column("pcie_link_bytes_s", Float, nullable=True),
    Column("nvlink_bytes_s", Float, nullable=True),
)
"""A card's PCIe and NVLink traffic over time (bytes per second, both directions), and its
PCIe link's bandwidth where known (SPEC §10)."""

node_outages = Table(
    "node_outages",
    metadata,
    Column("cluster", String(limits.NAME_MAX), primary_key=True, server_default=DEFAULT_CLUSTER),
    Column("node", String(limits.NAME_MAX), primary_key=True),
    Column("reason", String(16), primary_key=True),
    Column("start_ms", BigInteger, primary_key=True),
    Column("end_ms", BigInteger, nullable=True),
)
"""Stretches in which a node's free cards could not be given (SPEC §10 `unavailable`):
`cordoned`, `not_ready`, or `short` (fewer cards allocatable than it has); `end_ms` NULL
while it lasts."""

audit_causes = Table(
    "audit_causes",
    metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("pod_uid", String(limits.UID_MAX), nullable=True),
    Column("category", String(32), nullable=False),
    Column("cause", String(32), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("signalled_seconds", Float, nullable=False),
    Column("hour_ms", BigInteger, nullable=False),
    Index("ix_audit_causes_run_hour", "run_id", "hour_ms"),
)
"""The causes inside `compute_idle` and `unallocated` per (run, card, pod or none), SPEC §10:
they sum to the category's `audit_results` seconds (per hour as those); `signalled_seconds`
is the part judged on a recorded signal (the rest is `no_signal_share`'s)."""


audit_free_shares = Table(
    "audit_free_shares",
    metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("hour_ms", BigInteger, nullable=False),
    Column("kind", String(limits.GPU_MODEL_MAX), nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("gone", Float, nullable=False),
    Column("avail_w", Float, nullable=False),
    Index("ix_audit_free_shares_run", "run_id"),
)
"""A shard's free time where pods waited (SPEC §10 `blocked`): the free shares
(`auditor.classify.free_time.free_shares`) of its cards in every (card, hour) that a wait
overlaps, a folded row per card and hour having no span (start_ms = end_ms). Waiting demand
is shared among the free cards of the whole fleet, which no one shard holds: the shard that
completes a window's set splits every shard's kept shares at once
(`auditor.store.free_split`)."""


imports = Table(
    "imports",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(32), nullable=False),
    Column("source", String(limits.SOURCE_MAX), nullable=False),
    Column("options", JSON, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("rows_written", Integer, nullable=False),
    Column("gpu_ids", JSON, nullable=False),
    Column("gpus_created", JSON, nullable=False),
    Column("first_ms", BigInteger, nullable=True),
    Column("last_ms", BigInteger, nullable=True),
    Column("undone_ms", BigInteger, nullable=True),
)
"""The ledger of imports (`auditor.store.ledger`), one row each, written in the import's own
transaction: its `kind` (`nvidia-smi`, `prometheus`, `pods`, `outputs`), `source` (the
file, or the Prometheus URL without credentials), the `options` that change what it means
(`tz`, `node`; a window), `rows_written` (samples newly stored; pod or output records),
the cards it offered samples of (`gpu_ids`) and those it added to `gpus`
(`gpus_created`), the first and last sample time it offered, and when it was taken back
(`undone_ms`; the row stays, so an id is never given twice)."""
