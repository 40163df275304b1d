"""An SPDK target stand-in: a JSON-RPC 2.0 server on a Unix socket (in a test's tmp dir) that answers the way
spdk_tgt does. Requests and responses are bare JSON objects on the stream (no framing); responses are shaped
as SPDK's source writes them:

- bdev_get_iostat (lib/bdev/bdev_rpc.c): {"tick_rate", "ticks", "bdevs": [{"name", then the I/O stat fields
  of spdk_bdev_dump_io_stat_json (bytes_read, num_read_ops, ..., read_latency_ticks, max_/min_..., io_error),
  then "queue_depth_polling_period", "queue_depth", "io_time", "weighted_io_time" only while queue-depth
  sampling is on, then "driver_specific"}]}. Its params are decoded strictly, by release (`version`): the
  `names` array from v26.01, the single `name` until v26.05 removed it (v26.01 refuses both together with
  -EINVAL); per_channel and reset_mode; an `old` target knows only name, and sends no "ticks". An unknown
  parameter is -32603 "spdk_json_decode_object failed", an unknown bdev -19 "No such device" (-ENODEV and
  spdk_strerror, as bdev_rpc.c answers).
- queue-depth sampling starts off for every bdev and is off again after `restart()`, as in bdev.c.
- framework_get_reactors (lib/event/app_rpc.c): {"tick_rate", "reactors": [{"lcore", "busy", "idle",
  "in_interrupt", "lw_threads": [{"name", "id", "cpumask", "elapsed"}]}]}; any params are an error.
- bdev_nvme_get_controllers, bdev_nvme_get_controller_health_info (temperature_celsius written as the
  unsigned 64-bit `kelvin - 273`, as SPDK does), bdev_set_qd_sampling_period, bdev_set_qos_limit.
- errors as {"jsonrpc": "2.0", "id", "error": {"code", "message"}}, with SPDK's codes (include/spdk/jsonrpc.h:
  -32601 "Method not found", -32602 invalid params, -32603 internal error, and negative errno values).

Queue-depth accounting follows bdev.c: every `period` microseconds with I/O outstanding adds `period` to
io_time and `period * depth` to weighted_io_time (`FakeBdev.busy`).

Test controls: `write_mode` "whole" (one write per response), "split" (a few bytes per write), "coalesce" (all
answers to one read in a single write, in reverse order); `errors[method]` (code, message); `raw[method]`
(bytes to send instead of the answer, `{id}` replaced; `close_after_raw` then closes the connection);
`silent` methods get no answer; `restart()` resets every counter as a restarted target would.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field

TICK_RATE = 2_400_000_000
UINT64 = 2**64


@dataclass
class FakeBdev:
    name: str
    nvme_ctrlr: str | None = None
    bytes_read: int = 0
    num_read_ops: int = 0
    bytes_written: int = 0
    num_write_ops: int = 0
    read_latency_ticks: int = 0
    write_latency_ticks: int = 0
    qd_period_us: int = 0
    queue_depth: int = 0
    io_time: int = 0
    weighted_io_time: int = 0
    qos: dict = field(default_factory=dict)

    def io(self, direction: str, ops: int, mean_latency_s: float, block: int = 4096, tick_rate: int = TICK_RATE):
        ticks = round(ops * mean_latency_s * tick_rate)
        if direction == "read":
            self.num_read_ops += ops
            self.bytes_read += ops * block
            self.read_latency_ticks += ticks
        else:
            self.num_write_ops += ops
            self.bytes_written += ops * block
            self.write_latency_ticks += ticks

    def busy(self, polls_busy: int, depth: int) -> None:
        """`polls_busy` sampling periods found `depth` I/Os outstanding (needs qd sampling on)."""
        assert self.qd_period_us, "queue-depth sampling is off"
        self.queue_depth = depth
        self.io_time += polls_busy * self.qd_period_us
        self.weighted_io_time += polls_busy * self.qd_period_us * depth

    def reset(self) -> None:
        for f in ("bytes_read", "num_read_ops", "bytes_written", "num_write_ops", "read_latency_ticks",
                  "write_latency_ticks", "queue_depth", "io_time", "weighted_io_time"):
            setattr(self, f, 0)

    def iostat(self) -> dict:
        out = {"name": self.name, "bytes_read": self.bytes_read, "num_read_ops": self.num_read_ops,
               "bytes_written": self.bytes_written, "num_write_ops": self.num_write_ops, "bytes_unmapped": 0,
               "num_unmap_ops": 0, "bytes_copied": 0, "num_copy_ops": 0,
               "read_latency_ticks": self.read_latency_ticks,
               "max_read_latency_ticks": self.read_latency_ticks // max(1, self.num_read_ops) * 2,
               "min_read_latency_ticks": self.read_latency_ticks // max(1, self.num_read_ops) // 2,
               "write_latency_ticks": self.write_latency_ticks,
               "max_write_latency_ticks": self.write_latency_ticks // max(1, self.num_write_ops) * 2,
               "min_write_latency_ticks": self.write_latency_ticks // max(1, self.num_write_ops) // 2,
               "unmap_latency_ticks": 0, "max_unmap_latency_ticks": 0, "min_unmap_latency_ticks": 0,
               "copy_latency_ticks": 0, "max_copy_latency_ticks": 0, "min_copy_latency_ticks": 0,
               "io_error": {}}
        if self.qd_period_us:
            out.update({"queue_depth_polling_period": self.qd_period_us, "queue_depth": self.queue_depth,
                        "io_time": self.io_time, "weighted_io_time": self.weighted_io_time})
        if self.nvme_ctrlr:
            out["driver_specific"] = {"nvme_error": {}}
        return out


@dataclass
class FakeReactor:
    lcore: int
    busy: int = 0
    idle: int = 0


class FakeSpdkTarget:
    def __init__(self, path: str, old: bool = False, version: str = "26.05"):
        self.path = path
        self.old = old
        self.version = tuple(int(part) for part in version.split("."))
        self.tick_rate = TICK_RATE
        self.ticks = 5_000_000_000_000  # the TSC: runs across target restarts
        self.app_started = self.ticks - 10 * TICK_RATE
        self.bdevs: dict[str, FakeBdev] = {"Nvme0n1": FakeBdev("Nvme0n1", "Nvme0"), "Malloc0": FakeBdev("Malloc0")}
        self.reactors: dict[int, FakeReactor] = {0: FakeReactor(0), 1: FakeReactor(1)}
        self.controllers: dict[str, dict] = {"Nvme0": {"traddr": "0000:5e:00.0", "kelvin": 311}}
        self.nvme_module = True
        self.write_mode = "whole"
        self.errors: dict[str, tuple[int, str]] = {}
        self.raw: dict[str, bytes] = {}
        self.close_after_raw = False
        self.silent: set[str] = set()
        self.requests: list[dict] = []
        self.connections = 0
        self.lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._stopping = threading.Event()

    # -- the target's life ------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.ticks += round(seconds * self.tick_rate)

    def run_reactor(self, lcore: int, busy_s: float, idle_s: float) -> None:
        with self.lock:
            r = self.reactors[lcore]
            r.busy += round(busy_s * self.tick_rate)
            r.idle += round(idle_s * self.tick_rate)

    def restart(self) -> None:
        """spdk_tgt restarted: every counter from zero, qd sampling off, a new app_thread."""
        with self.lock:
            for b in self.bdevs.values():
                b.reset()
                b.qd_period_us = 0
                b.qos = {}
            for r in self.reactors.values():
                r.busy = r.idle = 0
            self.app_started = self.ticks

    # -- methods ---------------------------------------------------------------------------------------------

    def _iostat_params(self) -> set:
        if self.old:
            return {"name"}
        allowed = {"per_channel", "reset_mode"}
        if self.version < (26, 5):
            allowed.add("name")
        if self.version >= (26, 1):
            allowed.add("names")
        return allowed

    def _bdev_get_iostat(self, params):
        if params is not None and (not isinstance(params, dict) or set(params) - self._iostat_params()):
            return None, (-32603, "spdk_json_decode_object failed")
        params = params or {}
        if "name" in params and "names" in params:
            return None, (-22, "Invalid argument")
        wanted = params.get("names", [params["name"]] if "name" in params else None)
        if wanted is None:
            bdevs = list(self.bdevs.values())
        elif not isinstance(wanted, list) or not all(isinstance(n, str) for n in wanted):
            return None, (-32603, "spdk_json_decode_object failed")
        elif any(n not in self.bdevs for n in wanted):
            return None, (-19, "No such device")
        else:
            bdevs = [self.bdevs[n] for n in wanted]
        result = {"tick_rate": self.tick_rate}
        if not self.old:
            result["ticks"] = self.ticks
        result["bdevs"] = [b.iostat() for b in bdevs]
        return result, None

    def _framework_get_reactors(self, params):
        if params is not None:
            return None, (-32602, "`framework_get_reactors` requires no arguments")
        reactors = []
        for r in self.reactors.values():
            threads = [{"name": "app_thread", "id": 1, "cpumask": "1", "elapsed": self.ticks - self.app_started}] \
                if r.lcore == 0 else [{"name": f"nvmf_tgt_poll_group_{r.lcore}", "id": r.lcore + 1,
                                       "cpumask": f"{1 << r.lcore:x}", "elapsed": self.ticks - self.app_started}]
            reactors.append({"lcore": r.lcore, "busy": r.busy, "idle": r.idle, "in_interrupt": False,
                             "lw_threads": threads})
        return {"tick_rate": self.tick_rate, "reactors": reactors}, None

    def _bdev_nvme_get_controllers(self, params):
        if not self.nvme_module:
            return None, (-32601, "Method not found")
        return [{"name": name, "ctrlrs": [{"state": "enabled", "trid": {"trtype": "PCIe", "traddr": c["traddr"]},
                                           "cntlid": 0, "host": {"nqn": "nqn.2014-08.org.nvmexpress:uuid:0",
                                                                 "addr": "", "svcid": ""}}]}
                for name, c in self.controllers.items()], None

    def _bdev_nvme_get_controller_health_info(self, params):
        if not self.nvme_module:
            return None, (-32601, "Method not found")
        if not isinstance(params, dict) or set(params) != {"name"}:
            return None, (-32603, "spdk_json_decode_object failed")
        c = self.controllers.get(params["name"])
        if c is None:
            return None, (-32602, "Controller does not exist")
        if c.get("no_health"):
            return None, (-95, "Operation not supported")
        return {"model_number": "INTEL SSDPE2KX020T8", "serial_number": "BTLJ72430ARH2P0BGN",
                "firmware_revision": "VDV10110", "traddr": c["traddr"],
                "temperature_celsius": (c["kelvin"] - 273) % UINT64, "available_spare_percentage": 99,
                "available_spare_threshold_percentage": 10, "percentage_used": 2,
                "data_units_read": 1013408619, "data_units_written": 346792685,
                "host_read_commands": 30457773282, "host_write_commands": 18949677715,
                "controller_busy_time": 4979, "power_cycles": 49, "power_on_hours": 31118,
                "unsafe_shutdowns": 18, "media_errors": 17, "num_err_log_entries": 19,
                "warning_temperature_time_minutes": 0, "critical_composite_temperature_time_minutes": 0}, None

    def _bdev_set_qd_sampling_period(self, params):
        if not isinstance(params, dict) or set(params) != {"name", "period"}:
            return None, (-32603, "spdk_json_decode_object failed")
        b = self.bdevs.get(params["name"])
        if b is None:
            return None, (-19, "No such device")
        b.qd_period_us = int(params["period"])
        return True, None

    def _bdev_set_qos_limit(self, params):
        known = {"name", "rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec"}
        if not isinstance(params, dict) or "name" not in params or set(params) - known:
            return None, (-32603, "spdk_json_decode_object failed")
        b = self.bdevs.get(params["name"])
        if b is None:
            return None, (-19, "No such device")
        if len(params) == 1:
            return None, (-32602, "No rate limits specified")
        b.qos.update({k: v for k, v in params.items() if k != "name"})
        return True, None

    def answer(self, request) -> bytes | None:
        """The bytes to send for one request (None: say nothing)."""
        if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or "method" not in request:
            return json.dumps({"jsonrpc": "2.0", "id": None,
                               "error": {"code": -32600, "message": "Invalid request"}}).encode()
        method, rid = request["method"], request.get("id")
        with self.lock:
            self.requests.append(request)
            if method in self.silent:
                return None
            if method in self.raw:
                return self.raw[method].replace(b"{id}", json.dumps(rid).encode())
            if method in self.errors:
                result, error = None, self.errors[method]
            else:
                handler = getattr(self, "_" + method, None)
                if handler is None:
                    result, error = None, (-32601, "Method not found")
                else:
                    result, error = handler(request.get("params"))
        if error:
            body = {"jsonrpc": "2.0", "id": rid, "error": {"code": error[0], "message": error[1]}}
        else:
            body = {"jsonrpc": "2.0", "id": rid, "result": result}
        return json.dumps(body, indent=2).encode()  # spdk_tgt pretty-prints its answers

    # -- server ----------------------------------------------------------------------------------------------

    def start(self) -> "FakeSpdkTarget":
        self._stopping.clear()
        self._threads = []
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        self._listener.settimeout(0.05)
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        conn.settimeout(0.05)
        try:
            while not self._stopping.is_set():
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    return
                buf += data.decode()
                answers = []
                while True:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    try:
                        request, idx = decoder.raw_decode(buf)
                    except json.JSONDecodeError:
                        break  # incomplete: wait for more
                    buf = buf[idx:]
                    raw_method = isinstance(request, dict) and request.get("method") in self.raw
                    answer = self.answer(request)
                    if answer is not None:
                        answers.append(answer)
                    if raw_method and self.close_after_raw:
                        self._send(conn, answers)
                        return
                self._send(conn, answers)
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _send(self, conn: socket.socket, answers: list[bytes]) -> None:
        if not answers:
            return
        if self.write_mode == "coalesce":
            conn.sendall(b"".join(reversed(answers)))
        elif self.write_mode == "split":
            for answer in answers:
                for i in range(0, len(answer), 3):
                    conn.sendall(answer[i:i + 3])
                    if i % 96 == 0:
                        time.sleep(0.0005)  # let the reader see the pieces separately
        else:
            for answer in answers:
                conn.sendall(answer)

    def drop_connections(self) -> None:
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conns.clear()

    def stop(self) -> None:
        self._stopping.set()
        self.drop_connections()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for t in self._threads:
            t.join(timeout=2)
        if os.path.exists(self.path):
            os.unlink(self.path)

    def __enter__(self) -> "FakeSpdkTarget":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
