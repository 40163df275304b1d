"""The collector's transport settings as the OTLP exporter specification defines them: TLS against a custom CA,
mutual TLS, gzip, and plain text for a scheme-less gRPC endpoint only when INSECURE says so; against a TLS
stand-in with certificates made here, over real HTTP and gRPC."""

import shutil

import pytest

from sloscope.collectors import config as cfgmod
from sloscope.collectors.agent import Agent
from sloscope.collectors.otlp_answers import DELIVERED, RETRY, Transport
from sloscope.collectors.otlp_grpc import GrpcExporter
from sloscope.collectors.otlp_http import HttpExporter
from tests.conftest import need
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.tls import make_pki
from tests.collectors.test_spool import request

BODY = request(3, 7)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    need(shutil.which("openssl") is not None, "the openssl command makes the test certificates")
    return make_pki(tmp_path_factory.mktemp("pki"))


def exporter(protocol, sink, transport):
    if protocol == "http":
        return HttpExporter(f"{sink.endpoint}/v1/metrics", {}, timeout_s=3, transport=transport)
    return GrpcExporter(sink.endpoint, {}, timeout_s=3, transport=transport)


# -- configuration ---------------------------------------------------------------------------------------------

def test_environment_sets_tls_and_compression_signal_specific_first(pki):
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": pki.ca,
           "OTEL_EXPORTER_OTLP_CLIENT_KEY": pki.client_key, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pki.client_cert,
           "OTEL_EXPORTER_OTLP_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "GZIP"}
    cfg = cfgmod.load(environ=env)
    assert (cfg.certificate, cfg.client_key, cfg.client_certificate, cfg.compression) == (
        pki.ca, pki.client_key, pki.client_cert, "gzip")
    assert cfg.sources["certificate"] == "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"
    assert cfgmod.load(environ={}).compression == "none"


@pytest.mark.parametrize("env, error", [
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION: 'zstd' is not one of none, gzip"),
    ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, "/nonexistent/ca.pem: No such file or directory"),
    ({"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE: 'yes' is not true or false"),
])
def test_bad_transport_settings_are_clear_errors(env, error):
    with pytest.raises(cfgmod.ConfigError, match=error):
        cfgmod.load(environ=env)


def test_a_client_key_needs_its_certificate(pki):
    with pytest.raises(cfgmod.ConfigError, match="client_key and client_certificate go together"):
        cfgmod.load(environ={"OTEL_EXPORTER_OTLP_CLIENT_KEY": pki.client_key})


@pytest.mark.parametrize("endpoint, insecure, url", [
    ("collector:4317", None, "https://collector:4317"),  # the specification's default: secure
    ("collector:4317", "true", "http://collector:4317"),
    ("collector:4317", "false", "https://collector:4317"),
    ("https://collector:4317", "true", "https://collector:4317"),  # a scheme wins over INSECURE
    ("http://collector:4317", "false", "http://collector:4317"),
])
def test_insecure_decides_only_a_scheme_less_grpc_endpoint(endpoint, insecure, url):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **({"OTEL_EXPORTER_OTLP_INSECURE": insecure} if insecure else {})}
    assert cfgmod.load(environ=env).endpoint == url
    http = cfgmod.load(environ={**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}).endpoint
    assert http.endswith("/v1/metrics") and http.split("://")[0] == (
        "https" if endpoint.startswith("https") else "http")


def test_file_keys(tmp_path, pki):
    path = tmp_path / "c.yaml"
    path.write_text(f"compression: gzip\ncertificate: {pki.ca}\ninsecure: true\nendpoint: otelcol:4317\n")
    cfg = cfgmod.load(str(path), environ={})
    assert (cfg.compression, cfg.certificate, cfg.insecure, cfg.endpoint) == ("gzip", pki.ca, True,
                                                                               "http://otelcol:4317")


# -- on the wire ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tls_verified_against_the_configured_ca(pki, protocol):
    with OtlpSink(protocol, tls=pki.server) as sink:
        assert exporter(protocol, sink, Transport(certificate=pki.ca)).send(BODY).outcome == DELIVERED
        untrusted = exporter(protocol, sink, Transport()).send(BODY)  # the system's CAs do not know ours
        assert untrusted.outcome == RETRY and len(sink.requests) == 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mutual_tls_presents_the_client_certificate(pki, protocol):
    with OtlpSink(protocol, tls=pki.server_requiring_client) as sink:
        assert exporter(protocol, sink, Transport(certificate=pki.ca)).send(BODY).outcome != DELIVERED
        assert sink.requests == []
        mutual = Transport(certificate=pki.ca, client_key=pki.client_key, client_certificate=pki.client_cert)
        assert exporter(protocol, sink, mutual).send(BODY).outcome == DELIVERED
        assert sink.requests[0].SerializeToString() == BODY


def test_http_gzip_is_declared_and_decodes_to_the_same_request():
    with OtlpSink("http") as sink:
        assert exporter("http", sink, Transport(compression="gzip")).send(BODY).outcome == DELIVERED
        assert sink.headers_seen["content-encoding"] == "gzip"
        assert sink.requests[0].SerializeToString() == BODY
        exporter("http", sink, Transport()).send(BODY)
        assert "content-encoding" not in sink.headers_seen


def test_the_collector_follows_the_environment_to_a_mutual_tls_grpc_endpoint_with_gzip(tmp_path, pki):
    with OtlpSink("grpc", tls=pki.server_requiring_client) as sink:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"127.0.0.1:{sink.port}",  # scheme-less: TLS
               "OTEL_EXPORTER_OTLP_CERTIFICATE": pki.ca, "OTEL_EXPORTER_OTLP_CLIENT_KEY": pki.client_key,
               "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pki.client_cert, "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
        cfg = cfgmod.load(flags={"probes": ("pressure",), "spool_dir": str(tmp_path / "spool"), "once": True,
                                 "interval_s": 0.2, "listen": "off"}, environ=env)
        assert Agent(cfg).run() == 0
        assert len(sink.requests) == 1 and sink.points()
