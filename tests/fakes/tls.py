"""A throwaway PKI for tests, made with the openssl command: a CA, a server certificate for 127.0.0.1 and
localhost, and a client certificate, all signed by that CA, as PEM files in a directory.

    pki = make_pki(tmp_path)        # pki.ca, pki.server.cert / .key, pki.client_cert, pki.client_key
    OtlpSink("http", tls=pki.server)                 # TLS
    OtlpSink("http", tls=pki.server_requiring_client)  # mutual TLS: a client certificate from the CA
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class ServerTls:
    cert: str
    key: str
    client_ca: str | None = None  # set: clients must present a certificate this CA signed

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.client_ca)
        return ctx

    def grpc_credentials(self):
        import grpc

        read = lambda path: Path(path).read_bytes()  # noqa: E731
        return grpc.ssl_server_credentials([(read(self.key), read(self.cert))],
                                           root_certificates=read(self.client_ca) if self.client_ca else None,
                                           require_client_auth=bool(self.client_ca))


@dataclass(frozen=True)
class Pki:
    ca: str
    server: ServerTls
    client_cert: str
    client_key: str

    @property
    def server_requiring_client(self) -> ServerTls:
        return replace(self.server, client_ca=self.ca)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(directory: Path, name: str, subject: str, ca: Path, ca_key: Path, extensions: str) -> tuple[str, str]:
    key, csr, cert, ext = (directory / f"{name}{s}" for s in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", "2", "-out", str(cert), "-extfile", str(ext))
    return str(cert), str(key)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=sloscope test CA")
    server = _signed(directory, "server", "/CN=127.0.0.1", ca, ca_key,
                     "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = _signed(directory, "client", "/CN=sloscope-collector", ca, ca_key, "extendedKeyUsage=clientAuth\n")
    return Pki(str(ca), ServerTls(*server), *client)
