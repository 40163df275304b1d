"""The node collector's configuration: defaults, file, environment and flags in order of precedence, clear
errors for bad values, and the resource attributes they give."""

import pytest

from sloscope.collectors import config as cfgmod
from sloscope.collectors.agent import build_resource


def write_config(tmp_path, text):
    path = tmp_path / "collector.yaml"
    path.write_text(text)
    return str(path)


def test_defaults():
    cfg = cfgmod.load(environ={})
    assert (cfg.endpoint, cfg.protocol, cfg.timeout_s, cfg.interval_s, cfg.probes, cfg.temporality) == (
        "http://localhost:4317", "grpc", 10.0, 5.0, ("auto",), "cumulative")
    assert cfgmod.load(flags={"protocol": "http/protobuf"}, environ={}).endpoint == "http://localhost:4318/v1/metrics"


def test_precedence_flags_over_env_over_file(tmp_path):
    path = write_config(tmp_path, """
endpoint: http://file-collector:4318
protocol: http/protobuf
timeout: 3s
interval: 2s
headers: {x-from: file}
probes: [pressure, netstat]
cgroups: [/sys/fs/cgroup/kubepods.slice]
spool: {dir: /var/lib/sloscope/spool, max_bytes: 64MiB, max_batches: 500}
temporality: delta
resource: {k8s.cluster.name: prod}
""")
    cfg = cfgmod.load(path, environ={})
    assert cfg.endpoint == "http://file-collector:4318/v1/metrics" and cfg.protocol == "http/protobuf"
    assert (cfg.timeout_s, cfg.interval_s, cfg.headers) == (3.0, 2.0, {"x-from": "file"})
    assert (cfg.spool_dir, cfg.spool_max_bytes, cfg.spool_max_batches) == ("/var/lib/sloscope/spool", 64 * 2**20, 500)
    assert cfg.probe_options == {"syscall": {"cgroups": ["/sys/fs/cgroup/kubepods.slice"]}}
    assert cfg.temporality == "delta" and cfg.resource == {"k8s.cluster.name": "prod"}

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4318/", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-from=env", "NODE_NAME": "gpu-node-3",
           "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    cfg = cfgmod.load(path, environ=env)
    assert cfg.endpoint == "http://env-collector:4318/v1/metrics"
    assert cfg.timeout_s == 2.5 and cfg.interval_s == 1.0  # milliseconds, as the specification says
    assert cfg.headers == {"authorization": "Bearer abc", "x-from": "env"}
    assert cfg.node_name == "gpu-node-3" and cfg.sources["endpoint"] == "OTEL_EXPORTER_OTLP_ENDPOINT"

    cfg = cfgmod.load(path, flags={"endpoint": "http://flag:4318/custom/v1/metrics", "timeout_s": 7.0,
                                   "headers": {"x-from": "flag"}, "node_name": "n9", "interval_s": None}, environ=env)
    assert cfg.endpoint == "http://flag:4318/custom/v1/metrics" and cfg.timeout_s == 7.0
    assert cfg.headers == {"x-from": "flag"} and cfg.node_name == "n9" and cfg.interval_s == 1.0
    assert cfg.sources["endpoint"] == "flag" and cfg.sources["interval"] == "OTEL_METRIC_EXPORT_INTERVAL"


def test_signal_specific_variables_win_and_the_metrics_endpoint_is_used_as_is():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics:9999/ingest",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "b=2",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "9000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "500"}
    cfg = cfgmod.load(environ=env)
    assert cfg.protocol == "http/protobuf" and cfg.endpoint == "http://metrics:9999/ingest"
    assert cfg.headers == {"b": "2"} and cfg.timeout_s == 0.5


def test_grpc_endpoints():
    # scheme-less: TLS, as the specification's OTEL_EXPORTER_OTLP_INSECURE defaults to false
    assert cfgmod.load(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "otelcol:4317"}).endpoint == "https://otelcol:4317"
    assert cfgmod.load(flags={"endpoint": "https://gw:4317"}, environ={}).endpoint == "https://gw:4317"


@pytest.mark.parametrize("text, message", [
    ("endpiont: http://x\n", "unknown key 'endpiont'"),
    ("protocol: http/json\n", "http/json is not supported"),
    ("interval: soon\n", "not a duration"),
    ("spool: {max_bytes: lots}\n", "not a size"),
    ("spool: {size: 3}\n", "spool: unknown key 'size'"),
    ("temporality: sometimes\n", "not cumulative or delta"),
    ("- a list\n", "expected a mapping"),
    ("endpoint: not a url\n", "is not an http:// or https:// URL"),
    ("endpoint: http://127.0.0.1:notaport\n", "is not a URL: Port could not be cast"),
    ("endpoint: '[x]'\n", "is not a URL"),
    ("endpoint: [x]\n", "endpoint: expected text, got list"),
    ("node_name: [a]\n", "node_name: expected text, got list"),
    ("spool: {dir: [a, b]}\n", "spool.dir: expected text, got list"),
    ("probe_options: {diskstats: {include_partition: true}}\n",
     r"probe_options.diskstats: unknown option 'include_partition' \(known: include_partitions, proc, sysfs\)"),
    ("probe_options: {tcp: {per_pid: true}}\n", r"probe_options.tcp: unknown option 'per_pid' \(known: none\)"),
])
def test_bad_config_files_are_clear_errors(tmp_path, text, message):
    with pytest.raises(cfgmod.ConfigError, match=message):
        cfgmod.load(write_config(tmp_path, text), environ={})


@pytest.mark.parametrize("file, flag, listen", [
    ("listen: off\n", None, None), ("listen: false\n", None, None), ("listen: 'OFF'\n", None, None),
    ("listen: '[::1]:9465'\n", None, "[::1]:9465"), ("listen: ':9465'\n", None, "127.0.0.1:9465"),
    ("listen: off\n", "[::1]:9466", "[::1]:9466"), ("", "Off", None), ("", None, cfgmod.DEFAULT_LISTEN),
])
def test_listen_is_an_address_or_off_from_the_file_or_the_flag(tmp_path, file, flag, listen):
    assert cfgmod.load(write_config(tmp_path, file), flags={"listen": flag}, environ={}).listen == listen


@pytest.mark.parametrize("file, flag, where", [
    ("listen: none\n", None, ":1: listen"), ("listen: 'false'\n", None, ":1: listen"),
    ("listen:\n", None, ":1: listen"), ("listen: '::1:80'\n", None, ":1: listen"), ("", "none", "--listen"),
    ("", "", "--listen"), ("", "false", "--listen"),
])
def test_off_has_one_word_for_listen(tmp_path, file, flag, where):
    """The file's YAML false is off, as a bare off reads; the words none and "false" are refused as any other."""
    path = write_config(tmp_path, file)
    with pytest.raises(cfgmod.ConfigError) as caught:
        cfgmod.load(path, flags={"listen": flag}, environ={})
    assert str(caught.value).startswith(f"{path if where.startswith(':') else ''}{where}: expected HOST:PORT (like "
                                        "127.0.0.1:4318, :4318 or [::1]:4318) or off; got "), str(caught.value)


def test_probe_options_the_probes_take_are_kept(tmp_path):
    path = write_config(tmp_path, "probe_options: {spdk: {qd_sampling_period_us: 10000}}\ncgroups: [/a]\n")
    cfg = cfgmod.load(path, environ={})
    assert cfg.probe_options == {"spdk": {"qd_sampling_period_us": 10000}, "syscall": {"cgroups": ["/a"]}}


def test_a_file_that_is_not_yaml_is_a_one_line_error_saying_where(tmp_path):
    with pytest.raises(cfgmod.ConfigError) as caught:
        cfgmod.load(write_config(tmp_path, "endpoint: http://x\nspool: : 3\n"), environ={})
    assert "\n" not in str(caught.value)
    assert str(caught.value).endswith("collector.yaml:2: not valid YAML: mapping values are not allowed here")


def test_bad_environment_is_a_clear_error():
    with pytest.raises(cfgmod.ConfigError, match="OTEL_EXPORTER_OTLP_HEADERS"):
        cfgmod.load(environ={"OTEL_EXPORTER_OTLP_HEADERS": "novalue"})
    with pytest.raises(cfgmod.ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        cfgmod.load(environ={"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"})


def header_from(source, tmp_path, name, value):
    """Load a configuration whose only header comes from `source`."""
    if source == "file":
        return cfgmod.load(write_config(tmp_path, f"headers: {{{name!r}: {value!r}}}\n".replace("'", '"')),
                           environ={})
    if source == "env":
        return cfgmod.load(environ={"OTEL_EXPORTER_OTLP_HEADERS": f"{name}={value}"})
    return cfgmod.load(flags={"headers": {name: value}}, environ={})


@pytest.mark.parametrize("source, where", [("file", "headers"), ("env", "OTEL_EXPORTER_OTLP_HEADERS"),
                                           ("flag", "--header")])
def test_a_header_that_cannot_be_sent_is_a_clear_error_without_its_secret(tmp_path, source, where):
    """Every export would fail on it (requests refuses it, gRPC answers INTERNAL): refused at start, named."""
    for name, value, why in (("authorization", "Bearer s3cret%0Amore" if source == "env" else "Bearer s3cret\nmore",
                              "header 'authorization' has a character that cannot be sent"),
                             ("x-team", "\u00e9quipe-s3cret", "header 'x-team' has a character"),
                             ("x team", "v", "header name 'x team' is not")):
        with pytest.raises(cfgmod.ConfigError, match=f"{where}.*{why}") as caught:
            header_from(source, tmp_path, name, value)
        assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("source", ["file", "env", "flag"])
def test_header_values_are_stripped_wherever_they_come_from(tmp_path, source):
    cfg = header_from(source, tmp_path, "Authorization", "Bearer abc\n")  # a token file's last newline
    assert cfg.headers == {"authorization": "Bearer abc"}


def test_grpc_binary_metadata_is_refused():
    with pytest.raises(cfgmod.ConfigError, match="'x-trace-bin': gRPC binary metadata"):
        cfgmod.load(flags={"headers": {"x-trace-bin": "abc"}}, environ={})
    assert cfgmod.load(flags={"headers": {"x-trace-bin": "abc"}, "protocol": "http/protobuf"}, environ={}).headers


def test_resource_attributes(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=env,deployment.environment=prod,host.name=x")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "something-else")
    cfg = cfgmod.CollectorConfig(node_name="gpu-node-3", host_name="host-a",
                                 resource={"k8s.cluster.name": "file", "team": "infra", "k8s.node.name": "no"})
    attrs = dict(build_resource(cfg).attributes)
    assert attrs["service.name"] == "sloscope-collector" and attrs["k8s.node.name"] == "gpu-node-3"
    assert attrs["host.name"] == "x" and attrs["k8s.cluster.name"] == "env"  # the environment over the file
    assert attrs["deployment.environment"] == "prod" and attrs["team"] == "infra"
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES")
    attrs = dict(build_resource(cfgmod.CollectorConfig(host_name="h")).attributes)
    assert attrs["host.name"] == "h" and "k8s.node.name" not in attrs
