"""Settings as frozen dataclasses, each default documented; read from env and a TOML file.

The classifier's thresholds (SPEC §3) live here as data so that every audit run records
the values it used.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from auditor.errors import ConfigError
from auditor.model import DEFAULT_CLUSTER

DEFAULT_DB_FILE = "auditor.db"
DB_URL_ENV = "AUDITOR_DB_URL"
DB_URL_FILE_ENV = "AUDITOR_DB_URL_FILE"
CLUSTER_ENV = "AUDITOR_CLUSTER"
"""The services' cluster (`--cluster`), as the chart gives it to them."""
CONFIG_ENV = "AUDITOR_CONFIG"
PROMETHEUS_TOKEN_ENV = "AUDITOR_PROMETHEUS_TOKEN"
PROMETHEUS_PASSWORD_ENV = "AUDITOR_PROMETHEUS_PASSWORD"
NODE_NAME_ENV = "NODE_NAME"
"""The sampler's node; the DaemonSet sets it from the downward API (`spec.nodeName`)."""
BUFFER_DIR_ENV = "AUDITOR_BUFFER_DIR"
BUFFER_MAX_MIB_ENV = "AUDITOR_BUFFER_MAX_MIB"
WATCH_NAMESPACE_ENV = "AUDITOR_WATCH_NAMESPACE"
WATCH_SELECTOR_ENV = "AUDITOR_WATCH_SELECTOR"
METRICS_PORT_ENV = "AUDITOR_METRICS_PORT"
LOG_FORMAT_ENV = "AUDITOR_LOG_FORMAT"
PROCESS_UTIL_ENV = "AUDITOR_PROCESS_UTIL"
PROC_ROOT_ENV = "AUDITOR_PROC_ROOT"
FINANCE_OUT_ENV = "AUDITOR_FINANCE_OUT"


@dataclass(frozen=True, slots=True)
class CauseThresholds:
    """The knobs of the causes inside `compute_idle` and `unallocated` (SPEC §10)."""

    cpu_limit_ratio: float = 0.9
    """`input_bound` when the pod used at least this share of its CPU limit."""
    throttled_ratio: float = 0.25
    """`input_bound` when the pod was CFS-throttled in at least this share of periods."""
    pressure_ratio: float = 0.2
    """`input_bound` when the pod's CPU or I/O pressure (PSI `some`) is at least this."""
    pcie_ratio: float = 0.3
    """`host_transfer` when PCIe traffic is at least this share of the link's bandwidth."""
    pcie_default_bytes_s: float = 8e9
    """The link's bandwidth where its generation and width are unknown (bytes/s)."""
    comm_bytes_s: float = 1e9
    """`communication` when a gang card's NVLink or its pod's network traffic is this much."""
    signal_stale_s: float = 180.0
    """A signal row stands for the time after it for at most this long."""


_CAUSES = CauseThresholds()
RATIO_THRESHOLDS = ("throttled_ratio", "pressure_ratio", "pcie_ratio")
"""Cause thresholds that are shares (0-1)."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The classifier's knobs. Defaults are SPEC §3's."""

    idle_threshold_pct: float = 5.0
    """A sample is idle when its utilisation is at or below this (percent)."""
    startup_cap_s: float = 1800.0
    """A leading idle run is `startup` for this long, `reserved_idle` after."""
    teardown_cap_s: float = 600.0
    """A trailing idle run is `teardown` for this long, `reserved_idle` after."""
    reserved_after_s: float = 1800.0
    """A mid-tenure idle run at least this long is `reserved_idle`."""
    straggler_tolerance_pct: float = 10.0
    """An active card this many points below the gang's busiest waits for a straggler."""
    checkpoint_min_gaps: int = 3
    """A regular series of gang-wide gaps needs at least this many gaps."""
    checkpoint_min_gap_s: float = 15.0
    """Shortest gang-wide gap that can be a checkpoint."""
    checkpoint_max_gap_s: float = 900.0
    """Longest gang-wide gap that can be a checkpoint."""
    checkpoint_min_samples: int = 3
    """Fewest idle samples a gang-wide gap must span to be a checkpoint (markers aside):
    a shorter one has no measured length, and at 60 s an input stall is one or two."""
    checkpoint_length_factor: float = 1.5
    """Gaps of one series are within this factor of the series' median length."""
    checkpoint_max_cv: float = 0.3
    """Largest coefficient of variation of a series' start-to-start intervals."""
    gap_periods: float = 3.0
    """A sample whose next one is more than this many periods away covers one period."""
    default_period_s: float = 5.0
    """Period assumed for a GPU with a single sample."""
    # The causes inside `compute_idle` and `unallocated` (SPEC §10; `CauseThresholds` says
    # what each means): here so that they are set in `[thresholds]` and stored with each run.
    cpu_limit_ratio: float = _CAUSES.cpu_limit_ratio
    throttled_ratio: float = _CAUSES.throttled_ratio
    pressure_ratio: float = _CAUSES.pressure_ratio
    pcie_ratio: float = _CAUSES.pcie_ratio
    pcie_default_bytes_s: float = _CAUSES.pcie_default_bytes_s
    comm_bytes_s: float = _CAUSES.comm_bytes_s
    signal_stale_s: float = _CAUSES.signal_stale_s

    @property
    def causes(self) -> CauseThresholds:
        """The cause knobs, as `auditor.classify.causes` takes them."""
        return CauseThresholds(**{f.name: getattr(self, f.name) for f in fields(CauseThresholds)})

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def updated(self, values: dict[str, Any], *, source: str = "thresholds") -> Thresholds:
        """A copy with `values` applied; unknown keys and bad values are a ConfigError."""
        known = {f.name: f for f in fields(self)}
        clean: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(
                    f"unknown threshold (known: {', '.join(known)})", file=source, field=key
                )
            want = int if known[key].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"must be a number, not {value!r}", file=source, field=key)
            if not math.isfinite(value):
                raise ConfigError(f"must be a finite number, got {value!r}", file=source, field=key)
            if value < 0:
                raise ConfigError(f"must not be negative, got {value!r}", file=source, field=key)
            if want is int and value != int(value):
                raise ConfigError(f"must be a whole number, got {value!r}", file=source, field=key)
            if key == "idle_threshold_pct" and value > 100:
                raise ConfigError(f"is a percentage, got {value!r}", file=source, field=key)
            if key in RATIO_THRESHOLDS and value > 1:
                raise ConfigError(f"is a share (0-1), got {value!r}", file=source, field=key)
            clean[key] = want(value)
        return replace(self, **clean)


# The services' knobs, one declaration each: `jobs.sample` / `jobs.watch` run by these
# options, `auditor sample` / `auditor watch` build them (their flags' defaults are these
# fields' defaults), and the agents' own defaults are read from them (the names below).


@dataclass(frozen=True)
class SampleOptions:
    """How `auditor sample` runs on a node (each default suits a DaemonSet)."""

    node: str
    buffer_dir: Path = Path("/var/lib/auditor")
    """Directory of the on-disk buffer that keeps passes while the store is down."""
    period_s: float = 5.0
    """Seconds between the sampler's passes over the node's GPUs."""
    flush_every_s: float = 30.0
    """Seconds between the sampler's writes to the store (passes are batched in between)."""
    buffer_max_mib: float = 200.0
    """MiB of passes kept while the store is down (about 4 days of 8 GPUs at 5 s); beyond
    it, or on a full disk, the oldest are dropped and counted. The file takes up to 1.2
    times this on disk."""
    pod_resources_socket: Path | None = None
    """The kubelet's pod-resources socket; None: record no GPU -> pod mapping."""
    metrics_host: str = "0.0.0.0"
    """Address /metrics and /healthz listen on."""
    metrics_port: int | None = 9402
    """Port of /metrics and /healthz; 0: any free port; None: no server."""
    max_passes: int | None = None
    """Stop after this many passes (tests, benchmarks); None: run until stopped."""
    proc_root: Path | None = None
    """The host's `/proc`, to read per-process GPU utilisation and put it in pods (SPEC §7;
    needs `hostPID: true`); None: off."""
    cgroup_root: Path | None = None
    """The host's `/sys/fs/cgroup`, to read the CPU signals of the pods whose processes use
    the cards (SPEC §10; needs `proc_root`); None: off."""
    json_logs: bool = False
    """Log one JSON object a line, as the watcher does with the same flag."""
    idle_threshold_pct: float = Thresholds().idle_threshold_pct
    """A held card whose utilisation is at or below this is idle for its live idle streak."""
    cluster: str = DEFAULT_CLUSTER
    """The cluster the node is in (SPEC §11): its cards are stored as that cluster's."""


@dataclass(frozen=True)
class WatchOptions:
    """How `auditor watch` runs (each default suits the single-replica Deployment)."""

    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster, else `KUBECONFIG` / ~/.kube/config."""
    context: str | None = None
    namespace: str | None = None
    """Watch pods of this namespace only; None: all namespaces."""
    selector: str | None = None
    """Label selector of the pods to watch."""
    nodes: bool = True
    """Watch nodes too (GPU model, capacity, cordoned)."""
    dra: bool = True
    """Watch ResourceClaims and ResourceSlices too (Dynamic Resource Allocation), where the
    cluster serves `resource.k8s.io`."""
    metrics_host: str = SampleOptions.metrics_host
    metrics_port: int | None = 9403
    """Port of /metrics and /healthz; 0: any free port; None: no server."""
    health_max_age_s: float = 600.0
    """/healthz fails when a watched kind has not synced for this long."""
    watch_timeout_s: int = 300
    """The API server ends each watch after this long; the watcher then watches again."""
    connect_timeout_s: float = 10.0
    """Seconds to open a connection to the API server."""
    read_timeout_s: float = 90.0
    """Seconds without a byte after which a watch stream counts as dead (servers send a
    bookmark about every minute to a watch that asks for them)."""
    json_logs: bool = False
    cluster: str = DEFAULT_CLUSTER
    """The cluster watched (SPEC §11): its pods and nodes are stored as that cluster's."""
    audit_top_jobs: int = 10
    """/metrics also serves the latest complete audit (read at most once a minute), with the
    figures of this many jobs that wasted most; 0: no job figures."""


SAMPLE_PERIOD_S = SampleOptions.period_s
SAMPLE_FLUSH_EVERY_S = SampleOptions.flush_every_s
BUFFER_MAX_MIB = SampleOptions.buffer_max_mib
WATCH_TIMEOUT_S = WatchOptions.watch_timeout_s
CONNECT_TIMEOUT_S = WatchOptions.connect_timeout_s
READ_TIMEOUT_S = WatchOptions.read_timeout_s
"""The agents' defaults (`auditor.agents.sample`, `auditor.agents.watch`), as the options
above declare them."""


@dataclass(frozen=True, slots=True)
class TeamRules:
    """How a pod's team is found (SPEC §2.2): label, else annotation, else namespace."""

    label: str = "team"
    annotation: str = "team"
    namespace_teams: dict[str, str] = field(default_factory=dict)
    """Namespace -> team, used before falling back to the namespace itself."""


SHARE_KINDS = ("whole", "mig", "hami", "milli")
"""What an extra GPU resource name counts: whole cards (or time-slicing replicas), MIG
instances, HAMi vGPUs, or thousandths of a card."""


@dataclass(frozen=True, slots=True)
class Sharing:
    """Extra names a cluster uses for shared GPUs (SPEC §7), beside the well-known ones."""

    resources: dict[str, str] = field(default_factory=dict)
    """Container resource name -> what it counts (one of `SHARE_KINDS`)."""
    fraction_annotations: tuple[str, ...] = ()
    """Pod annotations holding the fraction of one card a pod asks for, like Run:ai's
    `gpu-fraction`."""


@dataclass(frozen=True, slots=True)
class Prices:
    """GPU price per hour by GPU model (the model name as nvidia-smi/NVML print it)."""

    default: float = 0.0
    """Price of a GPU-hour of any model not listed."""
    by_model: dict[str, float] = field(default_factory=dict)
    currency: str = "USD"

    def for_model(self, model: str | None) -> float:
        return self.by_model.get(model or "", self.default)


@dataclass(frozen=True, slots=True)
class Retention:
    """How long raw samples are kept before `auditor rollup` folds them into 1-minute rows."""

    raw_days: float = 14.0
    """Raw samples older than this many days are rolled up and deleted. Audits of older
    windows read the rollups (coarser at minute resolution, and flagged in reports)."""


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a config file can set."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    teams: TeamRules = field(default_factory=TeamRules)
    prices: Prices = field(default_factory=Prices)
    cost_centres: dict[str, str] = field(default_factory=dict)
    """Team -> cost centre, for the finance export."""
    retention: Retention = field(default_factory=Retention)
    sharing: Sharing = field(default_factory=Sharing)
    cluster: str = DEFAULT_CLUSTER
    """The cluster imports and services record their cards, pods and nodes as, where no
    `--cluster` says (SPEC §11)."""


def default_db_url(cwd: Path | None = None) -> str:
    """`AUDITOR_DB_URL`, else the file `AUDITOR_DB_URL_FILE` names (a mounted Secret), else a
    SQLite file `auditor.db` in the working directory."""
    env = os.environ.get(DB_URL_ENV)
    if env:
        return env
    url_file = os.environ.get(DB_URL_FILE_ENV)
    if url_file:
        try:
            url = Path(url_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"cannot read the database URL: {e.strerror}", file=url_file, field=DB_URL_FILE_ENV
            ) from e
        if not url:
            raise ConfigError(
                "the database URL file is empty", file=url_file, field=DB_URL_FILE_ENV
            )
        return url
    return f"sqlite:///{(cwd or Path.cwd()) / DEFAULT_DB_FILE}"


def load_config(path: Path | None) -> Config:
    """Read a TOML config file (or `AUDITOR_CONFIG`); defaults when there is none.

    Every key is validated on load; a bad one is a ConfigError naming the file and the key.
    """
    if path is None:
        env = os.environ.get(CONFIG_ENV)
        path = Path(env) if env else None
    if path is None:
        return Config()
    name = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError) as e:
        raise ConfigError("config file does not exist", file=name) from e
    except UnicodeDecodeError as e:
        raise ConfigError("config file is not UTF-8 text", file=name) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", file=name) from e
    _known(
        raw,
        {
            "currency",
            "thresholds",
            "teams",
            "prices",
            "cost_centres",
            "retention",
            "sharing",
            "cluster",
        },
        name,
        "",
    )
    thresholds = Thresholds().updated(_table(raw, "thresholds", name), source=name)
    teams_raw = _table(raw, "teams", name)
    _known(teams_raw, {"label", "annotation", "namespaces"}, name, "teams.")
    teams = TeamRules(
        label=_text(teams_raw, "label", name, "teams.", default="team"),
        annotation=_text(teams_raw, "annotation", name, "teams.", default="team"),
        namespace_teams=_text_map(teams_raw.get("namespaces", {}), name, "teams.namespaces"),
    )
    prices_raw = _table(raw, "prices", name)
    by_model: dict[str, float] = {}
    for model, value in prices_raw.items():
        if not _non_negative(value):
            raise ConfigError(
                f"must be a price per GPU-hour (a number >= 0), not {value!r}",
                file=name,
                field=f"prices.{model}",
            )
        by_model[model] = float(value)
    default_price = by_model.pop("default", 0.0)
    currency = _text(raw, "currency", name, "", default="USD")
    retention_raw = _table(raw, "retention", name)
    _known(retention_raw, {"raw_days"}, name, "retention.")
    raw_days = retention_raw.get("raw_days", Retention().raw_days)
    if not _non_negative(raw_days):
        raise ConfigError(
            f"must be a number of days >= 0, not {raw_days!r}",
            file=name,
            field="retention.raw_days",
        )
    return Config(
        thresholds=thresholds,
        teams=teams,
        prices=Prices(default=default_price, by_model=by_model, currency=currency),
        cost_centres=_text_map(raw.get("cost_centres", {}), name, "cost_centres"),
        retention=Retention(raw_days=float(raw_days)),
        sharing=_sharing(_table(raw, "sharing", name), name),
        cluster=cluster_name(
            _text(raw, "cluster", name, "", default=DEFAULT_CLUSTER), file=name, field="cluster"
        ),
    )


CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""A cluster's name: what kubeconfig contexts and Prometheus `cluster` labels use, short
enough for its column, and safe to print in a command a message suggests."""


def cluster_name(value: str, *, file: str | None = None, field: str = "--cluster") -> str:
    """`value` if it is a cluster name (`CLUSTER_NAME`), else a ConfigError naming `field`."""
    if not CLUSTER_NAME.fullmatch(value):
        raise ConfigError(
            "a cluster name is 1 to 253 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit, not {value[:80]!r}",
            file=file,
            field=field,
        )
    return value


def _sharing(table: dict[str, Any], name: str) -> Sharing:
    _known(table, {"resources", "fraction_annotations"}, name, "sharing.")
    resources = _text_map(table.get("resources", {}), name, "sharing.resources")
    for res, kind in resources.items():
        if kind not in SHARE_KINDS:
            raise ConfigError(
                f"must be one of {', '.join(SHARE_KINDS)}, not {kind!r}",
                file=name,
                field=f"sharing.resources.{res}",
            )
    annotations = table.get("fraction_annotations", [])
    if not isinstance(annotations, list) or not all(isinstance(a, str) and a for a in annotations):
        raise ConfigError(
            "must be a list of annotation names", file=name, field="sharing.fraction_annotations"
        )
    return Sharing(resources=resources, fraction_annotations=tuple(annotations))


def _non_negative(value: Any) -> bool:
    """A finite number >= 0 (TOML has `nan` and `inf`; neither is a price or a length)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


def _known(table: dict[str, Any], keys: set[str], name: str, prefix: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigError(
            f"unknown key (known: {', '.join(sorted(keys))})",
            file=name,
            field=f"{prefix}{unknown[0]}",
        )


def _table(raw: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError("must be a table", file=name, field=key)
    return dict(value)


def _text(table: dict[str, Any], key: str, name: str, prefix: str, *, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"must be a non-empty string, not {value!r}", file=name, field=f"{prefix}{key}"
        )
    return value


def _text_map(value: Any, name: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError('must be a table of name = "text"', file=name, field=key)
    return dict(value)
