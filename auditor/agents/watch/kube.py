"""The only module that talks to the Kubernetes client: list and watch, as plain dicts.

Pods and nodes (and Dynamic Resource Allocation's ResourceClaims and ResourceSlices, in the
first `resource.k8s.io` version the cluster serves: `dra_version`) are read as raw JSON
(`_preload_content=False`), so the rest of the auditor sees the API's own shape (camelCase
keys, RFC 3339 times), exactly what `kubectl -o json` writes and `auditor.collect` reads.
Client failures become two exceptions the watcher acts on: `Expired` (410 Gone, at connect
or as an ERROR event in the stream: relist) and `Unavailable` (anything else: back off,
then watch again from where it was).

A watch asks the server to end it after `timeout_s` and sets a client read timeout, so a
stream that goes silent (a stalled proxy, a half-open connection) ends with `Unavailable`
instead of hanging. Each network read's complete lines are yielded as one batch of events.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from auditor.errors import AuditorError, ConfigError
from auditor.settings import CONNECT_TIMEOUT_S, READ_TIMEOUT_S


class Kind(StrEnum):
    PODS = "pods"
    NODES = "nodes"
    CLAIMS = "resourceclaims"
    SLICES = "resourceslices"


DRA_KINDS = frozenset({Kind.CLAIMS, Kind.SLICES})
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""The `resource.k8s.io` versions read, the first a cluster serves wins (v1: 1.34 on)."""


class Expired(AuditorError):
    """The resourceVersion (or list continue token) is too old: the caller must relist."""


class Unavailable(AuditorError):
    """The API cannot be read right now: refused, dropped, timed out, or answered an error."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: its items, the list's resourceVersion, the next page's token."""

    items: list[dict[str, Any]]
    resource_version: str
    next_token: str | None


@dataclass(frozen=True, slots=True)
class Event:
    """One watch event: ADDED, MODIFIED, DELETED, BOOKMARK (ERROR never leaves this module)."""

    type: str
    obj: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        meta = self.obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return rv if isinstance(rv, str) and rv else None


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = CONNECT_TIMEOUT_S
    """Seconds to open a connection."""
    read_s: float = READ_TIMEOUT_S
    """Seconds without a byte after which a stream counts as stalled. Servers send a
    bookmark about every minute to a watch that asks for them."""


class KubeSource:
    """List and watch one kind of object, optionally in one namespace and by selector."""

    def __init__(
        self,
        api: Any,
        *,
        kind: Kind,
        namespace: str | None = None,
        selector: str | None = None,
        timeouts: Timeouts = Timeouts(),
        version: str = DRA_VERSIONS[0],
    ) -> None:
        self._api = api
        self.kind = kind
        self.version = version
        """The `resource.k8s.io` version of a ResourceClaim or ResourceSlice source."""
        self.namespace = namespace if kind is Kind.PODS else None
        self.selector = selector if kind is Kind.PODS else None
        self._timeouts = (timeouts.connect_s, timeouts.read_s)
        self._streams: set[Any] = set()

    @property
    def scope(self) -> str:
        """A key naming what this source sees, under which its watch cursor is stored."""
        return f"{self.kind}|{self.namespace or '*'}|{self.selector or ''}"

    def _call(self, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        kwargs.update(_preload_content=False, _request_timeout=self._timeouts)
        if self.kind is Kind.NODES:
            return _request(self._api.list_node, **kwargs)
        if self.kind in DRA_KINDS:
            resource = _resource_api(self._api, self.version)
            if self.kind is Kind.CLAIMS:
                return _request(resource.list_resource_claim_for_all_namespaces, **kwargs)
            return _request(resource.list_resource_slice, **kwargs)
        if self.selector:
            kwargs["label_selector"] = self.selector
        if self.namespace:
            return _request(self._api.list_namespaced_pod, self.namespace, **kwargs)
        return _request(self._api.list_pod_for_all_namespaces, **kwargs)

    def list_page(self, *, limit: int, token: str | None = None) -> Page:
        """One page of a consistent list; `Expired` when `token` has expired."""
        resp = self._call(limit=limit, _continue=token)
        try:
            body = json.loads(resp.data)
        except Exception as e:
            raise Unavailable(f"cannot read the {self.kind} list: {e}") from e
        finally:
            resp.release_conn()
        meta = body.get("metadata") or {}
        items = body.get("items") or []
        return Page(
            items=[i for i in items if isinstance(i, dict)],
            resource_version=str(meta.get("resourceVersion") or ""),
            next_token=meta.get("continue") or None,
        )

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[list[Event]]:
        """Events after `resource_version`, batched by network read, until the server ends
        the stream. Raises `Expired` for 410 and `Unavailable` for anything else."""
        resp = self._call(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
        )
        self._streams.add(resp)
        try:
            yield from _events(resp, kind=self.kind)
        except AuditorError:
            raise
        except Exception as e:  # urllib3: ProtocolError, ReadTimeoutError, IncompleteRead...
            raise Unavailable(f"{self.kind} watch broke: {type(e).__name__}: {e}") from e
        finally:
            self._streams.discard(resp)
            resp.release_conn()
            resp.close()

    def interrupt(self) -> None:
        """End the open watch streams now (from another thread), so a stopping watcher need
        not wait for the next event or the read timeout."""
        for resp in list(self._streams):
            shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3
            with contextlib.suppress(Exception):
                shutdown() if shutdown is not None else resp.close()


def _events(resp: Any, *, kind: Kind) -> Iterator[list[Event]]:
    buffer = b""
    for data in resp.stream(amt=None, decode_content=True):
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        batch = [e for e in (_parse(line, kind=kind) for line in lines) if e is not None]
        if batch:
            yield batch
    if buffer.strip():
        raise Unavailable(f"{kind} watch ended inside an event")


def _parse(line: bytes, *, kind: Kind) -> Event | None:
    if not line.strip():
        return None
    try:
        raw = json.loads(line)
    except ValueError as e:
        raise Unavailable(f"{kind} watch sent a line that is not JSON: {e}") from e
    etype, obj = raw.get("type"), raw.get("object")
    if not isinstance(etype, str) or not isinstance(obj, dict):
        raise Unavailable(f"{kind} watch sent an event without type or object")
    if etype == "ERROR":
        message = f"{kind} watch error {obj.get('code')}: {obj.get('message', '')}"
        raise (Expired(message) if _expired(obj.get("code"), message) else Unavailable(message))
    return Event(etype, obj)


def _expired(code: object, message: str) -> bool:
    """410 Gone; or a resourceVersion this server has never reached (a cursor stored
    against another cluster, a restored etcd): both mean "relist"."""
    return code == 410 or "too large resource version" in message.lower()


def _request(method: Any, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return method(*args, **kwargs)
    except ApiException as e:
        message = f"API answered {e.status} {e.reason}: {str(e.body or '')[:300]}"
        raise (Expired(message) if _expired(e.status, message) else Unavailable(message)) from e
    except Exception as e:  # refused, reset, DNS, TLS: the client's transport errors
        raise Unavailable(f"cannot reach the API: {type(e).__name__}: {e}") from e


def _resource_api(api: Any, version: str) -> Any:
    from kubernetes import client

    name = {"v1": "ResourceV1Api", "v1beta2": "ResourceV1beta2Api", "v1beta1": "ResourceV1beta1Api"}
    return getattr(client, name[version])(api.api_client)


def dra_version(api: Any, *, timeouts: Timeouts = Timeouts()) -> str | None:
    """The `resource.k8s.io` version to read ResourceClaims and ResourceSlices in: the first
    of `DRA_VERSIONS` the cluster serves; None where it serves none (no DRA: before 1.32, or
    the group turned off). `Unavailable` where the API cannot be asked."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        group = client.ResourceApi(api.api_client).get_api_group(
            _request_timeout=(timeouts.connect_s, timeouts.read_s)
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise Unavailable(f"cannot discover {e.status} {e.reason}") from e
    except Exception as e:
        raise Unavailable(f"cannot reach the API: {type(e).__name__}: {e}") from e
    served = {v.version for v in (group.versions or [])}
    return next((v for v in DRA_VERSIONS if v in served), None)


def connect(*, kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A CoreV1Api: from the kubeconfig given (or its context), else in-cluster, else the
    default kubeconfig (`KUBECONFIG`, ~/.kube/config)."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # the package has no type hints
    cfg = client.Configuration()
    try:
        if kubeconfig or context:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except (config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(f"no usable Kubernetes configuration: {e}", field="--kubeconfig") from e
    return client.CoreV1Api(client.ApiClient(cfg))
