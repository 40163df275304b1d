"""The deployment files under deploy/: each parsed and checked for structure, against the documented schemas
of the components they configure."""

import re
from pathlib import Path

import pytest
import yaml

from sloscope.collectors import config as cfgmod
from sloscope.probes import registry
from sloscope.probes.base import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, Host, privilege_missing
from sloscope.slo_spec import DEFAULT_SPEC_YAML, parse_spec

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load(name):
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


# -- the OpenTelemetry Collector's configuration schema ------------------------------------------------------
#
# What each component accepts, after the component's config.schema.yaml in open-telemetry/opentelemetry-collector:
# receiver/otlpreceiver (protocols.grpc = config/configgrpc server_config incl. confignet addr_config;
# protocols.http = config/confighttp server_config + *_url_path), internal/memorylimiter (memory_limiter),
# processor/batchprocessor, exporter/otlpexporter (exporterhelper timeout_config + configgrpc client_config +
# retry_on_failure = config/configretry back_off_config + sending_queue = exporterhelper queuebatch config;
# tls = config/configtls client_config), exporter/otlphttpexporter (confighttp client_config + the signal
# endpoints + encoding). The leaves: a type name, or a nested mapping. Since v0.144.0 the OTLP exporters are
# `otlp_grpc` / `otlp_http`, with `otlp` / `otlphttp` as deprecated aliases.

DURATION = re.compile(r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$")  # Go's time.ParseDuration

TLS_CLIENT = {"insecure": "bool", "insecure_skip_verify": "bool", "server_name_override": "str", "ca_file": "str",
              "ca_pem": "str", "cert_file": "str", "cert_pem": "str", "key_file": "str", "key_pem": "str",
              "cipher_suites": "list", "curve_preferences": "list", "include_system_ca_certs_pool": "bool",
              "min_version": "str", "max_version": "str", "reload_interval": "duration", "tpm": "map"}
TLS_SERVER = {k: v for k, v in TLS_CLIENT.items() if k not in ("insecure", "insecure_skip_verify",
                                                                  "server_name_override")}
TLS_SERVER.update({"client_ca_file": "str", "client_ca_file_reload": "bool"})
GRPC_SERVER = {"endpoint": "str", "transport": "str", "dialer": "map", "tls": TLS_SERVER, "auth": "map",
               "include_metadata": "bool", "keepalive": "map", "max_concurrent_streams": "int",
               "max_recv_msg_size_mib": "int", "read_buffer_size": "int", "write_buffer_size": "int",
               "middlewares": "list"}
HTTP_SERVER = {"endpoint": "str", "tls": TLS_SERVER, "cors": "map", "auth": "map", "max_request_body_size": "int",
               "include_metadata": "bool", "response_headers": "map", "compression_algorithms": "list",
               "read_timeout": "duration", "read_header_timeout": "duration", "write_timeout": "duration",
               "idle_timeout": "duration", "keep_alives_enabled": "bool", "middlewares": "list",
               "traces_url_path": "str", "metrics_url_path": "str", "logs_url_path": "str"}
RETRY = {"enabled": "bool", "initial_interval": "duration", "max_interval": "duration",
         "max_elapsed_time": "duration", "max_retries": "int", "multiplier": "number", "randomization_factor": "number"}
QUEUE = {"enabled": "bool", "num_consumers": "int", "queue_size": "int", "sizer": "str", "storage": "str",
         "block_on_overflow": "bool", "wait_for_result": "bool", "batch": "map"}
GRPC_CLIENT = {"endpoint": "str", "compression": "str", "tls": TLS_CLIENT, "headers": "map", "keepalive": "map",
               "read_buffer_size": "int", "write_buffer_size": "int", "wait_for_ready": "bool",
               "balancer_name": "str", "authority": "str", "auth": "map", "middlewares": "list",
               "timeout": "duration", "retry_on_failure": RETRY, "sending_queue": QUEUE}
HTTP_CLIENT = {"endpoint": "str", "traces_endpoint": "str", "metrics_endpoint": "str", "logs_endpoint": "str",
               "encoding": "str", "tls": TLS_CLIENT, "headers": "map", "compression": "str", "timeout": "duration",
               "read_buffer_size": "int", "write_buffer_size": "int", "auth": "map", "proxy_url": "str",
               "max_idle_conns": "int", "idle_conn_timeout": "duration", "disable_keep_alives": "bool",
               "retry_on_failure": RETRY, "sending_queue": QUEUE}
MEMORY_LIMITER = {"check_interval": "duration", "limit_mib": "int", "spike_limit_mib": "int",
                  "limit_percentage": "int", "spike_limit_percentage": "int",
                  "min_gc_interval_when_soft_limited": "duration", "min_gc_interval_when_hard_limited": "duration",
                  "max_gc_interval_when_soft_limited": "duration", "max_gc_interval_when_hard_limited": "duration"}
BATCH = {"timeout": "duration", "send_batch_size": "int", "send_batch_max_size": "int", "metadata_keys": "list",
         "metadata_cardinality_limit": "int"}

COMPONENTS = {
    "receivers": {"otlp": {"protocols": {"grpc": GRPC_SERVER, "http": HTTP_SERVER}}},
    "processors": {"memory_limiter": MEMORY_LIMITER, "batch": BATCH},
    "exporters": {"otlp_grpc": GRPC_CLIENT, "otlp": GRPC_CLIENT, "otlp_http": HTTP_CLIENT, "otlphttp": HTTP_CLIENT},
}
PIPELINE_TYPES = ("traces", "metrics", "logs", "profiles")
ENV_REF = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}$")


def _leaf_ok(kind, value):
    if isinstance(value, str) and ENV_REF.match(value):
        return True  # expanded at load time
    return {"str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "duration": lambda v: isinstance(v, str) and bool(DURATION.match(v)),
            "list": lambda v: isinstance(v, list), "map": lambda v: isinstance(v, dict)}[kind](value)


def check_fields(schema, value, where, errors):
    if value is None:  # `grpc:` with nothing under it enables the protocol with defaults
        return
    if not isinstance(value, dict):
        errors.append(f"{where}: expected a mapping")
        return
    for key, v in value.items():
        if key not in schema:
            errors.append(f"{where}.{key}: not a field of this component")
        elif isinstance(schema[key], dict):
            check_fields(schema[key], v, f"{where}.{key}", errors)
        elif not _leaf_ok(schema[key], v):
            errors.append(f"{where}.{key}: {v!r} is not a {schema[key]}")


def expand(value):
    m = ENV_REF.match(value) if isinstance(value, str) else None
    return m.group(2) if m else value


def duration_s(text):
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text))


def validate_otelcol(doc) -> list[str]:
    """What the Collector would refuse in this configuration (and the wiring the docs recommend)."""
    errors: list[str] = []
    unknown = set(doc) - {"receivers", "processors", "exporters", "extensions", "connectors", "service"}
    errors += [f"{k}: not a top-level section" for k in sorted(unknown)]
    defined = {}
    for section, known in COMPONENTS.items():
        for cid, body in (doc.get(section) or {}).items():
            ctype = cid.split("/", 1)[0]
            defined[(section, cid)] = body
            if ctype not in known:
                errors.append(f"{section}.{cid}: unknown component type {ctype!r}")
                continue
            check_fields(known[ctype], body, f"{section}.{cid}", errors)
            body = body or {}
            if ctype == "otlp" and section == "receivers":
                if not (body.get("protocols") or {}).keys() & {"grpc", "http"}:
                    errors.append(f"{section}.{cid}: at least one of protocols.grpc, protocols.http is required")
            if ctype in ("otlp_grpc", "otlp") and section == "exporters" and not expand(body.get("endpoint")):
                errors.append(f"{section}.{cid}.endpoint: required")
            if ctype in ("otlp_http", "otlphttp") and not (
                    body.get("endpoint") or all(body.get(f"{s}_endpoint") for s in ("traces", "metrics", "logs"))):
                errors.append(f"{section}.{cid}.endpoint: required")
            if ctype == "memory_limiter":
                if not duration_s(str(body.get("check_interval", "0"))) > 0:
                    errors.append(f"{section}.{cid}.check_interval: must be greater than zero")
                if not (body.get("limit_mib") or body.get("limit_percentage")):
                    errors.append(f"{section}.{cid}: limit_mib or limit_percentage is required")
                if body.get("limit_percentage", 0) > 100 or body.get("spike_limit_percentage", 0) > 100:
                    errors.append(f"{section}.{cid}: percentages are at most 100")
                if body.get("limit_mib") and body.get("spike_limit_mib", 0) >= body["limit_mib"]:
                    errors.append(f"{section}.{cid}: spike_limit_mib must be below limit_mib")
                if body.get("limit_percentage") and body.get("spike_limit_percentage", 0) >= body["limit_percentage"]:
                    errors.append(f"{section}.{cid}: spike_limit_percentage must be below limit_percentage")
            if ctype == "batch" and body.get("send_batch_max_size") and \
                    body["send_batch_max_size"] < body.get("send_batch_size", 8192):
                errors.append(f"{section}.{cid}: send_batch_max_size must be >= send_batch_size")
    service = doc.get("service") or {}
    errors += [f"service.{k}: unknown" for k in set(service) - {"pipelines", "extensions", "telemetry"}]
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        errors.append("service.pipelines: required")
    used = set()
    for pid, p in pipelines.items():
        if pid.split("/", 1)[0] not in PIPELINE_TYPES:
            errors.append(f"service.pipelines.{pid}: unknown pipeline type")
        errors += [f"service.pipelines.{pid}.{k}: unknown" for k in set(p) - {"receivers", "processors", "exporters"}]
        for role, section in (("receivers", "receivers"), ("processors", "processors"), ("exporters", "exporters")):
            ids = p.get(role) or []
            if role != "processors" and not ids:
                errors.append(f"service.pipelines.{pid}.{role}: at least one is required")
            for cid in ids:
                if (section, cid) not in defined:
                    errors.append(f"service.pipelines.{pid}.{role}: {cid!r} is not defined under {section}")
                used.add((section, cid))
        procs = [c.split("/")[0] for c in p.get("processors") or []]
        if "memory_limiter" in procs and procs[0] != "memory_limiter":
            errors.append(f"service.pipelines.{pid}: memory_limiter must be the first processor")
        if "batch" in procs and procs[-1] != "batch":
            errors.append(f"service.pipelines.{pid}: batch should be the last processor")
    errors += [f"{s}.{c}: defined but used in no pipeline" for (s, c) in defined if (s, c) not in used]
    return errors


def test_otelcol_config_is_valid_for_the_collector():
    (doc,) = load("otelcol.yaml")
    assert validate_otelcol(doc) == []


def test_otelcol_pipelines_carry_everything_to_sloscope_serve():
    (doc,) = load("otelcol.yaml")
    protocols = doc["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    pipelines = doc["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics", "logs"}
    for p in pipelines.values():
        assert p["receivers"] == ["otlp"] and p["processors"] == ["memory_limiter", "batch"]
        (exporter,) = p["exporters"]
        assert exporter.split("/")[0] in ("otlp_grpc", "otlp", "otlp_http", "otlphttp")
        endpoint = expand(doc["exporters"][exporter]["endpoint"])
        assert endpoint.rsplit(":", 1)[1] == ("4317" if exporter.startswith("otlp_grpc") else "4318")
    limiter = doc["processors"]["memory_limiter"]
    assert limiter["check_interval"] and (limiter.get("limit_mib") or limiter.get("limit_percentage"))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["processors"]["memory_limiter"].pop("check_interval"), "check_interval: must be greater than zero"),
    (lambda d: d["processors"]["memory_limiter"].pop("limit_percentage"), "limit_mib or limit_percentage"),
    (lambda d: d["processors"]["batch"].update(timout="1s"), "batch.timout: not a field"),
    (lambda d: d["processors"]["batch"].update(timeout="2 seconds"), "is not a duration"),
    (lambda d: d["service"]["pipelines"]["logs"].update(exporters=["debug"]), "'debug' is not defined"),
    (lambda d: d["service"]["pipelines"]["traces"].update(processors=["batch", "memory_limiter"]),
     "memory_limiter must be the first"),
    (lambda d: d["exporters"]["otlp_grpc/sloscope"].pop("endpoint"), "endpoint: required"),
    (lambda d: d["exporters"]["otlp_grpc/sloscope"]["tls"].update(insecure="yes"), "is not a bool"),
    (lambda d: d["receivers"].update(jaeger={}), "unknown component type 'jaeger'"),
])
def test_the_schema_check_catches_mistakes(mutate, message):
    (doc,) = load("otelcol.yaml")
    mutate(doc)
    errors = validate_otelcol(doc)
    assert any(message in e for e in errors), errors


# -- the DaemonSet ----------------------------------------------------------------------------------------------

def daemonset_docs():
    return {d["kind"]: d for d in load("daemonset.yaml")}


def collector_container():
    ds = daemonset_docs()["DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return ds, ds["spec"]["template"]["spec"], container


def test_daemonset_documents():
    docs = daemonset_docs()
    assert set(docs) == {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"}
    assert docs["DaemonSet"]["apiVersion"] == "apps/v1"
    assert all(docs[k]["apiVersion"] == "v1" for k in ("Namespace", "ServiceAccount", "ConfigMap"))
    namespace = docs["Namespace"]["metadata"]["name"]
    assert all(d["metadata"]["namespace"] == namespace for k, d in docs.items() if k != "Namespace")
    ds, pod, _ = collector_container()
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]


def test_daemonset_privileges_are_exactly_what_ebpf_needs():
    _, pod, container = collector_container()
    assert pod["hostPID"] is True and not pod.get("hostNetwork") and not pod.get("hostIPC")
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    added = sc["capabilities"]["add"]
    assert sorted(added) == ["BPF", "PERFMON", "SYS_RESOURCE"] and "SYS_ADMIN" not in added
    assert sc["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    # what the probes themselves require of a process's capabilities is met by exactly these
    bits = {"BPF": CAP_BPF, "PERFMON": CAP_PERFMON, "SYS_ADMIN": CAP_SYS_ADMIN}

    class PodHost(Host):
        def euid(self):
            return sc["runAsUser"]

        def effective_capabilities(self):
            return sum(1 << bits[c] for c in added if c in bits)

    assert privilege_missing(PodHost()) is None


def test_daemonset_every_privilege_and_mount_is_explained():
    text = (DEPLOY / "daemonset.yaml").read_text().splitlines()

    def commented(pattern):
        i = next(i for i, line in enumerate(text) if re.search(pattern, line))
        return text[i - 1].strip().startswith("#")

    _, pod, container = collector_container()
    for cap in container["securityContext"]["capabilities"]["add"]:
        assert commented(rf"^\s*- {cap}$"), cap
    for mount in container["volumeMounts"]:
        if mount["name"] != "config":
            assert commented(rf"^\s*- name: {mount['name']}$"), mount["name"]
    assert commented(r"^\s*hostPID: true") and commented(r"^\s*runAsUser: 0")


def test_daemonset_mounts():
    _, pod, container = collector_container()
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert all(m["name"] in volumes for m in mounts.values())
    host = {path: volumes[m["name"]].get("hostPath", {}).get("path") for path, m in mounts.items()}
    for path in ("/sys/kernel/btf", "/sys/kernel/tracing", "/lib/modules", "/usr/src"):
        assert host[path] == path and mounts[path]["readOnly"] is True, path
    assert host["/var/tmp"] == "/var/tmp" and mounts["/var/tmp"]["readOnly"]  # SPDK's /var/tmp/spdk.sock
    spool = volumes[mounts["/var/lib/sloscope/spool"]["name"]]
    assert spool["hostPath"]["type"] == "DirectoryOrCreate" and not mounts["/var/lib/sloscope/spool"].get("readOnly")
    assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert "/proc" not in mounts  # hostPID makes the container's own /proc the node's
    writable = [p for p, m in mounts.items() if not m.get("readOnly") and host[p]]
    assert writable == ["/var/lib/sloscope/spool"]  # the only node path the collector writes


def test_daemonset_env_resources_and_tolerations():
    _, pod, container = collector_container()
    env = container["env"]
    names = [e["name"] for e in env]
    node = env[names.index("NODE_NAME")]
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    attrs = env[names.index("OTEL_RESOURCE_ATTRIBUTES")]["value"]
    assert "host.name=$(NODE_NAME)" in attrs and names.index("OTEL_RESOURCE_ATTRIBUTES") > names.index("NODE_NAME")
    res = container["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
    mib = {"Mi": 1, "Gi": 1024}
    size = lambda s: int(s[:-2]) * mib[s[-2:]]  # noqa: E731
    assert size(res["limits"]["memory"]) >= size(res["requests"]["memory"]) >= 256
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in pod["tolerations"])
    assert pod["terminationGracePeriodSeconds"] >= 15


def test_daemonset_runs_the_collector_with_its_configmap(tmp_path):
    from sloscope.commands.cli import build_parser

    docs = daemonset_docs()
    _, pod, container = collector_container()
    args = build_parser().parse_args(container["args"])
    assert container["command"] == ["sloscope"] and args.command == "collect"
    mount = next(m for m in container["volumeMounts"] if args.config.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    key = args.config[len(mount["mountPath"]) + 1:]
    path = tmp_path / key
    path.write_text(docs["ConfigMap"]["data"][key])
    cfg = cfgmod.load(str(path), environ={"NODE_NAME": "n1"})
    assert cfg.protocol == "grpc" and cfg.endpoint.endswith(":4317")
    assert cfg.spool_dir == "/var/lib/sloscope/spool"
    assert any(m["mountPath"] == cfg.spool_dir for m in container["volumeMounts"])
    assert set(cfg.probe_options) <= set(registry.PROBES)
    assert cfg.probe_options["tcp_connections"]["proc"] == "/proc/1"


# -- Istio ------------------------------------------------------------------------------------------------------

TRACING_FIELDS = {"match", "providers", "customTags", "disableSpanReporting", "randomSamplingPercentage",
                  "useRequestIdForTraceSampling", "enableIstioTags"}  # telemetry.istio.io/v1 Tracing


def test_istio_telemetry_tags_spans_with_the_slo_tier():
    (doc,) = load("istio-telemetry.yaml")
    assert doc["apiVersion"] == "telemetry.istio.io/v1" and doc["kind"] == "Telemetry"
    assert doc["metadata"]["namespace"] == "istio-system"  # the root namespace: mesh-wide
    (tracing,) = doc["spec"]["tracing"]
    assert set(tracing) <= TRACING_FIELDS
    assert all(set(p) == {"name"} for p in tracing["providers"])
    assert 0 <= tracing["randomSamplingPercentage"] <= 100
    tag = tracing["customTags"]["slo.tier"]
    assert list(tag) == ["header"]  # exactly one of literal, environment, header
    assert set(tag["header"]) == {"name", "defaultValue"} and tag["header"]["name"] == "x-slo-tier"
    spec = parse_spec(DEFAULT_SPEC_YAML)
    assert tag["header"]["defaultValue"] == spec.default_tier
