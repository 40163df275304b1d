"""A stand-in ClickHouse server for tests: the part of ClickHouse's HTTP interface
(https://clickhouse.com/docs/en/interfaces/http) that clickhouse-connect uses, answered by chDB (ClickHouse's engine
in-process), so that `clickhouse://` stores run their production code path (HttpBackend, clickhouse-connect) over
real HTTP on 127.0.0.1.

What it speaks:
  - GET /ping and a bare GET / answer "Ok.\n".
  - The query comes in the `query` URL parameter, the POST body, or both: then a line feed joins them, as the
    documentation says, which is how an INSERT names its table in the URL and sends its data in the body.
  - `INSERT ... FORMAT F` followed by data: the data goes to a temporary file that chDB reads with FROM INFILE, so
    it is parsed by the same input format as the server's.
  - `param_NAME` URL parameters bind `{NAME:Type}` placeholders; `database` (or X-ClickHouse-Database) picks the
    database; `default_format` (or X-ClickHouse-Format) the format of a query without a FORMAT clause (else
    TabSeparated); any other parameter that is not one of the interface's own is a setting for this query only.
  - Credentials from Basic auth, X-ClickHouse-User/X-ClickHouse-Key or the user/password parameters, checked
    against the one user it was started with: a mismatch is AUTHENTICATION_FAILED (516) with HTTP 401.
  - Request bodies with Content-Encoding gzip, deflate, zstd or lz4; responses compressed with the first method of
    Accept-Encoding it can produce when enable_http_compression=1 (clickhouse-connect's Native queries ask so).
  - Headers the client reads: X-ClickHouse-Query-Id, X-ClickHouse-Format (on statements that produce a result),
    X-ClickHouse-Timezone, X-ClickHouse-Summary, and X-ClickHouse-Exception-Code on an error, whose body is the
    exception text with a non-200 status.
  - Multi-statements are refused, as the server does.
  - A multipart/form-data body (the query and bound parameters as form fields, where they would not fit in the
    URL) is read as the server reads it.
What it does not: sessions are not kept apart (session_id is accepted; one chDB session serves every request, so a
SET from one client is seen by all), client_protocol_version is ignored (clickhouse-connect then reads Native
without block info, as it does through a proxy that drops the parameter), no progress headers, no external data,
no ClickHouse-native `compress`/`decompress`.

Run it as `python -m tests.clickhouse_http --path DIR --port PORT --user USER [--database DB ...]`, the password in
$CLICKHOUSE_STANDIN_PASSWORD (kept off the command line). chDB allows one database directory per process, which is
why it runs in a process of its own.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import zlib
from contextlib import contextmanager
from email import policy as email_policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

PASSWORD_ENV = "CLICKHOUSE_STANDIN_PASSWORD"

# URL parameters the HTTP interface itself takes; every other one (bar param_*) is a setting.
TRANSPORT_PARAMS = {"query", "database", "default_format", "session_id", "session_timeout", "session_check",
                    "close_session", "query_id", "quota_key", "buffer_size", "wait_end_of_query", "compress",
                    "decompress", "user", "password", "stacktrace", "role", "client_protocol_version"}
# Statements that produce a result set (the server reports its format on them, even when it has no rows).
RESULT_STATEMENTS = {"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK"}
# Exception codes the server answers with a more precise status than 500, as its exceptionCodeToHTTPStatus does.
HTTP_STATUS = {
    516: 401, 192: 401, 193: 401, 194: 401,  # AUTHENTICATION_FAILED, UNKNOWN_USER, WRONG_/REQUIRED_PASSWORD
    497: 403, 164: 403,  # ACCESS_DENIED, READONLY
    60: 404, 81: 404, 46: 404, 47: 404,  # UNKNOWN_TABLE, UNKNOWN_DATABASE, UNKNOWN_FUNCTION, UNKNOWN_IDENTIFIER
    62: 400, 27: 400, 115: 400, 456: 400,  # SYNTAX_ERROR, CANNOT_PARSE_..., UNKNOWN_SETTING, UNKNOWN_QUERY_PARAMETER
}
BINARY_FORMATS = {"Native", "Arrow", "ArrowStream", "Parquet", "RowBinary", "RowBinaryWithNamesAndTypes", "ORC"}

# INSERT INTO table [(columns)] FORMAT name, then the data: after blanks and at most one line feed.
INSERT_WITH_DATA = re.compile(rb"\A\s*(INSERT\s+INTO\s+(?:TABLE\s+)?[\w.`\"]+(?:\s*\([^()]*\))?)\s+FORMAT\s+(\w+)"
                              rb"[ \t]*(?:\r?\n)?", re.I)
FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*\Z", re.I)
# What hides a semicolon from the multi-statement check: quoted strings and identifiers, and comments.
QUOTED_OR_COMMENT = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`|--[^\n]*|/\*.*?\*/", re.S)


class ClickHouseError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _error_from(exc: Exception) -> ClickHouseError:
    """chDB raises with the server's own text, "Code: N. DB::Exception: ... (NAME)"."""
    if isinstance(exc, ClickHouseError):
        return exc
    text = str(exc)
    found = re.search(r"Code: (\d+)", text)
    if found:
        return ClickHouseError(int(found.group(1)), text)
    return ClickHouseError(1002, f"Code: 1002. DB::Exception: {type(exc).__name__}: {text}. (UNKNOWN_EXCEPTION)")


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Engine:
    """The one chDB session, one query at a time, with each request's database and settings applied to it."""

    def __init__(self, path: Path, databases: list[str]):
        from chdb import session

        self.session = session.Session(str(path))
        self.lock = threading.Lock()
        for name in databases:
            self.session.query(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        self.version, self.timezone = self.session.query("SELECT version(), timezone()", "TSV").bytes().decode().split()
        self.database: str | None = None
        self.applied: dict[str, str] = {}  # the URL settings now SET on the session

    def run(self, sql: str, fmt: str, params: dict[str, str], database: str, settings: dict[str, str]):
        with self.lock:
            try:
                if database != self.database:
                    self.session.query(f"USE `{database.replace('`', '')}`")
                    self.database = database
                self._apply(settings)
                result = self.session.query(sql, fmt, params=params)
            except Exception as exc:
                raise _error_from(exc) from None
            if re.match(r"\s*USE\b", sql, re.I):
                self.database = None  # the statement moved the session: set the next request's database again
            return result

    def _apply(self, settings: dict[str, str]) -> None:
        """URL settings hold for one query on the server, so those of the previous request go back to default."""
        for name in [n for n in self.applied if n not in settings]:
            self.session.query(f"SET {name} = DEFAULT")
            del self.applied[name]
        for name, value in settings.items():
            if self.applied.get(name) != value:
                if not re.fullmatch(r"\w+", name):
                    raise ClickHouseError(115, f"Code: 115. DB::Exception: Unknown setting '{name}'. (UNKNOWN_SETTING)")
                self.session.query(f"SET {name} = {_quoted(value)}")
                self.applied[name] = value


def _codecs():
    """Content-Encoding name -> (compress, decompress), for what is installed."""
    codecs = {"gzip": (gzip.compress, gzip.decompress), "deflate": (zlib.compress, zlib.decompress)}
    try:
        from backports import zstd
    except ImportError:
        try:
            from compression import zstd  # Python 3.14
        except ImportError:
            zstd = None
    if zstd is not None:
        codecs["zstd"] = (zstd.compress, zstd.decompress)
    try:
        import lz4.frame
        codecs["lz4"] = (lz4.frame.compress, lz4.frame.decompress)
    except ImportError:
        pass
    return codecs


CODECS = _codecs()


def _form_fields(content_type: str, body: bytes, params: dict[str, str]) -> bytes:
    """A multipart/form-data body's fields into `params` (the query and `param_NAME` values, as the server takes
    them where a client's bound parameters would not fit in the URL); answers the rest of the body, none."""
    message = BytesParser(policy=email_policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    for part in message.iter_parts():
        params[part.get_param("name", header="content-disposition")] = part.get_content()
    return b""


def _check_single_statement(sql: str) -> None:
    bare = QUOTED_OR_COMMENT.sub(" ", sql).rstrip().rstrip(";")
    if ";" in bare:
        raise ClickHouseError(62, "Code: 62. DB::Exception: Syntax error (Multi-statements are not allowed). "
                                  "(SYNTAX_ERROR)")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clickhouse-connect pools its connections
    server: "StandInServer"

    def log_message(self, *args) -> None:  # quiet: pytest shows the client's errors
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        body = self._body()
        if parts.path == "/ping" or (parts.path == "/" and self.command == "GET" and "query" not in params):
            return self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
        try:
            if parts.path != "/":
                raise ClickHouseError(0, f"Code: 0. DB::Exception: There is no handle {parts.path}")
            self._authenticate(params)
            encoding = self.headers.get("Content-Encoding")
            if encoding and encoding != "identity":
                if encoding not in CODECS:
                    raise ClickHouseError(36, f"Code: 36. DB::Exception: Unknown compression method {encoding}. "
                                              "(BAD_ARGUMENTS)")
                body = CODECS[encoding][1](body)
            if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
                body = _form_fields(self.headers["Content-Type"], body, params)
            data = params.get("query", "").encode()
            if data and body:
                data += b"\n"  # "a line feed is inserted between these two data parts"
            self._answer(data + body, params, query_id)
        except Exception as exc:  # a bad request body or header too: the client must get an answer, not a reset
            exc = _error_from(exc)
            message = f"{exc} (version {self.server.engine.version})\n".encode()
            self._send(HTTP_STATUS.get(exc.code, 500), message, {
                "Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Exception-Code": str(exc.code),
                "X-ClickHouse-Query-Id": query_id})

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authenticate(self, params: dict[str, str]) -> None:
        user, password = params.get("user"), params.get("password")
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        elif "X-ClickHouse-User" in self.headers:
            user, password = self.headers["X-ClickHouse-User"], self.headers.get("X-ClickHouse-Key", "")
        user, password = user or "default", password or ""
        expected_user, expected_password = self.server.credentials
        if not (hmac.compare_digest(user.encode(), expected_user.encode())
                and hmac.compare_digest(password.encode(), expected_password.encode())):
            raise ClickHouseError(516, f"Code: 516. DB::Exception: {user}: Authentication failed: password is "
                                       "incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)")

    def _answer(self, data: bytes, params: dict[str, str], query_id: str) -> None:
        engine = self.server.engine
        database = params.get("database") or self.headers.get("X-ClickHouse-Database") or "default"
        default_format = params.get("default_format") or self.headers.get("X-ClickHouse-Format") or "TabSeparated"
        settings = {k: v for k, v in params.items() if k not in TRANSPORT_PARAMS and not k.startswith("param_")}
        bind = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
        insert = INSERT_WITH_DATA.match(data)
        with tempfile.NamedTemporaryFile(dir=self.server.scratch) as rows:  # an INSERT's data, if it has some
            if insert:  # read by chDB from the file with the same input format as the server's
                rows.write(data[insert.end():])
                rows.flush()
                target, fmt = (g.decode() for g in insert.groups())
                sql = f"{target} FROM INFILE {_quoted(rows.name)} FORMAT {fmt}"
            else:
                sql = data.decode()
            _check_single_statement(sql)
            first = re.match(r"\s*(\w+)", sql)
            keyword = first.group(1).upper() if first else ""
            if self.command == "GET" and keyword not in RESULT_STATEMENTS | {"SET", "USE"}:
                raise ClickHouseError(164, "Code: 164. DB::Exception: Cannot execute query in readonly mode. For "
                                           "queries over HTTP, method GET implies readonly. You should use method "
                                           "POST for modifying queries. (READONLY)")
            result = engine.run(sql, default_format, bind, database, settings)
        found = FORMAT_CLAUSE.search(sql)
        out_format = found.group(1) if found and not insert else default_format
        headers = {
            "Content-Type": "application/octet-stream" if out_format in BINARY_FORMATS
            else "text/plain; charset=UTF-8",
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": settings.get("session_timezone") or engine.timezone,
            "X-ClickHouse-Summary": json.dumps({
                "read_rows": str(result.rows_read()), "read_bytes": str(result.bytes_read()),
                "written_rows": str(result.rows_written()), "written_bytes": str(result.bytes_written()),
                "total_rows_to_read": str(result.rows_read()), "elapsed_ns": str(int(result.elapsed() * 1e9)),
            }, separators=(",", ":")),
        }
        if keyword in RESULT_STATEMENTS:
            headers["X-ClickHouse-Format"] = out_format
        payload = result.bytes() or b""
        if settings.get("enable_http_compression") in ("1", "true") and payload:
            accepted = [m.split(";")[0].strip() for m in self.headers.get("Accept-Encoding", "").split(",")]
            method = next((m for m in accepted if m in CODECS), None)
            if method:
                payload, headers["Content-Encoding"] = CODECS[method][0](payload), method
        self._send(200, payload, headers)

    def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class StandInServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, engine: Engine, user: str, password: str, scratch: str):
        super().__init__(("127.0.0.1", port), Handler)
        self.engine, self.credentials, self.scratch = engine, (user, password), scratch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a stand-in ClickHouse HTTP server backed by chDB (tests only)")
    parser.add_argument("--path", type=Path, required=True, help="chDB's database directory")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", default="default")
    parser.add_argument("--database", action="append", default=[],
                        help="a database to create at start (as CLICKHOUSE_DB does for the server's image)")
    args = parser.parse_args(argv)
    engine = Engine(args.path, args.database)
    with tempfile.TemporaryDirectory() as scratch:
        server = StandInServer(args.port, engine, args.user, os.environ.get(PASSWORD_ENV, ""), scratch)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        server.serve_forever()
        server.server_close()
    engine.session.close()
    return 0


@contextmanager
def running(path: Path, user: str, password: str, databases=("otel",)):
    """A stand-in server in its own process; yields its port."""
    from tests.alerting_stack import free_port, wait_listening

    port = free_port()
    command = [sys.executable, "-m", "tests.clickhouse_http", "--path", str(path), "--port", str(port),
               "--user", user, *(a for d in databases for a in ("--database", d))]
    proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, PASSWORD_ENV: password})
    try:
        wait_listening(port, proc, "the stand-in ClickHouse server")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
