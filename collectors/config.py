"""Configuration of the node collector (`sloscope collect`): defaults, a YAML file, the standard OTel
environment variables, and command-line flags, in that order of increasing precedence:

    flags  >  environment  >  file (--config)  >  defaults

Keys (YAML file; flags in brackets; environment variables after the arrow):

    endpoint: http://otelcol:4317     [--endpoint]  <- OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (used as is),
                                                     OTEL_EXPORTER_OTLP_ENDPOINT (a base URL)
    protocol: grpc                    [--protocol]  <- OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL
    headers: {authorization: ...}     [--header K=V]<- OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_HEADERS
    timeout: 10s                      [--timeout]   <- OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT (ms)
    interval: 5s                      [--interval]  <- OTEL_METRIC_EXPORT_INTERVAL (ms)
    probes: [auto]                    [--probe NAME]
    probe_options: {syscall: {per_pid: true}}
    cgroups: [/sys/fs/cgroup/kubepods.slice]  [--cgroup]   (the syscall probe's cgroup v2 filter)
    spool: {dir: var/collector-spool, max_bytes: 256MiB, max_batches: 100000}
                                      [--spool-dir, --spool-max-bytes, --spool-max-batches]
    temporality: cumulative           [--temporality]   (counters and histograms; or delta)
    resource: {k8s.cluster.name: prod}                   (extra resource attributes)
    node_name: gpu-node-3             [--node-name] <- NODE_NAME (the Downward API's spec.nodeName)
    health_interval: 60s              [--health-interval]

Endpoints follow the OTLP exporter specification: for HTTP/protobuf a base URL (from the file, a flag or
OTEL_EXPORTER_OTLP_ENDPOINT) gets `/v1/metrics` appended unless it already ends so, while
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is used as is; for gRPC the URL is `http://host:port` (plain text) or
`https://host:port` (TLS), and a bare `host:port` means TLS unless `insecure` (OTEL_EXPORTER_OTLP_INSECURE=true)
says plain text: the scheme, when there is one, wins. Timeouts in the OTEL_* variables are
milliseconds, as the specification says (the Python SDK alone reads them as seconds; sloscope passes the
timeout to the exporter explicitly, so the specification's unit holds). Headers in OTEL_* variables are
`key=value` pairs separated by commas, values percent-decoded. A signal-specific variable (..._METRICS_...)
wins over the generic one; headers are taken whole from the highest layer that sets any.

TLS and compression (OTEL_EXPORTER_OTLP_{,METRICS_}{CERTIFICATE,CLIENT_KEY,CLIENT_CERTIFICATE,COMPRESSION,
INSECURE}): `certificate` is the PEM bundle the endpoint's certificate is verified against (else the system's),
`client_key` and `client_certificate` the PEM pair presented for mutual TLS (both or neither), `compression`
gzip or none. Files are checked at start-up, so a wrong path is a configuration error, not a failing export.
"""

from __future__ import annotations

import inspect
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlparse

from sloscope.probes import registry
from sloscope.durations import parse_duration
from sloscope import yaml_config
from sloscope.addresses import address_text, parse_address
from sloscope.errors import ConfigError, read_config_text
from sloscope.sizes import parse_size
from sloscope.yaml_config import key_at, refuse_unknown_keys

PROBE_SETS = ("auto", "node", "all")  # names of sets of probes, beside the probes' own

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
METRICS_PATH = "/v1/metrics"
COMPRESSIONS = ("none", "gzip")
# On, and on loopback only, as the OpenTelemetry Collector serves its own telemetry: a node's operator can
# curl it, and exposing it to the pod network is a choice (the DaemonSet makes it, for probes and scraping).
DEFAULT_LISTEN = "127.0.0.1:9465"
FILE_KEYS = ("endpoint", "protocol", "headers", "timeout", "interval", "probes", "probe_options", "cgroups",
             "spool", "temporality", "resource", "node_name", "health_interval", "compression", "certificate",
             "client_key", "client_certificate", "insecure", "listen")
TLS_FILES = ("certificate", "client_key", "client_certificate")
SPOOL_KEYS = ("dir", "max_bytes", "max_batches")


@dataclass
class CollectorConfig:
    endpoint: str = DEFAULT_GRPC_ENDPOINT  # final URL handed to the exporter
    protocol: str = "grpc"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    interval_s: float = 5.0
    probes: tuple[str, ...] = ("auto",)
    probe_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    cgroups: tuple[str, ...] = ()
    spool_dir: str = "var/collector-spool"
    spool_max_bytes: int = 256 * 2**20
    spool_max_batches: int = 100_000
    temporality: str = "cumulative"
    resource: dict[str, Any] = field(default_factory=dict)
    node_name: str | None = None
    host_name: str = field(default_factory=socket.gethostname)
    health_interval_s: float = 60.0
    compression: str = "none"
    certificate: str | None = None  # PEM bundle to verify the endpoint with (None: the system's)
    client_key: str | None = None  # PEM, with client_certificate, for mutual TLS
    client_certificate: str | None = None
    insecure: bool = False  # gRPC only: a scheme-less endpoint in plain text
    listen: str | None = DEFAULT_LISTEN  # HOST:PORT of the collector's own /healthz and /metrics (None: off)
    duration_s: float | None = None  # run this long, then stop (None: until signalled)
    once: bool = False  # one interval, one export, then stop
    sources: dict[str, str] = field(default_factory=dict)  # key -> where its value came from

    def describe(self) -> str:
        def src(k):
            return f" ({self.sources[k]})" if k in self.sources else ""
        return (f"endpoint {self.endpoint}{src('endpoint')}, protocol {self.protocol}{src('protocol')}, "
                f"timeout {self.timeout_s:g}s{src('timeout')}, interval {self.interval_s:g}s{src('interval')}, "
                f"probes {','.join(self.probes)}{src('probes')}, temporality {self.temporality}, "
                f"spool {self.spool_dir} (max {self.spool_max_bytes} bytes / {self.spool_max_batches} batches), "
                f"node {self.node_name or '-'}{src('node_name')}, host {self.host_name}, "
                f"compression {self.compression}{src('compression')}"
                + (f", certificate {self.certificate}{src('certificate')}" if self.certificate else "")
                + (f", client certificate {self.client_certificate}{src('client_certificate')}"
                   if self.client_certificate else "")
                + (f", headers {', '.join(sorted(self.headers))}{src('headers')}" if self.headers else ""))


# -- value parsers --------------------------------------------------------------------------------------------

def parse_count(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None
    if isinstance(value, bool) or n <= 0 or (isinstance(value, float) and n != value):
        raise ConfigError(f"{what}: must be a positive whole number, got {value!r}")
    return n


def parse_headers(text: str, what: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (the OTEL_EXPORTER_OTLP_HEADERS format; values percent-decoded)."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ConfigError(f"{what}: {part.strip()!r} is not key=value")
        k, v = part.split("=", 1)
        k = unquote(k.strip()).lower()
        if not k:
            raise ConfigError(f"{what}: empty header name in {part.strip()!r}")
        out[k] = unquote(v.strip())
    return check_headers(out, what)


_HEADER_NAME = re.compile(r"^[0-9a-z_.-]+$")  # what both an HTTP field name and a gRPC metadata key may be
_HEADER_VALUE = re.compile(r"^[\x20-\x7e]*$")  # printable ASCII: what gRPC sends, and HTTP without guessing


def check_headers(headers: Mapping[Any, Any], what: str) -> dict[str, str]:
    """Header names lowercased and values stripped (a secret read from a file ends in a newline); ConfigError
    naming a header that could not be sent, which would otherwise fail every export. Values are secrets: never
    shown."""
    out = {}
    for name, value in headers.items():
        if value is None:
            raise ConfigError(f"{what}: header {name!r} has no value")
        name, value = str(name).strip().lower(), str(value).strip()
        if not _HEADER_NAME.match(name):
            raise ConfigError(f"{what}: header name {name!r} is not letters, digits, '-', '_' or '.'")
        if not _HEADER_VALUE.match(value):
            raise ConfigError(f"{what}: the value of header {name!r} has a character that cannot be sent "
                              "(a line break, a control character or non-ASCII text)")
        out[name] = value
    return out


def parse_protocol(value: Any, what: str) -> str:
    text = str(value).strip().lower()
    if text == "http":
        text = "http/protobuf"
    if text == "http/json":
        raise ConfigError(f"{what}: http/json is not supported by the collector; use grpc or http/protobuf")
    if text not in PROTOCOLS:
        raise ConfigError(f"{what}: {value!r} is not one of {', '.join(PROTOCOLS)}")
    return text


def parse_compression(value: Any, what: str) -> str:
    text = str(value).strip().lower()
    if text not in COMPRESSIONS:
        raise ConfigError(f"{what}: {value!r} is not one of {', '.join(COMPRESSIONS)}")
    return text


def parse_bool(value: Any, what: str) -> bool:
    """true/false as the specification's boolean variables (case-insensitive); YAML booleans as they are."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{what}: {value!r} is not true or false")
    return text == "true"


def parse_listen(value: Any, what: str) -> str | None:
    """HOST:PORT (sloscope/addresses.py), or None for off: `off` in any case, or YAML's false (what a bare off or
    false reads as). Off has one word, so the strings "false" and "none" are refused, as is an empty value."""
    if value is False:
        return None
    address = parse_address("" if value is None else value, what, may_be_off=True)
    return address_text(address) if address else None

def _text(value: Any, what: str) -> str:
    """A setting that is one word or name: text, or a number YAML read as one (node_name: 7); a list or a mapping
    is a mistake, not its printed form."""
    if isinstance(value, (list, tuple, dict, set)) or value is None:
        raise ConfigError(f"{what}: expected text, got {type(value).__name__}")
    return str(value)


def _readable_file(value: Any, what: str) -> str:
    path = str(value)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{what}: {path}: {exc.strerror}") from None
    return path


def _ms(value: str, what: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise ConfigError(f"{what}: {value!r} is not a number of milliseconds") from None
    if not ms > 0:
        raise ConfigError(f"{what}: must be positive, got {value!r}")
    return ms / 1000.0


def _str_list(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int)) for v in value):
        raise ConfigError(f"{what}: expected a list of names, got {value!r}")
    return tuple(str(v) for v in value)


def _mapping(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what}: expected a mapping, got {type(value).__name__}")
    return dict(value)


# -- endpoint ------------------------------------------------------------------------------------------------

def resolve_endpoint(value: str | None, protocol: str, *, as_is: bool = False, insecure: bool = False,
                     what: str = "endpoint") -> str:
    """The URL handed to the exporter. `as_is` for a signal-specific endpoint (not completed); `insecure` for
    a scheme-less gRPC endpoint (else it takes TLS, as the specification's default); `what` names it in errors."""
    if not value:
        value = DEFAULT_GRPC_ENDPOINT if protocol == "grpc" else DEFAULT_HTTP_ENDPOINT
    value = _text(value, what).strip()
    if "://" not in value:
        value = ("https://" if protocol == "grpc" and not insecure else "http://") + value
    try:
        parsed = urlparse(value)
        parsed.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:  # a bracketed host that is no IP address, a port out of range or not a number
        raise ConfigError(f"{what}: {value!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or any(c.isspace() for c in value):
        raise ConfigError(f"{what}: {value!r} is not an http:// or https:// URL")
    if protocol == "grpc" or as_is:
        return value
    path = parsed.path.rstrip("/")
    if path.endswith(METRICS_PATH):
        return value
    return parsed._replace(path=path + METRICS_PATH).geturl()


# -- loading -------------------------------------------------------------------------------------------------

def read_file(path: str) -> dict:
    """The file's settings, its mappings keeping their lines (sloscope/yaml_config.py: a key given twice is
    refused); ConfigError names the file, and the line and key where the YAML gives them."""
    data = yaml_config.parse(read_config_text(path, "collector config"), path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    refuse_unknown_keys(path, data, FILE_KEYS)
    _mapping(data.get("spool"), key_at(path, data, "spool"))
    refuse_unknown_keys(path, data.get("spool") or {}, SPOOL_KEYS, "spool")
    return data


def load(file: str | None = None, flags: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> CollectorConfig:
    """Build the configuration. `flags` holds the command-line values that were given (None = not given),
    under the CollectorConfig field names (endpoint, protocol, headers, timeout_s, interval_s, probes,
    cgroups, spool_dir, spool_max_bytes, spool_max_batches, temporality, node_name, health_interval_s,
    duration_s, once)."""
    env = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None and v != () and v != []}
    cfg = CollectorConfig()
    src = cfg.sources

    def take(key: str, value: Any, source: str) -> None:
        setattr(cfg, key, value)
        src[key.removesuffix("_s")] = source

    # defaults < file
    places = _from_file(file, take) if file else {}

    def named(key: str) -> str:
        """The setting as an error names it: where the file writes it (FILE:LINE: KEY), when its value came
        from there."""
        return places[key] if src.get(key) == "file" else key

    # < environment
    for var in ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if env.get(var):
            take("protocol", parse_protocol(env[var], var), var)
            break
    for var in ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
        if env.get(var):
            take("headers", parse_headers(env[var], var), var)
            break
    for var in ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        if env.get(var):
            take("timeout_s", _ms(env[var], var), var)
            break
    for key, parse in (("compression", parse_compression), ("insecure", parse_bool),
                       *((key, _readable_file) for key in TLS_FILES)):
        for var in (f"OTEL_EXPORTER_OTLP_METRICS_{key.upper()}", f"OTEL_EXPORTER_OTLP_{key.upper()}"):
            if env.get(var):
                take(key, parse(env[var], var), var)
                break
    if env.get("OTEL_METRIC_EXPORT_INTERVAL"):
        take("interval_s", _ms(env["OTEL_METRIC_EXPORT_INTERVAL"], "OTEL_METRIC_EXPORT_INTERVAL"),
             "OTEL_METRIC_EXPORT_INTERVAL")
    if env.get("NODE_NAME"):
        take("node_name", env["NODE_NAME"], "NODE_NAME")

    # < flags
    for key, value in flags.items():
        if key == "protocol":
            value = parse_protocol(value, "--protocol")
        elif key == "headers":
            value = check_headers(value, "--header")
        elif key in ("probes", "cgroups"):
            value = tuple(value)
        elif key == "temporality":
            value = _temporality(value, "--temporality")
        elif key == "compression":
            value = parse_compression(value, "--compression")
        elif key == "listen":
            value = parse_listen(value, "--listen")
        elif key in TLS_FILES:
            value = _readable_file(value, f"--{key.replace('_', '-')}")
        if key != "endpoint":
            take(key, value, "flag")

    # the endpoint last: its form depends on the protocol finally chosen
    endpoint, as_is = None, False
    if "endpoint" in flags:
        endpoint, src["endpoint"] = flags["endpoint"], "flag"
    elif env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        endpoint, as_is = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"], True
        src["endpoint"] = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint, src["endpoint"] = env["OTEL_EXPORTER_OTLP_ENDPOINT"], "OTEL_EXPORTER_OTLP_ENDPOINT"
    elif src.get("endpoint") == "file":
        endpoint = cfg.endpoint
    cfg.endpoint = resolve_endpoint(endpoint, cfg.protocol, as_is=as_is, insecure=cfg.insecure,
                                    what=named("endpoint"))
    binary = sorted(k for k in cfg.headers if k.endswith("-bin"))
    if cfg.protocol == "grpc" and binary:
        raise ConfigError(f"{named('headers')}: {binary[0]!r}: gRPC binary metadata (a name ending in -bin) is not "
                          "supported")
    if (cfg.client_key is None) != (cfg.client_certificate is None):
        given, other = ("client_key", "client_certificate") if cfg.client_key else ("client_certificate", "client_key")
        raise ConfigError(f"{named(given)}: given without {other}; client_key and client_certificate go together "
                          "(mutual TLS needs both)")

    if cfg.cgroups:
        cfg.probe_options.setdefault("syscall", {})["cgroups"] = list(cfg.cgroups)
    if cfg.duration_s is not None and not cfg.duration_s > 0:
        raise ConfigError("--duration: must be positive")
    check_probes(cfg.probes, cfg.probe_options)
    return cfg


def _from_file(file: str, take: Callable[[str, Any, str], None]) -> dict[str, str]:
    """Take the settings the config file gives; returns where it writes each (FILE:LINE: KEY), for the errors
    found once every layer is applied. A collector without a file never loads YAML."""
    data = read_file(file)
    places = {str(key): key_at(file, data, key) for key in data}
    for key, name, parse in FILE_SETTINGS:
        if key in data:
            take(name, parse(data[key], places[key]), "file")
    if "headers" in data:
        take("headers", check_headers(_mapping(data["headers"], places["headers"]), places["headers"]), "file")
    if "probe_options" in data:
        opts = data["probe_options"]  # not _mapping's copy: the lines of its keys name the errors
        _mapping(opts, places["probe_options"])
        take("probe_options", {str(k): _probe_options(k, v, key_at(file, opts, k, f"probe_options.{k}"))
                               for k, v in (opts or {}).items()}, "file")
    spool = data.get("spool") or {}
    for key, name, parse in SPOOL_SETTINGS:
        if key in spool:
            take(name, parse(spool[key], key_at(file, spool, key, f"spool.{key}")), "file")
    if "resource" in data:
        take("resource", {str(k): v for k, v in _mapping(data["resource"], places["resource"]).items()}, "file")
    for key in TLS_FILES:
        if key in data:
            take(key, _readable_file(data[key], places[key]), "file")
    return places


def check_probes(requested, options: Mapping[str, Any]) -> None:
    """ConfigError naming a probe, or probe_options entry, that no probe of the registry answers to."""
    _known_probes(requested)
    unknown = sorted(set(options) - set(registry.PROBES))
    if unknown:
        raise ConfigError(f"probe_options for unknown probes: {', '.join(unknown)}")
    for name, given in options.items():
        _check_probe_options(name, given, f"probe_options.{name}")


def _known_probes(names, what: str = "") -> None:
    """ConfigError naming the first of `names` that is neither a probe nor a set of probes."""
    for name in names:
        if name not in registry.PROBES and name not in PROBE_SETS:
            raise ConfigError(f"{what + ': ' if what else ''}unknown probe {name!r}; known: "
                              f"{', '.join(registry.PROBES)}, {', '.join(PROBE_SETS)}")


def _probe_list(value: Any, what: str) -> tuple[str, ...]:
    """The file's `probes`: names of the registry's probes or of its sets."""
    names = _str_list(value, what)
    _known_probes(names, what)
    return names


def _probe_options(name, given: Any, what: str) -> dict:
    """The file's options of probe `name`, held to what the probe takes."""
    if name not in registry.PROBES:
        raise ConfigError(f"{what}: no probe is named {name!r}; known: {', '.join(registry.PROBES)}")
    options = _mapping(given, what)
    _check_probe_options(name, options, what)
    return options


def _check_probe_options(name: str, given: Mapping[str, Any], what: str) -> None:
    """ConfigError naming an option the probe does not take: else the probe would fail to start, and the
    collector would run on without it, only a warning saying why."""
    parameters = inspect.signature(registry.PROBES[name]).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    known = sorted(p.name for p in parameters if p.name != "host" and p.kind is not p.VAR_POSITIONAL)
    unknown = sorted(set(map(str, given)) - set(known))
    if unknown:
        raise ConfigError(f"{what}: unknown option {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(known) or 'none'})")


def _temporality(value: Any, what: str) -> str:
    text = str(value).strip().lower()
    if text not in ("cumulative", "delta"):
        raise ConfigError(f"{what}: {value!r} is not cumulative or delta")
    return text


# The file's plain settings, and its spool's: (key in the file, CollectorConfig field, parser(value, where)).
FILE_SETTINGS = (
    ("endpoint", "endpoint", _text),
    ("protocol", "protocol", parse_protocol),
    ("timeout", "timeout_s", parse_duration),
    ("interval", "interval_s", parse_duration),
    ("probes", "probes", _probe_list),
    ("cgroups", "cgroups", _str_list),
    ("temporality", "temporality", _temporality),
    ("node_name", "node_name", _text),
    ("health_interval", "health_interval_s", parse_duration),
    ("compression", "compression", parse_compression),
    ("insecure", "insecure", parse_bool),
    ("listen", "listen", parse_listen),
)
SPOOL_SETTINGS = (
    ("dir", "spool_dir", _text),
    ("max_bytes", "spool_max_bytes", parse_size),
    ("max_batches", "spool_max_batches", parse_count),
)
