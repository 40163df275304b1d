"""The manifests for the whole pipeline under deploy/: one image version everywhere, and every name, port,
label and volume that one manifest takes from another (the Service and its pods, probes and listeners, the
claim of the store, the monitors and what they scrape, the gateway and serve, the Grafana ConfigMaps and the
dashboards of today)."""

import json

import yaml

from sloscope.collectors import config as cfgmod
from tests.deploy.test_deploy import DEPLOY, expand, load

# another ----------------------------------------------------------------------------------------------------------

K8S_MANIFESTS = ("daemonset.yaml", "serve.yaml", "monitoring.yaml", "grafana-dashboards.yaml", "istio-telemetry.yaml",
                 "networkpolicy.yaml")
IMAGE_REPOSITORY = "ghcr.io/sloscope/sloscope"


def pyproject_version():
    import tomllib

    return tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["version"]


def manifests():
    return [(name, doc) for name in K8S_MANIFESTS for doc in load(name) if doc]


def find(kind, name):
    (doc,) = [d for _, d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_of(workload):
    return workload["spec"]["template"]


def container_ports(pod):
    return {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


def selects(selector, labels):
    return selector.items() <= labels.items()


def test_every_container_runs_the_image_of_this_version():
    """The DaemonSet runs the node agent's image (scripts/build-image.sh builds both), everything else the
    server's."""
    from sloscope.commands.cli import package_version

    images = {(d["kind"], c["image"]) for _, d in manifests() if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
              for c in pod_of(d)["spec"]["containers"]}
    version = pyproject_version()
    assert {kind for kind, _ in images} >= {"Deployment", "DaemonSet"}
    assert images == {(kind, f"{IMAGE_REPOSITORY}{'-agent' if kind == 'DaemonSet' else ''}:{version}")
                      for kind, _ in images} and package_version() == version


def test_every_namespaced_object_lives_in_the_namespace_the_daemonset_file_creates():
    (namespace,) = [d["metadata"]["name"] for _, d in manifests() if d["kind"] == "Namespace"]
    others = [(n, d["kind"]) for n, d in manifests() if d["kind"] != "Namespace" and n != "istio-telemetry.yaml"
              and d["metadata"].get("namespace") != namespace]
    assert others == []


def test_serve_listens_inside_the_pod_where_its_service_and_probes_point():
    from sloscope.commands.cli import build_parser

    deployment, service = find("Deployment", "sloscope-serve"), find("Service", "sloscope-serve")
    pod = pod_of(deployment)
    (container,) = pod["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"  # one writer
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    args = build_parser("serve").parse_args(container["args"])
    assert container["command"] == ["sloscope"] and args.command == "serve"
    ports = container_ports(pod)
    listeners = {"otlp-http": args.http, "otlp-grpc": args.grpc}
    for name, address in listeners.items():
        host, port = address.rsplit(":", 1)
        assert host == "0.0.0.0" and int(port) == ports[name], name  # all interfaces, on the declared port
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    probes = {k: container[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    assert all(p["port"] == "otlp-http" for p in probes.values())


def test_serve_keeps_its_store_on_the_claim():
    from sloscope.commands.cli import build_parser

    pod = pod_of(find("Deployment", "sloscope-serve"))
    (container,) = pod["spec"]["containers"]
    db = str(build_parser("serve").parse_args(container["args"]).db)
    (mount,) = [m for m in container["volumeMounts"] if db.startswith(m["mountPath"] + "/")]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    claim = find("PersistentVolumeClaim", volumes[mount["name"]]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    assert all(m["name"] in volumes for m in container["volumeMounts"])
    assert container["securityContext"]["readOnlyRootFilesystem"] and "/tmp" in {
        m["mountPath"] for m in container["volumeMounts"]}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] and pod["spec"]["securityContext"]["fsGroup"]


def test_the_gateway_sends_to_the_serve_service():
    (doc,) = load("otelcol.yaml")
    service = find("Service", "sloscope-serve")
    host, port = expand(doc["exporters"]["otlp_grpc/sloscope"]["endpoint"]).rsplit(":", 1)
    assert host in (service["metadata"]["name"], f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc")
    assert int(port) == next(p["port"] for p in service["spec"]["ports"] if p["name"] == "otlp-grpc")


def test_collector_telemetry_is_where_its_probes_and_pod_monitor_look():
    from sloscope.commands.cli import build_parser

    pod = pod_of(find("DaemonSet", "sloscope-collector"))
    (container,) = pod["spec"]["containers"]
    host, port = cfgmod.parse_listen(build_parser("collect").parse_args(container["args"]).listen, "--listen").rsplit(
        ":", 1)
    assert host == "0.0.0.0" and container_ports(pod) == {"telemetry": int(port)}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "telemetry"}
    monitor = find("PodMonitor", "sloscope-collector")
    assert selects(monitor["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {**endpoint, "port": "telemetry", "path": "/metrics"}


def test_the_service_monitor_scrapes_serve_metrics_port():
    monitor, service = find("ServiceMonitor", "sloscope-serve"), find("Service", "sloscope-serve")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_grafana_configmaps_are_the_dashboards_of_today():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", DEPLOY.parent / "scripts" / "render-grafana-configmaps.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    assert (DEPLOY / "grafana-dashboards.yaml").read_text() == render.render(), \
        "run scripts/render-grafana-configmaps.py"
    docs = {d["metadata"]["name"]: d for d in load("grafana-dashboards.yaml")}
    provider = yaml.safe_load(docs.pop("sloscope-grafana-provider")["data"]["sloscope.yaml"])
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"] == render.DASHBOARDS_PATH
    uids = set()
    for doc in docs.values():
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = doc["data"].items()
        board = json.loads(text)
        assert key == f"{board['uid']}.json"
        uids.add(board["uid"])
    assert len(uids) == 3


def test_serve_asks_for_the_token_that_its_senders_send():
    """serve reads its bearer token from the Secret's volume; the gateway's exporter and the ServiceMonitor send
    the same Secret's token."""
    from sloscope.commands.cli import build_parser

    pod = pod_of(find("Deployment", "sloscope-serve"))
    (container,) = pod["spec"]["containers"]
    token_file = str(build_parser("serve").parse_args(container["args"]).bearer_token_file)
    (mount,) = [m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert mount["readOnly"] and [i["path"] for i in secret["items"]] == [token_file.rsplit("/", 1)[1]]
    (key,) = [i["key"] for i in secret["items"]]
    (endpoint,) = find("ServiceMonitor", "sloscope-serve")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": secret["secretName"], "key": key}}
    for config in ("otelcol.yaml", "otelcol-contrib-gateway.yaml"):
        (doc,) = load(config)
        assert doc["exporters"]["otlp_grpc/sloscope"]["headers"] == {"authorization": "Bearer ${env:SLOSCOPE_TOKEN}"}


def test_only_labelled_clients_and_prometheus_reach_serve_ports():
    policy, pod = find("NetworkPolicy", "sloscope-serve"), pod_of(find("Deployment", "sloscope-serve"))
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == set(container_ports(pod))  # by name, every port serve opens
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [
        {"sloscope.io/client": "true"}, {"app.kubernetes.io/name": "prometheus"}]
