"""TLS at the edge: the certificate and key (and, for mTLS, the client CA) that the HTTP and gRPC servers serve,
reloadable in place, and the bounded server-side handshake of an HTTP connection.

The settings mirror the OpenTelemetry Collector's confighttp / configgrpc `tls` block: `cert_file`, `key_file`,
`client_ca_file` (which makes a client certificate signed by that CA mandatory), and TLS 1.2 at least.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)
TLS_HANDSHAKE_RECORD = b"\x16"  # the content type of a TLS record that opens a handshake
NOT_TLS_DRAIN_BYTES = 1 << 20  # of a plain-text request read and dropped, so that its client can read the answer
NOT_TLS_ANSWER = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                  b"\r\nthis port speaks TLS: use https://\n")


class NotTls(ConnectionError):
    """The client's first byte does not open a TLS handshake (most likely plain HTTP)."""


@dataclass(frozen=True)
class _Loaded:
    context: ssl.SSLContext
    grpc_config: object  # grpc.ServerCertificateConfiguration
    generation: int


class TlsFiles:
    """The served certificate, read from files; `reload()` rereads them (on SIGHUP) and a file that fails to
    load keeps what was served before, so a bad rotation never takes the listeners down. Connections read
    `context` (one reference, swapped whole), so no lock is needed, and none that a signal handler, which
    calls reload(), could deadlock on."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None):
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self._loaded = self._load(generation=1)  # ValueError: the files do not make a server certificate

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    @property
    def context(self) -> ssl.SSLContext:
        """The context new HTTP connections take."""
        return self._loaded.context

    def reload(self) -> bool:
        """Reread the files; False (and logged) where they do not load."""
        try:
            self._loaded = self._load(self._loaded.generation + 1)
        except ValueError as exc:
            log.error("TLS files not reloaded, still serving the previous certificate: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials whose certificate follows reload(): gRPC asks for it on every new connection."""
        served = {"generation": self._loaded.generation}

        def current():
            loaded = self._loaded
            if loaded.generation == served["generation"]:
                return None  # unchanged
            served["generation"] = loaded.generation
            return loaded.grpc_config

        return grpc.dynamic_ssl_server_credentials(self._loaded.grpc_config, current,
                                                   require_client_authentication=self.mutual)

    def _load(self, generation: int) -> _Loaded:
        cert, key = _read(self.cert_file), _read(self.key_file)
        client_ca = _read(self.client_ca_file) if self.mutual else None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            if client_ca is not None:
                context.load_verify_locations(cafile=self.client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ValueError(f"{self.cert_file} / {self.key_file}"
                             f"{f' / {self.client_ca_file}' if self.mutual else ''}: not a usable TLS "
                             f"certificate, key and CA: {exc}") from None
        config = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)
        return _Loaded(context, config, generation)


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None


def accept_tls(sock: socket.socket, context: ssl.SSLContext, within_s: float) -> ssl.SSLSocket:
    """The server side of the handshake on an accepted connection, done within `within_s` in all (however
    slowly the client sends its bytes). Raises TimeoutError, NotTls (answered with a plain 400 first),
    ssl.SSLError, or another OSError where the client went away."""
    deadline = time.monotonic() + within_s
    sock.settimeout(within_s)
    first = sock.recv(1, socket.MSG_PEEK)
    if not first:
        raise ConnectionAbortedError("closed before the TLS handshake")
    if first != TLS_HANDSHAKE_RECORD:
        _answer_plain_text(sock, deadline)
        raise NotTls("not a TLS handshake")
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    try:
        tls.settimeout(max(deadline - time.monotonic(), 1e-3))  # the ssl module holds it as one deadline
        tls.do_handshake()
    except BaseException:
        tls.close()
        raise
    return tls


def _answer_plain_text(sock: socket.socket, deadline: float) -> None:
    """A plain 400 to a client speaking plain text, then what it still sends is read (up to the deadline and a
    bound) before the close: closing on unread bytes resets the connection, and the reset destroys the answer."""
    sock.sendall(NOT_TLS_ANSWER)
    sock.shutdown(socket.SHUT_WR)
    left = NOT_TLS_DRAIN_BYTES
    try:
        while left > 0 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            chunk = sock.recv(min(left, 65536))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:  # the deadline, or the client gone: the answer is sent either way
        return
