"""JSON-RPC 2.0 client for an SPDK target's Unix socket (default /var/tmp/spdk.sock).

Wire format, as SPDK's server speaks it: each request is one JSON object written to the stream socket; each
response is one JSON object, with no length prefix and no delimiter (there may be whitespace or none between
two responses). So the reader accumulates text and takes complete values off its front with
`json.JSONDecoder.raw_decode`, as SPDK's own Python client does. To tell "incomplete, read more" from
"malformed", a small scanner finds where the first top-level object or array ends (tracking strings and
escapes); only that span is handed to `raw_decode`, and a span that does not decode is malformed, reported
at once instead of waiting for the timeout.

Errors, all `SpdkError`:
- `SpdkRpcError`: the target answered with a JSON-RPC error object (`code`, `message`, `data` kept);
- `SpdkTimeout`: no complete response within the timeout;
- `SpdkProtocolError`: malformed JSON, a response that is not a JSON-RPC 2.0 response, an unknown id, or
  the connection closing mid-response;
- `SpdkConnectionError`: the socket cannot be reached.
After a timeout or protocol error the connection is closed (its stream can no longer be trusted); the next
call reconnects. A kept connection that the target closed while idle (it restarted) is noticed when a call
gets no answer at all, and that call is sent once more on a new connection (every method used is idempotent).

Methods used here take their parameters exactly as SPDK documents them (doc/jsonrpc.md); methods that
accept no parameters (framework_get_reactors) are sent without a "params" member, since SPDK rejects
even an empty one for them. bdev_get_iostat for every bdev is sent without parameters (nothing
version-specific); for some bdevs it takes the `names` array (SPDK v26.01 and later, and the only form since
v26.05 removed `name`), and a target that refuses that (an unknown parameter is INTERNAL_ERROR
"spdk_json_decode_object failed") is asked once per bdev with the `name` that older releases take; the form
the target took is remembered for the connection's target.
"""

from __future__ import annotations

import codecs
import itertools
import json
import socket
import time
from typing import Any, Iterable, Mapping, Sequence

DEFAULT_SOCKET = "/var/tmp/spdk.sock"
DEFAULT_TIMEOUT = 5.0
MAX_RESPONSE_CHARS = 64 * 2**20

# JSON-RPC 2.0 error codes SPDK uses (include/spdk/jsonrpc.h)
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
INVALID_STATE = -1  # SPDK_JSONRPC_ERROR_INVALID_STATE: the method is not allowed in the target's state
DECODE_FAILED = "spdk_json_decode_object failed"  # INTERNAL_ERROR's message for parameters it does not take


class SpdkError(Exception):
    """Anything that went wrong talking to the SPDK target."""


class SpdkConnectionError(SpdkError):
    pass


class SpdkTimeout(SpdkError):
    pass


class SpdkProtocolError(SpdkError):
    pass


class _StaleConnection(Exception):
    """The target closed the connection before answering anything."""


class SpdkRpcError(SpdkError):
    """The target answered with a JSON-RPC error object."""

    def __init__(self, method: str, code: int, message: str, data: Any = None):
        self.method, self.code, self.message, self.data = method, code, message, data
        text = f"SPDK {method}: error {code}: {message}"
        if data is not None:
            text += f" ({json.dumps(data)[:200]})"
        super().__init__(text)


def _first_value_end(buf: str, start: int) -> int | None:
    """End index (exclusive) of the JSON object/array starting at buf[start] ('{' or '['), or None when the
    buffer ends before it does. Only brackets outside strings count."""
    depth = 0
    in_string = escaped = False
    for i in range(start, len(buf)):
        c = buf[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class JsonStreamDecoder:
    """Complete JSON values off a byte stream without framing (UTF-8, split anywhere, several per chunk)."""

    def __init__(self, max_chars: int = MAX_RESPONSE_CHARS):
        self._bytes = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._decoder = json.JSONDecoder()
        self.max_chars = max_chars

    @property
    def pending(self) -> str:
        return self._buf

    def feed(self, data: bytes) -> list[Any]:
        try:
            self._buf += self._bytes.decode(data)
        except UnicodeDecodeError as exc:
            raise SpdkProtocolError(f"response is not UTF-8: {exc}") from None
        values = []
        while True:
            stripped = self._buf.lstrip()
            if not stripped:
                self._buf = ""
                break
            if stripped[0] not in "{[":
                raise SpdkProtocolError(f"malformed JSON from the target: expected an object, got {stripped[:40]!r}")
            end = _first_value_end(stripped, 0)
            if end is None:
                self._buf = stripped
                if len(stripped) > self.max_chars:
                    raise SpdkProtocolError(f"response larger than {self.max_chars} characters")
                break
            try:
                value, idx = self._decoder.raw_decode(stripped[:end])
            except json.JSONDecodeError as exc:
                raise SpdkProtocolError(f"malformed JSON from the target: {exc.msg} at character {exc.pos}: "
                                        f"{stripped[max(0, exc.pos - 20):exc.pos + 20]!r}") from None
            if idx != end:
                raise SpdkProtocolError("malformed JSON from the target")
            values.append(value)
            self._buf = stripped[end:]
        return values


class SpdkRpcClient:
    """One persistent connection to the target; `call` / `call_many` are synchronous and thread-unsafe."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT):
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._decoder = JsonStreamDecoder()
        self._ids = itertools.count(1)
        self.iostat_takes_names: bool | None = None  # bdev_get_iostat's `names` array: not asked yet

    # -- connection ------------------------------------------------------------------------------------------

    def connect(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except FileNotFoundError:
            sock.close()
            raise SpdkConnectionError(f"SPDK socket {self.path}: not found (is spdk_tgt running? its -r option "
                                      "sets the path)") from None
        except PermissionError:
            sock.close()
            raise SpdkConnectionError(f"SPDK socket {self.path}: permission denied (run as root or as a member "
                                      "of the socket's group)") from None
        except ConnectionRefusedError:
            sock.close()
            raise SpdkConnectionError(f"SPDK socket {self.path}: connection refused (the target is not running; "
                                      "a stale socket file is left)") from None
        except socket.timeout:
            sock.close()
            raise SpdkTimeout(f"SPDK socket {self.path}: connect timed out after {self.timeout} s") from None
        except OSError as exc:
            sock.close()
            raise SpdkConnectionError(f"SPDK socket {self.path}: {exc.strerror or exc}") from None
        self._sock = sock
        self._decoder = JsonStreamDecoder()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> "SpdkRpcClient":
        self.connect()
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # -- calls -----------------------------------------------------------------------------------------------

    def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.call_many([(method, params)])[0]

    def call_many(self, calls: Iterable[tuple[str, Mapping[str, Any] | None]], *,
                  raise_errors: bool = True) -> list[Any]:
        """Send the requests together (pipelined) and return their results in request order. The target may
        answer in any order and coalesce answers into one write; responses are matched by id. An error
        response raises `SpdkRpcError` (after every response is read, so the connection stays in step), or
        with raise_errors=False takes the place of that call's result."""
        calls = list(calls)
        requests = []
        for method, params in calls:
            req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": next(self._ids)}
            if params is not None:
                req["params"] = dict(params)
            requests.append(req)
        wire = "".join(json.dumps(r, separators=(",", ":")) for r in requests).encode()
        for attempt in (1, 2):
            reused = self._sock is not None
            self.connect()
            try:
                self._sock.sendall(wire)
                responses = self._receive({r["id"]: r["method"] for r in requests})
                break
            except _StaleConnection as exc:
                self.close()
                if reused and attempt == 1:
                    continue  # the target closed an idle connection (e.g. it restarted): once more, anew
                raise SpdkProtocolError(f"SPDK target closed the connection without answering "
                                        f"{requests[0]['method']}") from exc
            except (BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if reused and attempt == 1:
                    continue
                raise SpdkConnectionError(f"SPDK socket {self.path}: {exc.strerror or exc}") from None
            except (SpdkTimeout, SpdkProtocolError, SpdkConnectionError):
                self.close()
                raise
            except socket.timeout:
                self.close()
                raise SpdkTimeout(f"SPDK {requests[0]['method']}: sending timed out after {self.timeout} s") from None
            except OSError as exc:
                self.close()
                raise SpdkConnectionError(f"SPDK socket {self.path}: {exc.strerror or exc}") from None
        results: list[Any] = []
        for req in requests:
            resp = responses[req["id"]]
            if "error" in resp:
                err = resp["error"]
                if isinstance(err, dict) and isinstance(err.get("code"), int):
                    error = SpdkRpcError(req["method"], err["code"], str(err.get("message", "")), err.get("data"))
                else:
                    error = SpdkRpcError(req["method"], INTERNAL_ERROR, f"malformed error object: {err!r}")
                if raise_errors:
                    raise error
                results.append(error)
            else:
                results.append(resp["result"])
        return results

    def _receive(self, waiting: dict[int, str]) -> dict[int, dict]:
        got: dict[int, dict] = {}
        deadline = time.monotonic() + self.timeout
        while len(got) < len(waiting):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [waiting[i] for i in waiting if i not in got]
                raise SpdkTimeout(f"SPDK {', '.join(missing)}: no response within {self.timeout} s")
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout:
                continue  # the deadline check above raises
            if not chunk:
                pending = len(self._decoder.pending)
                if not pending and not got:
                    raise _StaleConnection()
                raise SpdkProtocolError(f"SPDK target closed the connection in the middle of a response "
                                        f"({pending} characters received)" if pending else
                                        "SPDK target closed the connection before answering every request")
            for value in self._decoder.feed(chunk):
                resp = self._check_response(value)
                rid = resp["id"]
                if rid not in waiting or rid in got:
                    raise SpdkProtocolError(f"response with unexpected id {rid!r} (waiting for {sorted(waiting)})")
                got[rid] = resp
        return got

    @staticmethod
    def _check_response(value: Any) -> dict:
        if not isinstance(value, dict):
            raise SpdkProtocolError(f"not a JSON-RPC response (a JSON {type(value).__name__}, not an object)")
        if value.get("jsonrpc") != "2.0":
            raise SpdkProtocolError(f"not a JSON-RPC 2.0 response (jsonrpc={value.get('jsonrpc')!r})")
        if ("result" in value) == ("error" in value):
            raise SpdkProtocolError("JSON-RPC response must carry exactly one of 'result' and 'error'")
        if "id" not in value:
            raise SpdkProtocolError("JSON-RPC response without an id")
        return value

    # -- SPDK methods ----------------------------------------------------------------------------------------

    def bdev_get_iostat(self, names: Sequence[str] = ()) -> dict:
        """I/O statistics of every bdev, or of `names` in the parameter form this target takes."""
        if not names:
            return self.call("bdev_get_iostat")
        if self.iostat_takes_names is not False:
            try:
                result = self.call("bdev_get_iostat", {"names": list(names)})
            except SpdkRpcError as exc:
                if self.iostat_takes_names or exc.code != INTERNAL_ERROR or exc.message != DECODE_FAILED:
                    raise
                self.iostat_takes_names = False  # a release before v26.01
            else:
                self.iostat_takes_names = True
                return result
        answers = self.call_many([("bdev_get_iostat", {"name": n}) for n in names])
        merged = dict(answers[0])
        merged["bdevs"] = [b for answer in answers for b in answer.get("bdevs") or ()]
        return merged

    def framework_get_reactors(self) -> dict:
        return self.call("framework_get_reactors")

    def bdev_nvme_get_controllers(self) -> list:
        return self.call("bdev_nvme_get_controllers")

    def bdev_nvme_get_controller_health_info(self, name: str) -> dict:
        return self.call("bdev_nvme_get_controller_health_info", {"name": name})

    def bdev_set_qd_sampling_period(self, name: str, period_us: int) -> bool:
        """Enable (period > 0, microseconds) or disable (0) queue-depth sampling: io_time and
        weighted_io_time appear in bdev_get_iostat only while it is on."""
        if int(period_us) < 0:
            raise ValueError("period must be >= 0 microseconds")
        return self.call("bdev_set_qd_sampling_period", {"name": name, "period": int(period_us)})

    def bdev_set_qos_limit(self, name: str, *, rw_ios_per_sec: int | None = None,
                           rw_mbytes_per_sec: int | None = None, r_mbytes_per_sec: int | None = None,
                           w_mbytes_per_sec: int | None = None) -> bool:
        """Set a bdev's QoS rate limits (SPDK bdev_set_qos_limit). Only the limits given are sent; 0 means
        unlimited. SPDK rounds rw_ios_per_sec up to a multiple of 1000."""
        params: dict[str, Any] = {"name": name}
        limits = {"rw_ios_per_sec": rw_ios_per_sec, "rw_mbytes_per_sec": rw_mbytes_per_sec,
                  "r_mbytes_per_sec": r_mbytes_per_sec, "w_mbytes_per_sec": w_mbytes_per_sec}
        for key, value in limits.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
            params[key] = value
        if len(params) == 1:
            raise ValueError("bdev_set_qos_limit needs at least one limit")
        return self.call("bdev_set_qos_limit", params)
