"""The programmatic API: one function per command, and the only place that wires parts together.

Each function opens the store, calls the pure parts, and writes or returns the outcome. The
CLI is one caller; tests and the in-cluster jobs are others. One module per kind of job.
"""

from auditor.jobs.audit import AuditStats, audit, audit_clusters, data_window
from auditor.jobs.common import BATCH_ROWS, ImportStats, open_store, raise_store_error
from auditor.jobs.database import Revisions, db_current, db_upgrade
from auditor.jobs.demo import SimulateStats, demo, simulate, truth_check
from auditor.jobs.from_store import FromStoreStats, audit_from_store
from auditor.jobs.imports import (
    PrometheusImportStats,
    import_nvidia_smi,
    import_pods,
    import_prometheus,
    parse_node_options,
)
from auditor.jobs.outputs_and_compare import (
    OutputsImportStats,
    compare,
    import_outputs_csv,
    import_outputs_prometheus,
    parse_side,
    store_latency_rows,
)
from auditor.jobs.parts import (
    AUDIT_CHUNK_SAMPLES,
    READ_MARGIN_MS,
    audit_parts,
    card_ranges,
    shard_of,
)
from auditor.jobs.reports import (
    build_report,
    build_report_html,
    covering_runs,
    explain,
    export_finance,
)
from auditor.jobs.retention import RetentionStats, rollup
from auditor.jobs.services import SampleOptions, WatchOptions, sample, watch
from auditor.jobs.undo import list_imports, undo_import
from auditor.jobs.whatif import whatif
from auditor.model import Selection

__all__ = [
    "AUDIT_CHUNK_SAMPLES",
    "BATCH_ROWS",
    "READ_MARGIN_MS",
    "AuditStats",
    "FromStoreStats",
    "ImportStats",
    "OutputsImportStats",
    "PrometheusImportStats",
    "RetentionStats",
    "Revisions",
    "SampleOptions",
    "Selection",
    "SimulateStats",
    "WatchOptions",
    "audit",
    "audit_clusters",
    "audit_from_store",
    "audit_parts",
    "build_report",
    "build_report_html",
    "card_ranges",
    "compare",
    "covering_runs",
    "data_window",
    "db_current",
    "db_upgrade",
    "demo",
    "explain",
    "export_finance",
    "import_nvidia_smi",
    "import_outputs_csv",
    "import_outputs_prometheus",
    "import_pods",
    "import_prometheus",
    "list_imports",
    "open_store",
    "parse_node_options",
    "parse_side",
    "raise_store_error",
    "rollup",
    "sample",
    "shard_of",
    "simulate",
    "store_latency_rows",
    "truth_check",
    "undo_import",
    "watch",
    "whatif",
]
