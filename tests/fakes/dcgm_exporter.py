"""A dcgm-exporter stand-in: an HTTP server on 127.0.0.1 (ephemeral port) serving /metrics in the text the
real exporter writes: `# HELP` / `# TYPE` per field, then one line per GPU with the labels gpu, UUID,
pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION (and GPU_I_PROFILE / GPU_I_ID for MIG
instances), double fields with six decimals, integer fields as integers.

It serves the fields of its counters file and no others, as the real exporter does: by default the ones the
stock etc/default-counters.csv of NVIDIA/dcgm-exporter enables (STOCK_COUNTERS, as read there: no
DCGM_FI_PROF_SM_ACTIVE, which it ships commented out, and no DCGM_FI_PROF_NVLINK_*_BYTES);
`load_counters(path)` reads a counters file in that CSV format (FIELD, Prometheus type, help; `#` comments).

Scriptable: per-GPU field values (`set`, `play` for one GPU behaviour: kernel-busy share and SM share), a
blank value (DCGM's sentinel) for a field, the 1.x spelling (lower-case names, `uuid`/`hostname` labels), the
DCGM 4.x field names (`dcgm4_names`: same ids, same units), and broken answers: a body cut mid-line, a
Content-Length longer than the body (the connection closes early), an HTTP error status.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0

# The DCGM fields the stock default-counters.csv enables, in its order.
STOCK_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
)
# Prometheus type of every field the stand-in can serve
FIELD_TYPES = {f: "gauge" for f in STOCK_COUNTERS + ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES",
                                                     "DCGM_FI_PROF_NVLINK_RX_BYTES")}
FIELD_TYPES.update({f: "counter" for f in (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")})
DOUBLE_FIELDS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
# DCGM 4.x names of the same fields (dcgm_fields.h keeps the old ones as aliases)
DCGM4_NAMES = {"DCGM_FI_PROF_SM_ACTIVE": "DCGM_FI_PROF_SM_UTIL_RATIO",
               "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
               "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
               "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS"}
LEGACY = {"DCGM_FI_DEV_GPU_TEMP": "dcgm_gpu_temp", "DCGM_FI_DEV_GPU_UTIL": "dcgm_gpu_utilization",
          "DCGM_FI_DEV_FB_USED": "dcgm_fb_used", "DCGM_FI_DEV_FB_FREE": "dcgm_fb_free",
          "DCGM_FI_DEV_SM_CLOCK": "dcgm_sm_clock", "DCGM_FI_DEV_POWER_USAGE": "dcgm_power_usage"}


def load_counters(path) -> tuple[str, ...]:
    """The DCGM fields a dcgm-exporter counters file enables (the exporter's CSV: FIELD, type, help)."""
    fields = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, kind = (part.strip() for part in line.split(",")[:2])
                if kind != "label":
                    fields.append(name)
    return tuple(fields)


@dataclass
class FakeGpu:
    index: int
    uuid: str
    model: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    mig_instance: str | None = None  # GPU_I_ID of a MIG instance row
    fields: dict = field(default_factory=dict)  # field -> value (None: DCGM blank)


def default_fields() -> dict:
    return {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_MEMORY_TEMP": 52,
            "DCGM_FI_DEV_GPU_TEMP": 47, "DCGM_FI_DEV_POWER_USAGE": 312.25,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 9_876_543_210, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": 87, "DCGM_FI_DEV_MEM_COPY_UTIL": 31, "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0, "DCGM_FI_DEV_XID_ERRORS": 0, "DCGM_FI_DEV_FB_FREE": 60000,
            "DCGM_FI_DEV_FB_USED": 20500, "DCGM_FI_DEV_FB_RESERVED": 559,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 123_456_789, "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.91,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.42, "DCGM_FI_PROF_SM_ACTIVE": 0.8125,
            "DCGM_FI_PROF_DRAM_ACTIVE": 0.4375, "DCGM_FI_PROF_PCIE_TX_BYTES": 1_000_000,
            "DCGM_FI_PROF_PCIE_RX_BYTES": 3_000_000, "DCGM_FI_PROF_NVLINK_TX_BYTES": 2_000_000_000,
            "DCGM_FI_PROF_NVLINK_RX_BYTES": 1_000_000_000}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class FakeDcgmExporter:
    def __init__(self, gpus=None, hostname: str = "gpu-node-1", driver: str = "550.54.15",
                 counters: tuple[str, ...] = STOCK_COUNTERS):
        self.gpus: list[FakeGpu] = list(gpus) if gpus is not None else [
            FakeGpu(0, "GPU-5d0e7c8a-1f0b-4c61-9a7e-0d7b2b1c9a01", fields=default_fields()),
            FakeGpu(1, "GPU-8f3b2c1d-2e4a-4b7f-8c9d-1e2f3a4b5c02", pci_bus_id="00000000:2A:00.0",
                    fields=default_fields())]
        self.hostname = hostname
        self.driver = driver
        self.counters = tuple(counters)  # the fields its counters file enables
        self.legacy = False  # dcgm-exporter 1.x: lower-case names, uuid/hostname labels
        self.dcgm4_names = False  # a counters file written with DCGM 4.x field names
        self.status = 200
        self.cut_mid_line = False  # body ends inside a sample line, Content-Length matching the short body
        self.short_body = False  # Content-Length promises more than is sent, then the connection closes
        self.garbage_line: str | None = None
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def set(self, index: int, field_name: str, value) -> None:
        self.gpus[index].fields[field_name] = value

    def play(self, index: int, kernel_busy: float, sm_share: float) -> None:
        """GPU `index` runs kernels `kernel_busy` of the time, with `sm_share` of its SMs holding a warp."""
        self.set(index, "DCGM_FI_DEV_GPU_UTIL", round(kernel_busy * 100))
        self.set(index, "DCGM_FI_PROF_SM_ACTIVE", sm_share)

    # -- exposition ------------------------------------------------------------------------------------------

    def _name(self, f: str) -> str:
        if self.legacy:
            return LEGACY.get(f, f.lower())
        if self.dcgm4_names:
            return DCGM4_NAMES.get(f, f)
        return f

    def _labels(self, gpu: FakeGpu) -> str:
        if self.legacy:
            pairs = [("gpu", str(gpu.index)), ("uuid", gpu.uuid), ("hostname", self.hostname)]
        else:
            pairs = [("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
                     ("device", f"nvidia{gpu.index}"), ("modelName", gpu.model)]
            if gpu.mig_instance is not None:
                pairs += [("GPU_I_PROFILE", "1g.10gb"), ("GPU_I_ID", gpu.mig_instance)]
            pairs += [("Hostname", self.hostname), ("DCGM_FI_DRIVER_VERSION", self.driver)]
        return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)

    def _value(self, f: str, value) -> str:
        double = f in DOUBLE_FIELDS
        if value is None:
            return f"{FP64_BLANK:f}" if double else str(INT64_BLANK)
        return f"{value:f}" if double else str(int(value))

    def exposition(self) -> str:
        lines = []
        for f in self.counters:
            rows = [(g, g.fields[f]) for g in self.gpus if f in g.fields]
            if not rows:
                continue
            name = self._name(f)
            lines.append(f"# HELP {name} {f} as the counters file describes it.")
            lines.append(f"# TYPE {name} {FIELD_TYPES.get(f, 'gauge')}")
            for gpu, value in rows:
                lines.append(f"{name}{{{self._labels(gpu)}}} {self._value(f, value)}")
            if self.garbage_line and f == "DCGM_FI_DEV_GPU_TEMP":
                lines.append(self.garbage_line)
        return "\n".join(lines) + "\n"

    # -- server ----------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def start(self) -> "FakeDcgmExporter":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.requests += 1
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if fake.status != 200:
                    self.send_error(fake.status, "injected failure")
                    return
                body = fake.exposition().encode()
                length = len(body)
                if fake.cut_mid_line:
                    cut = body.rfind(b'UUID="') + 10  # inside the last sample line
                    body = body[:cut]
                    length = len(body)
                elif fake.short_body:
                    body = body[: len(body) // 2]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(body)
                if fake.short_body:
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> "FakeDcgmExporter":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
