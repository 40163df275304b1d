"""The producers' deployment pieces: the contrib Collector (deploy/otelcol-contrib-gateway.yaml) with
k8sattributes, hostmetrics and kubeletstats, and Istio's mesh config (deploy/istio-mesh-config.yaml) that sends
the proxies' spans, tagged by deploy/istio-telemetry.yaml, to it; and the RBAC that --kube-api needs."""

import pytest
import yaml

from tests.deploy import test_deploy
from tests.deploy.test_deploy import DEPLOY, load, validate_otelcol

# The contrib components' fields, after their READMEs and config.go in open-telemetry/opentelemetry-collector-contrib
# (receiver/hostmetricsreceiver, receiver/kubeletstatsreceiver, processor/k8sattributesprocessor,
# processor/resourceprocessor).
METRICS_TOGGLES = "map"  # metric name -> {enabled: bool}
SCRAPER = {"metrics": METRICS_TOGGLES, "resource_attributes": "map", "include": "map", "exclude": "map"}
CONTRIB = {
    "receivers": {
        "hostmetrics": {"collection_interval": "duration", "initial_delay": "duration", "root_path": "str",
                        "scrapers": {s: SCRAPER for s in ("cpu", "disk", "filesystem", "load", "memory", "network",
                                                          "paging", "processes", "process", "system")}},
        "kubeletstats": {"collection_interval": "duration", "initial_delay": "duration", "auth_type": "str",
                         "endpoint": "str", "insecure_skip_verify": "bool", "metric_groups": "list",
                         "metrics": METRICS_TOGGLES, "extra_metadata_labels": "list", "k8s_api_config": "map",
                         "node": "str", "ca_file": "str", "cert_file": "str", "key_file": "str"},
    },
    "processors": {
        "k8sattributes": {"auth_type": "str", "passthrough": "bool", "filter": "map", "extract": "map",
                          "pod_association": "list", "exclude": "map", "wait_for_metadata": "bool",
                          "wait_for_metadata_timeout": "duration"},
        "resource": {"attributes": "list"},
    },
}
# The signals of the list that these receivers write, and the receiver writing each.
RECEIVER_METRICS = {
    "system.cpu.utilization": ("hostmetrics", "cpu"), "system.cpu.load_average.1m": ("hostmetrics", "load"),
    "system.memory.utilization": ("hostmetrics", "memory"), "system.paging.faults": ("hostmetrics", "paging"),
    "system.disk.io_time": ("hostmetrics", "disk"), "system.disk.operation_time": ("hostmetrics", "disk"),
    "system.network.errors": ("hostmetrics", "network"), "system.network.dropped": ("hostmetrics", "network"),
    "k8s.pod.cpu.usage": ("kubeletstats", "pod"), "k8s.pod.memory.working_set": ("kubeletstats", "pod"),
    "container.cpu.usage": ("kubeletstats", "container"),
    "container.memory.working_set": ("kubeletstats", "container")}
OPTIONAL_METRICS = {"system.cpu.utilization", "system.memory.utilization", "k8s.pod.cpu.usage", "container.cpu.usage"}


@pytest.fixture
def gateway(monkeypatch):
    for section, components in CONTRIB.items():
        for name, schema in components.items():
            monkeypatch.setitem(test_deploy.COMPONENTS[section], name, schema)
    (doc,) = load("otelcol-contrib-gateway.yaml")
    return doc


def test_the_contrib_gateway_config_is_valid(gateway):
    assert validate_otelcol(gateway) == []


def test_k8sattributes_associates_pods_by_ip_then_connection_and_adds_the_node(gateway):
    k8s = gateway["processors"]["k8sattributes"]
    sources = [s for rule in k8s["pod_association"] for s in rule["sources"]]
    assert {"from": "resource_attribute", "name": "k8s.pod.ip"} in sources and sources[-1] == {"from": "connection"}
    assert {"k8s.node.name", "k8s.pod.name", "k8s.namespace.name"} <= set(k8s["extract"]["metadata"])
    pipelines = gateway["service"]["pipelines"]
    assert "k8sattributes" in pipelines["traces"]["processors"]
    assert all(p["exporters"] == ["otlp_grpc/sloscope"] for p in pipelines.values())
    assert "sloscope-serve:4317" in gateway["exporters"]["otlp_grpc/sloscope"]["endpoint"]


@pytest.mark.parametrize("metric", sorted(RECEIVER_METRICS))
def test_every_listed_receiver_metric_is_collected(gateway, metric):
    receiver, part = RECEIVER_METRICS[metric]
    body = gateway["receivers"][receiver]
    if receiver == "hostmetrics":
        scraper = body["scrapers"]
        assert part in scraper
        toggles = (scraper[part] or {}).get("metrics") or {}
    else:
        assert part in body["metric_groups"]
        toggles = body.get("metrics") or {}
    if metric in OPTIONAL_METRICS:  # off by default in its receiver
        assert toggles.get(metric) == {"enabled": True}
    assert toggles.get(metric, {"enabled": True})["enabled"]


def test_node_metrics_carry_the_collectors_node(gateway):
    node_pipeline = gateway["service"]["pipelines"]["metrics/node"]
    assert set(node_pipeline["receivers"]) == {"hostmetrics", "kubeletstats"}
    (rule,) = gateway["processors"]["resource/node"]["attributes"]
    assert rule == {"key": "k8s.node.name", "value": "${env:K8S_NODE_NAME}", "action": "insert"}
    assert "${env:K8S_NODE_NAME}" in gateway["receivers"]["kubeletstats"]["endpoint"]


def test_the_mesh_sends_proxy_spans_with_the_tier_tag_to_the_gateway():
    (mesh,) = load("istio-mesh-config.yaml")
    (telemetry,) = load("istio-telemetry.yaml")
    config = mesh["spec"]["meshConfig"]
    providers = {p["name"]: p for p in config["extensionProviders"]}
    (tracing,) = telemetry["spec"]["tracing"]
    named = [p["name"] for p in tracing["providers"]]
    assert named and all(name in providers for name in named) and config["defaultProviders"]["tracing"] == named
    otel = providers[named[0]]["opentelemetry"]
    assert otel["service"].startswith("otel-gateway.") and otel["port"] == 4317
    assert tracing["customTags"]["slo.tier"]["header"]["name"] == "x-slo-tier"
    istiod_env = {e["name"]: e["value"] for e in mesh["spec"]["components"]["pilot"]["k8s"]["env"]}
    assert istiod_env["PILOT_SPAWN_UPSTREAM_SPAN_FOR_GATEWAY"] == "true"  # else gateways write no SERVER span


def test_serve_may_read_pods_and_nothing_else():
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "rbac-pods.yaml").read_text())}
    (rule,) = docs["ClusterRole"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    accounts = [d["metadata"] for d in load("serve.yaml") if d and d["kind"] == "ServiceAccount"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": a["name"], "namespace": a["namespace"]}
                                   for a in accounts]
