"""TLS and bearer-token authentication at serve's edge: OTLP/HTTP and OTLP/gRPC over TLS with a certificate
made here, clients without the token refused and counted, and handshakes that cannot hold a connection."""

import argparse
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from sloscope.analytics.store import Store
from sloscope.edge.auth import BearerAuth
from sloscope.edge.tls import TlsFiles
from sloscope.receiver.limits import Limits
from sloscope.commands.serve_ops import BEARER_TOKEN_ENV, OPEN_PAGES, Edge, edge_of
from tests.alerting_stack import free_port, wait_listening
from tests.in_process import InProcessReceiver
from tests.receiver.test_receiver import _proto_traces

TOKEN = "s3cret-token-for-otlp-clients"
OPEN = frozenset({"/healthz"})


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(directory: Path, name: str, ca: str, extensions: str) -> None:
    """`name`.key and `name`.crt, signed by the CA `ca`."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A test CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=sloscope test CA", cwd=d)
    _issue(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _issue(d, "server2", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return d


class TlsReceiver(InProcessReceiver):
    """The in-process receiver with OTLP/HTTP and OTLP/gRPC over TLS, optionally behind the bearer token."""

    def __init__(self, db, tls: TlsFiles, token: str | None = TOKEN, limits: Limits = Limits()):
        pages = {"/healthz": lambda: (b"ok\n", "text/plain"), "/secret": lambda: (b"counts\n", "text/plain")}
        super().__init__(db, limits, tls=tls, auth=BearerAuth(token.encode(), OPEN) if token else None, pages=pages)


@pytest.fixture
def tls_files(pki) -> TlsFiles:
    return TlsFiles(pki / "server.crt", pki / "server.key")


@pytest.fixture
def edge(tmp_path, tls_files):
    s = TlsReceiver(tmp_path / "tls.duckdb", tls_files)
    yield s
    s.close()


def _client_context(pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return context


def _https(pki, port, method, path, body=None, headers=None, cert=None):
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=_client_context(pki, cert))
    try:
        conn.request(method, path, body, headers or {})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


def _post_traces(pki, port, token=None, cert=None):
    headers = {"Content-Type": "application/x-protobuf"}
    if token is not None:
        headers["Authorization"] = token
    return _https(pki, port, "POST", "/v1/traces", _proto_traces(3).SerializeToString(), headers, cert)


def test_otlp_http_over_tls_with_the_token_is_stored(pki, edge):
    status, _, _ = _post_traces(pki, edge.http_port, f"Bearer {TOKEN}")
    assert status == 200
    assert _post_traces(pki, edge.http_port, f"bearer {TOKEN}")[0] == 200  # the scheme is case-insensitive
    assert edge.spans() == 3  # the same spans twice: stored once


@pytest.mark.parametrize("authorization, challenge", [
    (None, 'Bearer realm="sloscope"'),
    ("Bearer wrong-token-of-some-length", 'Bearer realm="sloscope", error="invalid_token"'),
    (f"Basic {TOKEN}", 'Bearer realm="sloscope", error="invalid_token"'),
    (f"Bearer {TOKEN}\u00e9", 'Bearer realm="sloscope", error="invalid_token"'),  # untrusted bytes, no crash
])
def test_otlp_http_without_the_right_token_is_401_and_counted(pki, edge, authorization, challenge):
    status, headers, _ = _post_traces(pki, edge.http_port, authorization)
    assert (status, headers["WWW-Authenticate"], headers["Connection"]) == (401, challenge, "close")
    assert edge.receiver.snapshot()["unauthenticated_http"] == 1
    assert edge.spans() == 0


def test_get_pages_need_the_token_except_the_open_ones(pki, edge):
    assert _https(pki, edge.http_port, "GET", "/healthz")[0] == 200
    assert _https(pki, edge.http_port, "GET", "/secret")[0] == 401
    assert _https(pki, edge.http_port, "GET", "/secret", headers={"Authorization": f"Bearer {TOKEN}"})[:3:2] == \
        (200, b"counts\n")


def _grpc_export(pki, port, metadata=(), root=True):
    credentials = grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes() if root else None)
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        request = _proto_traces(2)
        return stub.Export(request, metadata=metadata, timeout=10)


def test_otlp_grpc_over_tls_with_the_token_is_stored_and_without_it_unauthenticated(pki, edge):
    for metadata in ((), (("authorization", "Bearer not-the-token"),)):
        with pytest.raises(grpc.RpcError) as refused:
            _grpc_export(pki, edge.grpc_port, metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    _grpc_export(pki, edge.grpc_port, (("authorization", f"Bearer {TOKEN}"),))
    assert edge.receiver.snapshot()["unauthenticated_grpc"] == 2
    assert edge.spans() == 2


def test_plain_text_to_tls_ports_fails_cleanly(pki, edge):
    conn = http.client.HTTPConnection("127.0.0.1", edge.http_port, timeout=10)
    conn.request("POST", "/v1/traces", _proto_traces(1).SerializeToString(), {"Content-Type": "application/x-protobuf"})
    reply = conn.getresponse()
    assert (reply.status, reply.read()) == (400, b"this port speaks TLS: use https://\n")
    conn.close()
    with grpc.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                trace_service_pb2.ExportTraceServiceRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as untrusted:  # a server certificate the client does not trust
        _grpc_export(pki, edge.grpc_port, (("authorization", f"Bearer {TOKEN}"),), root=False)
    assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    assert edge.receiver.snapshot()["tls_handshake_not_tls"] == 1
    assert _post_traces(pki, edge.http_port, f"Bearer {TOKEN}")[0] == 200  # the server goes on serving
    assert edge.spans() == 3  # the last request's: nothing of the refused ones


def _client_hello() -> bytes:
    """The bytes a TLS client opens with, without a connection."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> float:
    """Seconds until the server closes `sock`, sending it `drip` a byte every 50 ms meanwhile."""
    start = time.monotonic()
    sock.settimeout(0.05)
    for byte in [drip[i:i + 1] for i in range(len(drip))] + [b""] * int(seconds / 0.05):
        try:
            if byte:
                sock.sendall(byte)
            if sock.recv(1) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:  # reset: closed as well
            return time.monotonic() - start
    raise AssertionError(f"still open after {seconds} s")


def test_a_handshake_never_completed_is_cut_at_the_header_deadline_and_frees_its_slot(pki, tmp_path, tls_files):
    edge = TlsReceiver(tmp_path / "slow.duckdb", tls_files, limits=Limits(read_header_timeout_s=1.0,
                                                                          max_connections=1))
    try:
        with socket.create_connection(("127.0.0.1", edge.http_port)) as silent:
            assert _closed_within(silent, 5) < 2.5
        hello = _client_hello()
        assert len(hello) > 100  # dripped over more than the deadline, it cannot extend it
        with socket.create_connection(("127.0.0.1", edge.http_port)) as slow:
            assert _closed_within(slow, 5, drip=hello) < 2.5
        # the handshake closes the socket before the server counts the timeout: the count may lag the close a little
        deadline = time.monotonic() + 5
        while edge.receiver.snapshot().get("tls_handshake_timeout", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert edge.receiver.snapshot()["tls_handshake_timeout"] == 2
        with socket.create_connection(("127.0.0.1", edge.grpc_port)) as silent:  # gRPC's own handshake deadline
            assert _closed_within(silent, 5) < 2.5
        assert _post_traces(pki, edge.http_port, f"Bearer {TOKEN}")[0] == 200  # the one slot is free again
    finally:
        edge.close()


def test_mutual_tls_needs_a_client_certificate_signed_by_the_client_ca(pki, tmp_path):
    tls = TlsFiles(pki / "server.crt", pki / "server.key", pki / "ca.crt")
    edge = TlsReceiver(tmp_path / "mtls.duckdb", tls, token=None)
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _post_traces(pki, edge.http_port)
        assert _post_traces(pki, edge.http_port, cert="client")[0] == 200
        credentials = grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes(), (pki / "client.key").read_bytes(),
                                                   (pki / "client.crt").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{edge.grpc_port}", credentials) as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                _proto_traces(2), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            _grpc_export(pki, edge.grpc_port)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert edge.receiver.snapshot()["tls_handshake_failed"] == 1
        assert edge.spans() == 3
    finally:
        edge.close()


def _served_subject(pki, port) -> str:
    context = _client_context(pki)
    context.set_alpn_protocols(["h2", "http/1.1"])  # gRPC's port wants HTTP/2
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return dict(item[0] for item in tls.getpeercert()["subject"])["commonName"]


def test_reload_serves_the_new_certificate_and_a_bad_one_keeps_the_old(pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((pki / "server.crt").read_bytes())
    key.write_bytes((pki / "server.key").read_bytes())
    tls = TlsFiles(cert, key)
    edge = TlsReceiver(tmp_path / "reload.duckdb", tls, token=None)
    try:
        assert _served_subject(pki, edge.http_port) == _served_subject(pki, edge.grpc_port) == "server"
        cert.write_bytes(b"not a certificate")
        assert not tls.reload()
        assert _served_subject(pki, edge.http_port) == "server"
        cert.write_bytes((pki / "server2.crt").read_bytes())
        key.write_bytes((pki / "server2.key").read_bytes())
        assert tls.reload()
        assert _served_subject(pki, edge.http_port) == _served_subject(pki, edge.grpc_port) == "server2"
        _grpc_export(pki, edge.grpc_port)
    finally:
        edge.close()


def _get(pki, port, path, token=None) -> tuple[int, str]:
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=_client_context(pki)) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _export_with_the_sdk(exporter) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    provider = TracerProvider(resource=Resource.create({"service.name": "llm-gateway", "host.name": "n1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _ in range(2):
        with provider.get_tracer("t").start_as_current_span(
                "POST", kind=SpanKind.SERVER, attributes={"http.request.header.x-slo-tier": ["standard"]}):
            pass
    provider.shutdown()


def test_serve_with_tls_and_a_token_takes_the_sdk_exporters_and_counts_refusals(pki, tmp_path, monkeypatch):
    # requests lets these variables override the session's CA file, which is how the SDK passes certificate_file
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((pki / "server.crt").read_bytes())
    key.write_bytes((pki / "server.key").read_bytes())
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    db, http_port, grpc_port = tmp_path / "serve.duckdb", free_port(), free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--decode-workers", "0",
         "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--bearer-token-file", str(token_file)],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "SLOSCOPE_BEARER_TOKEN": ""})
    try:
        wait_listening(http_port, serve, "sloscope serve")
        wait_listening(grpc_port, serve, "sloscope serve")
        authorization = {"authorization": f"Bearer {TOKEN}"}
        _export_with_the_sdk(HttpExporter(endpoint=f"https://127.0.0.1:{http_port}/v1/traces",
                                          certificate_file=str(pki / "ca.crt"), headers=authorization))
        _export_with_the_sdk(GrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", headers=authorization,
                                          credentials=grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes())))
        wrong = HttpExporter(endpoint=f"https://127.0.0.1:{http_port}/v1/traces", certificate_file=str(pki / "ca.crt"),
                             headers={"authorization": "Bearer nope"})
        _export_with_the_sdk(wrong)  # the SDK logs the 401 and drops the spans
        assert _get(pki, http_port, "/healthz") == (200, "ok\n")
        assert _get(pki, http_port, "/metrics")[0] == 401
        status, exposition = _get(pki, http_port, "/metrics", TOKEN)
        assert status == 200
        # two exports with the wrong token, one GET without one
        assert 'sloscope_receiver_unauthenticated_total{protocol="http"} 3.0' in exposition
        assert 'sloscope_receiver_requests_total{outcome="accepted",signal="traces"} 4.0' in exposition
        cert.write_bytes((pki / "server2.crt").read_bytes())
        key.write_bytes((pki / "server2.key").read_bytes())
        serve.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _served_subject(pki, http_port) != "server2":
            assert time.monotonic() < deadline, "SIGHUP did not reload the certificate"
            time.sleep(0.1)
    finally:
        serve.send_signal(signal.SIGTERM)
        _, stderr = serve.communicate(timeout=30)
    assert serve.returncode == 0, stderr
    assert "OTLP/HTTP on https://127.0.0.1" in stderr and TOKEN not in stderr
    with Store(db) as store:
        assert store.rows("SELECT count(*) FROM requests")[0][0] == 4


def _edge_flags(**given) -> argparse.Namespace:
    flags = {"tls_cert_file": None, "tls_key_file": None, "tls_client_ca_file": None, "bearer_token_file": None}
    return argparse.Namespace(**{**flags, **given})


@pytest.mark.parametrize("given, env, message", [
    ({"tls_cert_file": Path("x.crt")}, {}, "--tls-cert-file and --tls-key-file go together"),
    ({"tls_client_ca_file": Path("ca.crt")}, {}, "--tls-client-ca-file needs --tls-cert-file"),
    ({"tls_cert_file": Path("missing.crt"), "tls_key_file": Path("missing.key")}, {}, "missing.crt: cannot read"),
    ({}, {BEARER_TOKEN_ENV: "short"}, "at least 16 characters"),
    ({}, {BEARER_TOKEN_ENV: "a token with spaces in it"}, "printable ASCII without spaces"),
])
def test_bad_edge_settings_are_one_clear_error(given, env, message):
    with pytest.raises(ValueError, match=message):
        edge_of(_edge_flags(**given), env)


def test_the_token_comes_from_the_file_or_the_environment_and_tls_from_the_pair(pki, tmp_path):
    assert edge_of(_edge_flags(), {}) == Edge()
    assert edge_of(_edge_flags(), {BEARER_TOKEN_ENV: TOKEN}).auth.token == TOKEN.encode()
    (tmp_path / "token").write_text("from-the-file-0123456789\n")
    edge = edge_of(_edge_flags(bearer_token_file=tmp_path / "token", tls_cert_file=pki / "server.crt",
                               tls_key_file=pki / "server.key"), {BEARER_TOKEN_ENV: TOKEN})
    assert edge.auth == BearerAuth(b"from-the-file-0123456789", OPEN_PAGES) and edge.scheme() == "https"
