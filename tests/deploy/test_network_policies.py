"""The NetworkPolicies of every case of the chart, evaluated for every workload's pod template.

A small evaluator follows NetworkPolicy semantics: a pod is isolated in a direction when a
policy of its namespace selects it with that policy type; an isolated pod's traffic is
allowed when any rule of any selecting policy allows it (rules OR'ed; within a rule, the
peers OR'ed and the ports OR'ed; no peers = every peer, no ports = every port); a
connection between two pods needs the egress of one and the ingress of the other. ipBlock
peers match only addresses outside the cluster (what they match among pod addresses is up
to the network plugin). The evaluator is itself tested as a decision table, so that the
manifest checks built on it can fail.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from chart import CASES, WORKLOADS, objects, pod_template, values

NAME = "kubernetes.io/metadata.name"
PART_OF = "app.kubernetes.io/part-of"
Direction = Literal["Ingress", "Egress"]
DIRECTIONS: tuple[Direction, ...] = ("Ingress", "Egress")


@dataclass(frozen=True)
class Endpoint:
    """One side of a connection: a pod (its namespace and labels) or an outside address."""

    namespace: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None

    @classmethod
    def pod(cls, namespace: str, labels: Mapping[str, str]) -> Endpoint:
        return cls(namespace=namespace, labels=dict(labels))

    @classmethod
    def outside(cls, ip: str) -> Endpoint:
        return cls(namespace=None, ip=ip)


@dataclass(frozen=True)
class Cluster:
    """The NetworkPolicies, and the labels of each namespace as the API server keeps them."""

    policies: list[dict[str, Any]]
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)

    def namespace_labels(self, name: str) -> dict[str, str]:
        # The API server labels every namespace with its name.
        return {**self.namespaces.get(name, {}), NAME: name}


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels AND matchExpressions; {} selects everything)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def policy_types(policy: Mapping[str, Any]) -> set[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        return set(spec["policyTypes"])
    return {"Ingress"} | ({"Egress"} if spec.get("egress") else set())


def selecting(cluster: Cluster, pod: Endpoint, direction: Direction) -> list[dict[str, Any]]:
    """The policies that isolate `pod` in `direction`."""
    return [
        p
        for p in cluster.policies
        if p["metadata"]["namespace"] == pod.namespace
        and direction in policy_types(p)
        and selects(p["spec"]["podSelector"], pod.labels)
    ]


def _peer_matches(
    peer: Mapping[str, Any], *, policy_namespace: str, other: Endpoint, cluster: Cluster
) -> bool:
    if "ipBlock" in peer:
        if other.ip is None:
            return False
        ip = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(e) for e in block.get("except") or []
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], cluster.namespace_labels(other.namespace))
    else:
        in_namespace = other.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector") or {}, other.labels)


def _port_matches(entry: Mapping[str, Any], port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    if isinstance(entry["port"], str):
        raise ValueError(f"named port {entry['port']!r}: the evaluator takes numbers only")
    return bool(entry["port"] <= port <= entry.get("endPort", entry["port"]))


def allowed(
    cluster: Cluster,
    *,
    pod: Endpoint,
    other: Endpoint,
    port: int,
    protocol: str,
    direction: Direction,
) -> bool:
    """Whether `pod`'s policies let traffic go to (Egress) or come from (Ingress) `other`."""
    policies = selecting(cluster, pod, direction)
    if not policies:
        return True
    rules_key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in policies:
        for rule in policy["spec"].get(rules_key) or []:
            ports = rule.get("ports") or []
            if ports and not any(_port_matches(e, port, protocol) for e in ports):
                continue
            peers = rule.get(peers_key) or []
            namespace = policy["metadata"]["namespace"]
            if not peers or any(
                _peer_matches(p, policy_namespace=namespace, other=other, cluster=cluster)
                for p in peers
            ):
                return True
    return False


def connects(
    cluster: Cluster, src: Endpoint, dst: Endpoint, *, port: int, protocol: str = "TCP"
) -> bool:
    """The source's egress, and the destination's ingress where the destination is a pod."""
    out = allowed(cluster, pod=src, other=dst, port=port, protocol=protocol, direction="Egress")
    if dst.namespace is None:
        return out
    into = allowed(cluster, pod=dst, other=src, port=port, protocol=protocol, direction="Ingress")
    return out and into


# --- the evaluator, as decision tables --------------------------------------------------


def _policy(
    selector: Mapping[str, Any],
    types: list[str] | None,
    *,
    egress: list[Any] | None = None,
    ingress: list[Any] | None = None,
    namespace: str = "team",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector}
    if types is not None:
        spec["policyTypes"] = types
    if egress is not None:
        spec["egress"] = egress
    if ingress is not None:
        spec["ingress"] = ingress
    return {"kind": "NetworkPolicy", "metadata": {"namespace": namespace}, "spec": spec}


WEB = Endpoint.pod("team", {"app": "web"})
DENY_EGRESS = _policy({}, ["Egress"])
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
DB_PEER = {
    "namespaceSelector": {"matchLabels": {NAME: "data"}},
    "podSelector": {"matchLabels": {"app": "db"}},
}
DB = Endpoint.pod("data", {"app": "db"})
OUTSIDE = Endpoint.outside("203.0.113.9")

SELECTOR_CASES = [
    ({}, {}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchLabels": {"a": "1"}}, {}, False),
    (
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
        {"a": "2"},
        True,
    ),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "3"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    (
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [{"key": "b", "operator": "Exists"}],
        },
        {"a": "1"},
        False,
    ),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), SELECTOR_CASES)
def test_label_selector(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert selects(selector, labels) is expected


def test_an_unknown_selector_operator_is_an_error() -> None:
    with pytest.raises(ValueError, match="Gt"):
        selects({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {})


def _egress(*rules: dict[str, Any]) -> dict[str, Any]:
    """A policy that selects every pod of `team` for egress, with these rules."""
    return _policy({}, ["Egress"], egress=list(rules))


def _to(*peers: dict[str, Any], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"to": list(peers)}
    if ports is not None:
        rule["ports"] = ports
    return rule


def _ns(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAME: name}}}


def _pods(**labels: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": labels}}


def _cidr(cidr: str, *excepted: str) -> dict[str, Any]:
    return {"ipBlock": {"cidr": cidr, "except": list(excepted)}}


P5432 = [{"port": 5432}]
A_CACHE = Endpoint.pod("data", {"app": "cache"})
DEV_DB = Endpoint.pod("dev", {"app": "db"})
TEAM_DB = Endpoint.pod("team", {"app": "db"})
WEB_ONLY = {"matchLabels": {"app": "web"}}
OTHER_ONLY = {"matchLabels": {"app": "other"}}
# (policies, destination, port, protocol, allowed?), one case per rule of the semantics
EGRESS_CASES = [
    pytest.param([_policy(OTHER_ONLY, ["Egress"])], OUTSIDE, 80, "TCP", True, id="not-selected"),
    pytest.param(
        [_policy({}, ["Egress"], namespace="other")], OUTSIDE, 80, "TCP", True, id="other-namespace"
    ),
    pytest.param([DENY_EGRESS], OUTSIDE, 53, "UDP", False, id="egress-type-no-rules-denies"),
    pytest.param(
        [DENY_EGRESS, _egress({"ports": DNS_PORTS})], OUTSIDE, 53, "UDP", True, id="ports-only"
    ),
    pytest.param([_egress({"ports": DNS_PORTS})], OUTSIDE, 80, "TCP", False, id="other-port"),
    pytest.param(
        [_egress({"ports": [{"port": 53}]})], OUTSIDE, 53, "UDP", False, id="protocol-is-tcp"
    ),
    pytest.param(
        [_egress({"ports": [{"port": 32000, "endPort": 32768}]})],
        OUTSIDE,
        32100,
        "TCP",
        True,
        id="port-range",
    ),
    pytest.param(
        [_egress({"ports": [{"protocol": "UDP"}]})], OUTSIDE, 123, "UDP", True, id="any-udp-port"
    ),
    pytest.param([_egress({})], OUTSIDE, 80, "TCP", True, id="empty-rule"),
    pytest.param([_egress(_to(ports=[{"port": 80}]))], DB, 80, "TCP", True, id="empty-to"),
    pytest.param(
        [_egress({"ports": DNS_PORTS}, _to(DB_PEER, ports=P5432))],
        DB,
        5432,
        "TCP",
        True,
        id="rules-ored",
    ),
    pytest.param([_egress(_to(DB_PEER))], A_CACHE, 5432, "TCP", False, id="peer-and-other-pod"),
    pytest.param([_egress(_to(DB_PEER))], DEV_DB, 5432, "TCP", False, id="peer-and-other-ns"),
    pytest.param([_egress(_to(DB_PEER, _ns("data")))], A_CACHE, 5432, "TCP", True, id="peers-ored"),
    pytest.param([_egress(_to(_pods(app="db")))], DB, 5432, "TCP", False, id="pod-peer-own-ns"),
    pytest.param([_egress(_to(_pods(app="db")))], TEAM_DB, 5432, "TCP", True, id="pod-peer"),
    pytest.param(
        [_egress(_to({"namespaceSelector": {}}))], OUTSIDE, 443, "TCP", False, id="ns-not-outside"
    ),
    pytest.param([_egress(_to(_cidr("203.0.113.0/24")))], OUTSIDE, 5432, "TCP", True, id="ipblock"),
    pytest.param(
        [_egress(_to(_cidr("203.0.113.0/24", "203.0.113.8/29")))],
        OUTSIDE,
        5432,
        "TCP",
        False,
        id="ipblock-except",
    ),
    pytest.param([_egress(_to(_cidr("0.0.0.0/0")))], DB, 5432, "TCP", False, id="ipblock-no-pod"),
    pytest.param(
        [DENY_EGRESS, _policy(WEB_ONLY, ["Egress"], egress=[_to(DB_PEER)])],
        DB,
        5432,
        "TCP",
        True,
        id="union",
    ),
    pytest.param(
        [_policy({}, None, egress=[{"ports": DNS_PORTS}])],
        OUTSIDE,
        80,
        "TCP",
        False,
        id="implied-egress-type",
    ),
    pytest.param([_policy({}, None)], OUTSIDE, 80, "TCP", True, id="implied-ingress-only"),
    pytest.param([_policy({}, ["Ingress"])], OUTSIDE, 80, "TCP", True, id="ingress-type-only"),
]


@pytest.mark.parametrize(("policies", "dst", "port", "protocol", "expected"), EGRESS_CASES)
def test_egress_decision(
    policies: list[dict[str, Any]],
    dst: Endpoint,
    port: int,
    protocol: str,
    expected: bool,
) -> None:
    cluster = Cluster(policies)
    got = allowed(cluster, pod=WEB, other=dst, port=port, protocol=protocol, direction="Egress")
    assert got is expected


def test_a_connection_needs_egress_and_ingress() -> None:
    egress = _policy({}, ["Egress"], egress=[{"to": [DB_PEER], "ports": [{"port": 5432}]}])
    db_ingress = _policy(
        {"matchLabels": {"app": "db"}},
        ["Ingress"],
        ingress=[
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [
                                {"key": NAME, "operator": "In", "values": ["team", "ops"]}
                            ]
                        },
                        "podSelector": {"matchLabels": {"app": "web"}},
                    }
                ],
                "ports": [{"port": 5432}],
            }
        ],
        namespace="data",
    )
    assert connects(Cluster([egress]), WEB, DB, port=5432)
    assert connects(Cluster([egress, db_ingress]), WEB, DB, port=5432)
    assert not connects(Cluster([egress, db_ingress]), WEB, DB, port=5433)
    assert not connects(Cluster([db_ingress]), Endpoint.pod("dev", {"app": "web"}), DB, port=5432)
    assert not connects(Cluster([db_ingress]), Endpoint.pod("team", {"app": "x"}), DB, port=5432)


def test_a_named_port_is_refused_rather_than_guessed() -> None:
    cluster = Cluster([_policy({}, ["Egress"], egress=[{"ports": [{"port": "metrics"}]}])])
    with pytest.raises(ValueError, match="named port"):
        allowed(cluster, pod=WEB, other=OUTSIDE, port=9400, protocol="TCP", direction="Egress")


# --- the rendered cases -----------------------------------------------------------------

DNS = Endpoint.pod("kube-system", {"k8s-app": "kube-dns"})
NODE_LOCAL_DNS = Endpoint.outside("169.254.20.10")
API_SERVER = Endpoint.outside("192.0.2.10")
EXTERNAL_DB = Endpoint.outside("198.51.100.7")
ELSEWHERE = Endpoint.outside("203.0.113.9")
SOME_POD = Endpoint.pod("default", {"app": "anything"})
PROMETHEUS = Endpoint.pod("monitoring", {"app.kubernetes.io/name": "prometheus"})


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str
    component: str
    pod: Endpoint


@dataclass(frozen=True)
class Needs:
    """Where a case's pods must be able to go, from its values: the database (the
    in-cluster pod, else an address of database.external.cidrs, else any address) and its
    port, the API server (an address of networkPolicy.apiServer.cidrs, else any address),
    the DNS addresses besides the kube-dns pods, and each metrics port."""

    database: Endpoint
    db_port: int
    api_server: Endpoint
    dns: tuple[Endpoint, ...]
    metrics: dict[str, int]
    # the finance pods' HTTPS to any address (an object store not narrowed to its addresses)
    finance_https_anywhere: bool = False


def _inside(cidrs: list[str], default: Endpoint) -> Endpoint:
    if not cidrs:
        return default
    net = ipaddress.ip_network(cidrs[0])
    return Endpoint.outside(str(net.network_address + (1 if net.num_addresses > 2 else 0)))


def needs_of(case: str, workloads: list[Workload]) -> Needs:
    v = values(case)
    postgres = [w.pod for w in workloads if w.component == "postgres"]
    external = v["database"]["external"]
    np = v["networkPolicy"]
    store = v["finance"]["objectStore"]
    return Needs(
        database=postgres[0] if postgres else _inside(external["cidrs"], EXTERNAL_DB),
        db_port=5432 if postgres else external["port"],
        api_server=_inside(np["apiServer"]["cidrs"], API_SERVER),
        dns=(DNS, *(_inside([c], DNS) for c in np["dns"]["cidrs"])),
        metrics={"watcher": v["watcher"]["metricsPort"], "sampler": v["sampler"]["metricsPort"]},
        finance_https_anywhere=store["enabled"] and not store["cidrs"],
    )


def cluster_of(objs: list[dict[str, Any]]) -> Cluster:
    return Cluster(
        policies=[o for o in objs if o["kind"] == "NetworkPolicy"],
        namespaces={
            o["metadata"]["name"]: o["metadata"].get("labels") or {}
            for o in objs
            if o["kind"] == "Namespace"
        },
    )


def workloads_of(objs: list[dict[str, Any]]) -> list[Workload]:
    found = []
    for o in objs:
        if o["kind"] not in WORKLOADS:
            continue
        labels = pod_template(o)["metadata"].get("labels") or {}
        meta = o["metadata"]
        component = meta["labels"]["app.kubernetes.io/component"]
        pod = Endpoint.pod(meta["namespace"], labels)
        found.append(Workload(o["kind"], meta["name"], component, pod))
    return found


def problems(cluster: Cluster, w: Workload, needs: Needs) -> list[str]:
    """What the workload needs and may not do, and what it may do and does not need."""
    found = []

    def need(what: str, dst: Endpoint, port: int, protocol: str = "TCP") -> None:
        if not connects(cluster, w.pod, dst, port=port, protocol=protocol):
            found.append(f"no {what} ({protocol} {port})")

    def refuse(what: str, dst: Endpoint, port: int, protocol: str = "TCP") -> None:
        if connects(cluster, w.pod, dst, port=port, protocol=protocol):
            found.append(f"{what} allowed ({protocol} {port})")

    for direction in DIRECTIONS:
        if not selecting(cluster, w.pod, direction):
            found.append(f"not isolated for {direction}")
    for dns in needs.dns:
        need("DNS" if dns is DNS else f"DNS at {dns.ip}", dns, 53, "UDP")
        need("DNS" if dns is DNS else f"DNS at {dns.ip}", dns, 53, "TCP")
    need("database", needs.database, needs.db_port)
    for port in (443, 6443):
        (need if w.component == "watcher" else refuse)("API server", needs.api_server, port)
    refuse("DNS elsewhere", SOME_POD, 53, "UDP")
    refuse("DNS elsewhere", ELSEWHERE, 53, "UDP")
    refuse("the web", ELSEWHERE, 80)
    if needs.database != EXTERNAL_DB:
        refuse("the database port elsewhere", EXTERNAL_DB, needs.db_port)
    if needs.api_server != API_SERVER and w.component == "watcher":
        refuse("the API port elsewhere", API_SERVER, 6443)
    metrics = needs.metrics.get(w.component)
    if metrics is not None and not connects(cluster, PROMETHEUS, w.pod, port=metrics):
        found.append(f"no metrics scrape ({metrics})")
    if metrics is None and connects(cluster, PROMETHEUS, w.pod, port=8080):
        found.append("ingress allowed")
    return found


EXPECTED_POLICIES = {
    "watcher": ["default-deny", "allow-dns-and-database", "watcher-api-and-metrics"],
    "sampler": ["default-deny", "allow-dns-and-database", "sampler"],
    "audit": ["default-deny", "allow-dns-and-database"],
    "finance": ["default-deny", "allow-dns-and-database"],
    "rollup": ["default-deny", "allow-dns-and-database"],
    "migrate": ["default-deny", "allow-dns-and-database"],
    "postgres": ["default-deny", "postgres"],
}


@pytest.mark.parametrize("case", CASES)
def test_which_policies_select_each_workload(case: str) -> None:
    objs = objects(case)
    cluster = cluster_of(objs)
    got = {
        w.component: sorted(
            {p["metadata"]["name"] for d in DIRECTIONS for p in selecting(cluster, w.pod, d)}
        )
        for w in workloads_of(objs)
    }
    expected = {c: sorted(EXPECTED_POLICIES[c]) for c in got}
    if values(case)["finance"]["objectStore"]["enabled"]:
        expected["finance"] = sorted([*expected["finance"], "finance-object-store"])
    assert got == expected
    assert {"watcher", "sampler", "audit", "finance", "rollup", "migrate"} <= set(got)
    assert ("postgres" in got) is (values(case)["database"]["type"] == "postgres")


@pytest.mark.parametrize("case", CASES)
def test_every_workload_reaches_what_it_needs_and_nothing_else(case: str) -> None:
    objs = objects(case)
    cluster = cluster_of(objs)
    found = workloads_of(objs)
    needs = needs_of(case, found)
    auditor = [w for w in found if w.component != "postgres"]
    assert len(auditor) == 6
    # the documented trade-off of an object store not narrowed to its addresses: 443 to any
    # address includes the API server's Service port (the finance pod mounts no token)
    expected = {
        f"{w.kind}/{w.name}": (
            ["API server allowed (TCP 443)"]
            if w.component == "finance" and needs.finance_https_anywhere
            else []
        )
        for w in auditor
    }
    assert {f"{w.kind}/{w.name}": problems(cluster, w, needs) for w in auditor} == expected


def test_node_local_dns_is_reached_at_its_link_local_address() -> None:
    """NodeLocal DNSCache answers from the node (hostNetwork), not from a kube-dns pod."""
    for case in CASES:
        objs = objects(case)
        cluster = cluster_of(objs)
        for w in workloads_of(objs):
            if w.component != "postgres":
                assert connects(cluster, w.pod, NODE_LOCAL_DNS, port=53, protocol="UDP"), case
                assert not connects(cluster, w.pod, NODE_LOCAL_DNS, port=80), case
    objs = objects("postgres", "json:networkPolicy.dns.cidrs=[]")
    (audit,) = [w for w in workloads_of(objs) if w.component == "audit"]
    assert not connects(cluster_of(objs), audit.pod, NODE_LOCAL_DNS, port=53, protocol="UDP")


def test_postgres_takes_the_auditor_and_nothing_else() -> None:
    objs = objects("postgres")
    cluster = cluster_of(objs)
    found = workloads_of(objs)
    postgres = needs_of("postgres", found).database
    assert postgres.namespace == "gpu-auditor"
    for w in found:
        if w.component != "postgres":
            assert connects(cluster, w.pod, postgres, port=5432), w.name
    for stranger in (
        SOME_POD,
        Endpoint.pod("gpu-auditor", {"run": "debug"}),
        Endpoint.pod("gpu-auditor-node", {"run": "debug"}),
        Endpoint.pod("other", {PART_OF: "gpu-waste-auditor"}),
    ):
        assert not connects(cluster, stranger, postgres, port=5432), stranger
    for dst, port, protocol in ((DNS, 53, "UDP"), (ELSEWHERE, 443, "TCP"), (postgres, 5432, "TCP")):
        assert not allowed(
            cluster, pod=postgres, other=dst, port=port, protocol=protocol, direction="Egress"
        )


@pytest.mark.parametrize("case", CASES)
def test_a_template_without_the_selected_label_is_caught(case: str) -> None:
    objs = objects(case)
    audit = next(
        o for o in objs if o["kind"] == "CronJob" and o["metadata"]["name"] == "auditor-audit"
    )
    del pod_template(audit)["metadata"]["labels"][PART_OF]
    cluster = cluster_of(objs)
    found = workloads_of(objs)
    (w,) = [w for w in found if w.name == "auditor-audit"]
    needs = needs_of(case, found)
    assert problems(cluster, w, needs)[:3] == [
        "no DNS (UDP 53)",
        "no DNS (TCP 53)",
        f"no DNS at {needs.dns[1].ip} (UDP 53)",
    ]
    assert f"no database (TCP {needs.db_port})" in problems(cluster, w, needs)


def test_an_external_database_narrowed_to_its_addresses() -> None:
    """database.external.cidrs: the database port to those addresses and no others."""
    objs = objects("external-db", "database.external.cidrs={10.20.30.0/24}")
    cluster = cluster_of(objs)
    found = workloads_of(objs)
    database = Endpoint.outside("10.20.30.40")
    needs = needs_of("external-db", found)
    narrowed = Needs(database, 5432, needs.api_server, needs.dns, needs.metrics)
    for w in found:
        assert problems(cluster, w, narrowed) == [], w.name
        assert not connects(cluster, w.pod, EXTERNAL_DB, port=5432), w.name
    # and unnarrowed, any address (the manifests cannot know where the database is)
    wide = objects("external-db")
    for w in workloads_of(wide):
        assert connects(cluster_of(wide), w.pod, EXTERNAL_DB, port=5432), w.name
