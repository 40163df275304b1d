"""Strict configuration: the collector's, remediation's and sampling's YAML refuse a key given twice and name the
file, line and key of every error, as the SLO spec does; `sloscope validate` checks the four kinds of file without
running anything; the JSON Schemas of docs/schemas/ take what the parsers take and refuse what they refuse for
unknown keys and wrong types."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from sloscope.alerts import actions, remediation_config
from sloscope.collectors import config as collector
from sloscope.live.config import SLO_YAML
from sloscope.errors import ConfigError
from sloscope.probes import registry
from sloscope.sampling import config as sampling_config
from sloscope.slo_spec import DEFAULT_SPEC_YAML, SPEC_OPTIONAL, SPEC_REQUIRED, load_spec
from tests.declared_specs import QUEUE_TIME

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "docs" / "schemas"
SCHEMA_FILES = {"slo": "slo-spec.schema.json", "collector": "collector.schema.json",
                "remediation": "remediation.schema.json", "sampling": "sampling.schema.json"}


def deployed_collector_config() -> str:
    """The collector.yaml of deploy/daemonset.yaml's ConfigMap."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "ConfigMap")["data"]["collector.yaml"]


# The keys of collectors/config.py's docstring, with its example values.
DOCSTRING_COLLECTOR = """\
endpoint: http://otelcol:4317
protocol: grpc
headers: {authorization: Bearer abc}
timeout: 10s
interval: 5s
probes: [auto]
probe_options: {syscall: {per_pid: true}}
cgroups: [/sys/fs/cgroup/kubepods.slice]
spool: {dir: var/collector-spool, max_bytes: 256MiB, max_batches: 100000}
temporality: cumulative
resource: {k8s.cluster.name: prod}
node_name: gpu-node-3
health_interval: 60s
"""

# (kind, file name, text): every valid file of the tests, the project's examples among them.
VALID = [
    ("slo", "default.yaml", DEFAULT_SPEC_YAML),
    ("slo", "declared.yaml", QUEUE_TIME),
    ("slo", "live-demo.yaml", SLO_YAML.format(critical_ms=40, standard_ms=80)),
    ("slo", "limits.yaml", DEFAULT_SPEC_YAML + "physical_limits: {gpu_utilization_percent: 95, "
     "spdk_bdev_wait: 7.5ms}\n"),
    ("collector", "deployed.yaml", deployed_collector_config()),
    ("collector", "docstring.yaml", DOCSTRING_COLLECTOR),
    ("collector", "listen-off.yaml", "interval: 2s\nlisten: off\nprobes: 'pressure, netstat'\ninsecure: 'TRUE'\n"),
    ("remediation", "example.yaml", (ROOT / "alerts" / "remediation.example.yaml").read_text()),
    ("remediation", "map.yaml", "actions:\n  SloscopeGpuSaturated:\n    action: nft_drain_backend\n"
     "    params: {table: lb, map: weights, weight: 0, restore_weight: 10, address_label: address}\n"),
    ("sampling", "sampling.yaml", "budget_spans_per_s: 250\ndwell: 5m\ninterval: 15s\nmin_probability: 0.01\n"),
    ("sampling", "sampling-all.yaml", "budget_spans_per_s: 250\nmin_probability: 1.0e-6\ndwell: 2m\ninterval: 10\n"
     "window: 1m\nsli_window: 30s\nerror_ratio: 0.01\nmin_requests: 20\ntolerance: 0\nmax_increase: 1.5\n"
     "correction_gain: 0\nincident_lookback: 1h\nincident_open: 20s\nmax_routes: 0\nmax_services: 1000\n"),
]


def write(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def validate(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "validate", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def schema(kind: str) -> dict:
    return json.loads((SCHEMAS / SCHEMA_FILES[kind]).read_text())


# --- a key given twice ----------------------------------------------------------------------------------------------

def test_the_collector_refuses_a_key_given_twice_naming_file_line_key_and_first_line(tmp_path):
    path = write(tmp_path, "c.yaml", "endpoint: http://a:4317\nprotocol: grpc\nendpoint: http://b:4317\n")
    with pytest.raises(collector.ConfigError) as caught:
        collector.load(str(path), environ={})
    assert str(caught.value) == f"{path}:3: not valid YAML: duplicate key 'endpoint' (first on line 1)"


def test_the_collector_refuses_a_nested_key_given_twice(tmp_path):
    path = write(tmp_path, "c.yaml", "spool:\n  dir: /a\n  max_bytes: 1GiB\n  dir: /b\n")
    with pytest.raises(collector.ConfigError, match=r":4: not valid YAML: duplicate key 'dir' \(first on line 2\)"):
        collector.load(str(path), environ={})


def test_remediation_refuses_a_second_execute_rather_than_letting_it_win():
    with pytest.raises(ConfigError) as caught:
        remediation_config.parse_config("execute: false\ncooldown: 5m\nexecute: true\n", "r.yaml")
    assert str(caught.value) == "r.yaml:3: not valid YAML: duplicate key 'execute' (first on line 1)"


def test_remediation_refuses_a_key_given_twice_in_an_action():
    text = "actions:\n  SloscopeNvmeHot:\n    action: notify_only\n    dry_run: true\n    action: spdk_qos_limit\n"
    with pytest.raises(ConfigError) as caught:
        remediation_config.parse_config(text, "r.yaml")
    assert str(caught.value) == "r.yaml:5: not valid YAML: duplicate key 'action' (first on line 3)"


def test_sampling_refuses_a_key_given_twice():
    with pytest.raises(ConfigError) as caught:
        sampling_config.parse_config("budget_spans_per_s: 50\ndwell: 5m\nbudget_spans_per_s: 500\n", "s.yaml")
    assert str(caught.value) == "s.yaml:3: not valid YAML: duplicate key 'budget_spans_per_s' (first on line 1)"


def test_a_merge_key_is_no_duplicate_and_the_mapping_s_own_key_wins():
    """`<<: *base` brings keys the mapping may override, as YAML means: not a key written twice."""
    config = remediation_config.parse_config("""\
actions:
  SloscopeLatencyBudgetBurn: &base
    action: raise_sampling
    params: {ratio: 0.5, duration: 10m}
  SloscopeErrorBudgetBurn:
    <<: *base
    params: {ratio: 1.0}
""", "r.yaml")
    assert config.actions["SloscopeLatencyBudgetBurn"].params["ratio"] == 0.5
    assert config.actions["SloscopeErrorBudgetBurn"].params == {"ratio": 1.0, "duration_s": 1800.0}
    assert config.actions["SloscopeErrorBudgetBurn"].action == "raise_sampling"


# --- errors name file, line and key ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, start", [
    ("execute: false\nmax_actions_per_hour: -1\n", "r.yaml:2: max_actions_per_hour: expected a non-negative integer"),
    ("execute: false\nbudget: 3\n", "r.yaml:2: unknown key 'budget' (expected one of actions, audit_retention, command_timeout,"),
    ("execute: false\ncooldown: soon\n", "r.yaml:2: cooldown: expected a duration"),
    ("\nexecute: yes please\n", "r.yaml:2: execute: expected true or false; got 'yes please'"),
    ("actions:\n  A:\n    action: rm_rf\n", "r.yaml:3: actions.A.action: expected one of nft_drain_backend,"),
    ("actions:\n  A: {action: [notify_only]}\n", "r.yaml:2: actions.A.action: expected one of"),
    ("actions:\n  A:\n    action: notify_only\n    dryrun: true\n", "r.yaml:4: actions.A: unknown key 'dryrun'"),
    ("actions:\n  A:\n    action: notify_only\n    dry_run: 1\n",
     "r.yaml:4: actions.A.dry_run: expected true or false; got 1"),
    ("actions:\n  A:\n    action: raise_sampling\n    params: {ratio: 2}\n",
     "r.yaml:4: actions.A.params.ratio: expected a number in (0, 1]"),
    ("actions:\n  Not-An-Alert: {action: notify_only}\n", "r.yaml:2: actions.Not-An-Alert: not a valid alert name"),
])
def test_remediation_errors_name_file_line_and_key(text, start):
    with pytest.raises(ConfigError) as caught:
        remediation_config.parse_config(text, "r.yaml")
    assert str(caught.value).startswith(start), str(caught.value)


@pytest.mark.parametrize("text, start", [
    ("dwell: 5m\nmin_probability: 2\n", "s.yaml:2: min_probability: expected a number in [2^-56, 1]; got 2"),
    ("dwell: 5m\ntolerance: high\n", "s.yaml:2: tolerance: expected a number; got 'high'"),
    ("\n\ninterval: soon\n", "s.yaml:3: interval: expected a duration"),
    ("dwell: 5m\nbudget: 5\n", "s.yaml:2: unknown key 'budget' (expected one of budget_spans_per_s,"),
    ("- 1\n", "s.yaml: expected a mapping"),
])
def test_sampling_errors_name_file_line_and_key(text, start):
    with pytest.raises(ConfigError) as caught:
        sampling_config.parse_config(text, "s.yaml")
    assert str(caught.value).startswith(start), str(caught.value)


@pytest.mark.parametrize("text, rest", [
    ("protocol: grpc\ntimeout: soon\n", ":2: timeout: expected a duration"),
    ("protocol: grpc\nendpiont: http://x:4317\n", ":2: unknown key 'endpiont' (expected one of endpoint,"),
    ("spool:\n  dir: /x\n  size: 3\n", ":3: spool: unknown key 'size' (expected one of dir, max_bytes, max_batches)"),
    ("spool:\n  dir: /x\n  max_bytes: lots\n", ":3: spool.max_bytes: expected a size like 268435456, 256MiB, 256MB, 1.5GiB; 'lots' is not a size"),
    ("spool:\n  max_batches: 0\n", ":2: spool.max_batches: must be a positive whole number"),
    ("interval: 5s\nprobes: [pressure, nosuch]\n", ":2: probes: unknown probe 'nosuch'; known: syscall,"),
    ("probe_options:\n  pressure: {}\n  tcp: {per_pid: true}\n",
     ":3: probe_options.tcp: unknown option 'per_pid' (known: none)"),
    ("probe_options:\n  gpu: {}\n", ":2: probe_options.gpu: no probe is named 'gpu'"),
    ("interval: 5s\nendpoint: not a url\n", ":2: endpoint: 'https://not a url' is not an http:// or https:// URL"),
    ("interval: 5s\nheaders: {x-trace-bin: abc}\n", ":2: headers: 'x-trace-bin': gRPC binary metadata"),
    ("interval: 5s\nlisten: everywhere\n", ":2: listen: expected HOST:PORT (like 127.0.0.1:4318, :4318 or [::1]:4318) or off; got 'everywhere'"),
    ("node_name: [a]\n", ":1: node_name: expected text, got list"),
    ("client_key: CLIENT_KEY\n", ":1: client_key: given without client_certificate; client_key and client_certificate "
                                 "go together"),
])
def test_collector_file_errors_name_file_line_and_key(tmp_path, text, rest):
    path = write(tmp_path, "c.yaml", text.replace("CLIENT_KEY", str(write(tmp_path, "key.pem", "PEM"))))
    with pytest.raises(collector.ConfigError) as caught:
        collector.load(str(path), environ={})
    assert str(caught.value).startswith(f"{path}{rest}"), str(caught.value)


def test_a_collector_setting_from_a_flag_is_named_as_before(tmp_path):
    """The file's line belongs to what the file set: a flag's value is named by its setting alone."""
    path = write(tmp_path, "c.yaml", "headers: {x-a: b}\n")
    with pytest.raises(collector.ConfigError) as caught:
        collector.load(str(path), flags={"headers": {"x-trace-bin": "abc"}}, environ={})
    assert str(caught.value).startswith("headers: 'x-trace-bin': gRPC binary metadata"), str(caught.value)


def test_a_file_that_is_not_text_is_a_clear_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"execute: \xff\xfe\n")
    for load, what in ((remediation_config.load_config, "remediation config"),
                       (lambda p: collector.load(str(p), environ={}), "collector config")):
        with pytest.raises(ConfigError) as caught:
            load(path)
        assert str(caught.value) == f"{path}: cannot read the {what}: not UTF-8 text (byte 9)"


# --- sloscope validate ----------------------------------------------------------------------------------------------

def test_validate_says_ok_with_the_kind_of_every_valid_file_and_exits_0(tmp_path):
    paths = [write(tmp_path, name, text) for _, name, text in VALID]
    done = validate(*paths)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"{path}: ok ({kind})" for path, (kind, _, _) in zip(paths, VALID)]


# (file name, text, the start of its error after the file's path)
INVALID = [
    ("slo.yaml", DEFAULT_SPEC_YAML.replace("default_tier: standard", "default_tier: gold"),
     ": default_tier: 'gold' is not one of the tiers"),
    ("slo-twice.yaml", DEFAULT_SPEC_YAML + "window: 7d\n",
     ":11: not valid YAML: duplicate key 'window' (first on line 9)"),
    ("collector.yaml", "endpoint: http://otelcol:4317\ncompression: zstd\n",
     ":2: compression: 'zstd' is not one of none, gzip"),
    ("listen.yaml", "interval: 2s\nlisten: ':\u00b2'\n",  # a digit to str.isdigit, not to int()
     ":2: listen: expected HOST:PORT (like 127.0.0.1:4318, :4318 or [::1]:4318) or off; got ':\u00b2'"),
    ("remediation.yaml", "execute: false\nactions:\n  A: {action: notify_only}\nexecute: true\n",
     ":4: not valid YAML: duplicate key 'execute' (first on line 1)"),
    ("misspelt.yaml", "execute: false\ncooldwon: 5m\n", ":2: unknown key 'cooldwon'"),
    ("sampling.yaml", "budget_spans_per_s: 0\ndwell: 2m\n", ":1: budget_spans_per_s: expected a positive number"),
    ("unknown.yaml", "apiVersion: v1\nkind: ConfigMap\n", ": cannot tell its kind from its top-level keys (apiVersion, "
     "kind); give --kind, one of slo, collector, remediation, sampling"),
    ("list.yaml", "- a\n- b\n", ": cannot tell its kind from its top-level keys (none); give --kind, one of slo,"),
    ("broken.yaml", "tiers: [\n", ":2: not valid YAML:"),
]


def test_validate_prints_each_invalid_file_s_error_and_exits_2(tmp_path):
    good = write(tmp_path, "good.yaml", DEFAULT_SPEC_YAML)
    paths = [write(tmp_path, name, text) for name, text, _ in INVALID]
    done = validate(good, *paths, tmp_path / "missing.yaml")
    assert done.returncode == 2
    assert done.stdout.splitlines() == [f"{good}: ok (slo)"]
    errors = done.stderr.splitlines()
    assert len(errors) == len(INVALID) + 1, done.stderr
    for error, path, (_, _, start) in zip(errors, paths, INVALID):
        assert error.startswith(f"{path}{start}"), error
    assert errors[-1] == f"{tmp_path / 'missing.yaml'}: cannot read the file: No such file or directory"


def test_validate_kind_reads_a_file_whose_keys_two_kinds_share(tmp_path):
    """`interval` is a key of both the collector and sampling: the file's kind is not told, but can be given."""
    path = write(tmp_path, "interval.yaml", "interval: 10s\n")
    told = validate(path)
    assert told.returncode == 2
    assert told.stderr == (f"{path}: cannot tell its kind from its top-level keys (interval); give --kind, one of "
                           "slo, collector, remediation, sampling\n")
    given = validate("--kind", "sampling", path)
    assert (given.returncode, given.stdout, given.stderr) == (0, f"{path}: ok (sampling)\n", "")


def test_validate_kind_reads_the_file_as_that_kind_only(tmp_path):
    path = write(tmp_path, "spec.yaml", DEFAULT_SPEC_YAML)
    done = validate("--kind", "remediation", path)
    assert done.returncode == 2 and done.stderr.startswith(f"{path}:1: unknown key 'default_tier'"), done.stderr


def test_validate_usage_errors_exit_2_with_one_line():
    for args in ((), ("--kind", "grafana", "x.yaml")):
        done = validate(*args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("sloscope validate: ") and done.stdout == ""


def test_validate_help_says_what_it_checks():
    done = validate("--help")
    assert done.returncode == 0
    for words in ("an SLO spec", "collect --config", "webhook --config", "sampling --config", "a key given twice",
                  "unknown keys", "FILE:LINE: KEY: message", "docs/schemas/", "Exit status: 0"):
        assert words in " ".join(done.stdout.split()), words


# --- JSON Schemas ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SCHEMA_FILES)
def test_each_schema_is_a_draft_2020_12_schema(kind):
    document = schema(kind)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(document)


@pytest.mark.parametrize("kind, name, text", VALID, ids=[name for _, name, _ in VALID])
def test_the_schemas_take_every_valid_file(kind, name, text):
    errors = [e.message for e in Draft202012Validator(schema(kind)).iter_errors(yaml.safe_load(text))]
    assert errors == [], errors


# (kind, text): refused by the parser for an unknown key or a wrong type, and so by the schema.
REFUSED = [
    ("slo", DEFAULT_SPEC_YAML.replace("availability: 99.9", "availabilty: 99.9")),
    ("slo", DEFAULT_SPEC_YAML.replace("threshold_ms: 800", "threshold_ms: fast")),
    ("slo", DEFAULT_SPEC_YAML + "physical_limits: {gpu_utilization: 95}\n"),
    ("slo", DEFAULT_SPEC_YAML.replace("  standard:\n", "  Gold Tier:\n")),
    ("slo", QUEUE_TIME.replace("harmful: up", "harmful: upward")),
    ("slo", DEFAULT_SPEC_YAML.replace("window: 30d", "window: monthly")),
    ("collector", "endpiont: http://x:4317\n"),
    ("collector", "spool: {size: 3}\n"),
    ("collector", "spool: {max_bytes: lots}\n"),
    ("collector", "timeout: soon\n"),
    ("collector", "protocol: http/json\n"),
    ("collector", "probes: [nosuch]\n"),
    ("collector", "probe_options: {tcp: {per_pid: true}}\n"),
    ("collector", "node_name: [a]\n"),
    ("collector", "insecure: yes please\n"),
    ("remediation", "budget: 3\n"),
    ("remediation", "execute: yes please\n"),
    ("remediation", "max_actions_per_hour: -1\n"),
    ("remediation", "actions: {A: {action: rm_rf}}\n"),
    ("remediation", "actions: {A: {action: notify_only, dryrun: true}}\n"),
    ("remediation", "actions: {A: {action: notify_only, params: {x: 1}}}\n"),
    ("remediation", "actions: {A: {action: raise_sampling, params: {ratio: 2}}}\n"),
    ("remediation", "actions: {A: {action: spdk_qos_limit, params: {socket: /s}}}\n"),
    ("remediation", "actions: {A: {action: restart_workload, params: {runtime: sh}}}\n"),
    ("remediation", "actions: {A: {action: nft_drain_backend, params: {table: lb, set: s}}}\n"),
    ("remediation", "actions: {A: {action: nft_drain_backend, params: {table: lb, set: s, map: m, "
                    "restore_weight: 1, addresses: {n1: 10.0.0.1}}}}\n"),
    ("remediation", "actions: {A: {action: nft_drain_backend, params: {table: lb, set: s, map: m, "
                    "addresses: {n1: 10.0.0.1}}}}\n"),
    ("sampling", "budget: 5\n"),
    ("sampling", "tolerance: high\n"),
    ("sampling", "min_probability: 2\n"),
    ("sampling", "dwell: soon\n"),
]
LOADERS = {"slo": load_spec,
           "collector": lambda path: collector.load(str(path), environ={}),
           "remediation": remediation_config.load_config, "sampling": sampling_config.load_config}


@pytest.mark.parametrize("kind, text", REFUSED)
def test_the_schemas_refuse_what_the_parsers_refuse(tmp_path, kind, text):
    with pytest.raises(ConfigError):
        LOADERS[kind](write(tmp_path, "f.yaml", text))
    assert not Draft202012Validator(schema(kind)).is_valid(yaml.safe_load(text))


# The collector's values of a grammar (sloscope/addresses.py, sloscope/sizes.py), as YAML: (text, taken).
COLLECTOR_GRAMMARS = [
    ("listen: 127.0.0.1:9465", True), ("listen: ':9465'", True), ("listen: '[::1]:9465'", True),
    ("listen: '[::ffff:10.0.0.1]:0'", True), ("listen: node-3:65535", True), ("listen: ' 0.0.0.0:80 '", True),
    ("listen: off", True), ("listen: false", True), ("listen: 'OFF'", True), ("listen: 'Off'", True),
    ("listen: '::1:80'", False), ("listen: none", False), ("listen: 'false'", False), ("listen: 'no'", False),
    ("listen:", False), ("listen: ''", False), ("listen: true", False), ("listen: 9465", False),
    ("listen: ':65536'", False), ("listen: ':\u00b2'", False), ("listen: ':\u0663'", False),
    ("listen: '[::1:80'", False), ("listen: 'a]:80'", False), ("listen: '[]:80'", False),
    ("listen: [a, b]", False),
    ("spool: {max_bytes: 268435456}", True), ("spool: {max_bytes: 256MiB}", True), ("spool: {max_bytes: 256Mi}", True),
    ("spool: {max_bytes: 256mib}", True), ("spool: {max_bytes: 256MB}", True), ("spool: {max_bytes: 256mb}", True),
    ("spool: {max_bytes: 256M}", True), ("spool: {max_bytes: 1.5GiB}", True), ("spool: {max_bytes: 64kb}", True),
    ("spool: {max_bytes: 1e9}", True), ("spool: {max_bytes: 2E+3k}", True), ("spool: {max_bytes: 2Ei}", True),
    ("spool: {max_bytes: 1P}", True), ("spool: {max_bytes: 512b}", True), ("spool: {max_bytes: ' 3 GB '}", True),
    ("spool: {max_bytes: 9223372036854775807}", True),
    ("spool: {max_bytes: 256m}", False), ("spool: {max_bytes: lots}", False), ("spool: {max_bytes: 12 parsecs}", False),
    ("spool: {max_bytes: 0}", False), ("spool: {max_bytes: -1}", False), ("spool: {max_bytes: 1.5}", False),
    ("spool: {max_bytes: 9223372036854775808}", False), ("spool: {max_bytes: 1e999}", False),
    ("spool: {max_bytes: 1m5}", False), ("spool: {max_bytes: 1ib}", False), ("spool: {max_bytes: true}", False),
    ("spool: {max_bytes: 1KiBB}", False),
]


@pytest.mark.parametrize("text, taken", COLLECTOR_GRAMMARS, ids=[text for text, _ in COLLECTOR_GRAMMARS])
def test_the_collector_schema_reads_listen_and_sizes_as_the_parser_does(tmp_path, text, taken):
    """What a JSON Schema cannot check is left out: that a size comes to whole bytes above zero and below 2^63."""
    try:
        collector.load(str(write(tmp_path, "c.yaml", text + "\n")), environ={})
    except ConfigError:
        parsed = False
    else:
        parsed = True
    assert (parsed, Draft202012Validator(schema("collector")).is_valid(yaml.safe_load(text))) == (taken, taken)


def test_the_schemas_know_the_keys_the_parsers_know():
    assert set(schema("slo")["properties"]) == {*SPEC_REQUIRED, *SPEC_OPTIONAL}
    assert schema("slo")["required"] == list(SPEC_REQUIRED)
    assert set(schema("collector")["properties"]) == set(collector.FILE_KEYS)
    assert set(schema("collector")["properties"]["spool"]["properties"]) == set(collector.SPOOL_KEYS)
    assert set(schema("remediation")["properties"]) == set(remediation_config.CONFIG_KEYS)
    assert set(schema("remediation")["$defs"]["rule"]["properties"]) == set(remediation_config.RULE_KEYS)
    assert set(schema("sampling")["properties"]) == set(sampling_config.CONFIG_KEYS)
    assert all(document["additionalProperties"] is False for document in map(schema, SCHEMA_FILES))


def test_the_collector_schema_knows_the_registry_s_probes_and_their_options():
    document = schema("collector")
    assert document["$defs"]["names"]["anyOf"][0]["items"]["enum"] == [*registry.PROBES, *collector.PROBE_SETS]
    options = document["properties"]["probe_options"]["properties"]
    assert list(options) == list(registry.PROBES)
    for name, probe in registry.PROBES.items():
        taken = {p.name for p in inspect.signature(probe).parameters.values()} - {"host"}
        assert set(options[name]["properties"]) == taken, name


def test_the_remediation_schema_knows_each_action_and_its_parameters():
    defs = schema("remediation")["$defs"]
    assert defs["rule"]["properties"]["action"]["enum"] == list(actions.ACTIONS)
    for name in actions.ACTIONS:
        assert set(defs[f"params_{name}"].get("properties", {})) == set(actions.REGISTRY[name].keys), name
