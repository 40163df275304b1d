"""A dcgm-exporter stand-in: an HTTP server on 127.0.0.1 (ephemeral port) serving /metrics in the text the
real exporter writes: `# HELP` / `# TYPE` per field, then one line per GPU with the labels gpu, UUID,
pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION (and GPU_I_PROFILE / GPU_I_ID for MIG
instances), double fields with six decimals, integer fields as integers.

Scriptable: per-GPU field values (`set`), a blank value (DCGM's sentinel) for a field, the 1.x spelling
(lower-case names, `uuid`/`hostname` labels), `_RATIO` names, and broken answers: a body cut mid-line, a
Content-Length longer than the body (the connection closes early), an HTTP error status.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0

# field -> (type, help) as in dcgm-exporter's CSVs
FIELD_INFO = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or "
                                          "receiving data."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "The rate of data transmitted over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "The rate of data received over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gauge", "The rate of data transmitted over NVLink, not including protocol "
                                              "headers, in bytes per second."),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gauge", "The rate of data received over NVLink, not including protocol "
                                              "headers, in bytes per second."),
}
DOUBLE_FIELDS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_DRAM_ACTIVE"}
LEGACY = {"DCGM_FI_DEV_GPU_TEMP": "dcgm_gpu_temp", "DCGM_FI_DEV_GPU_UTIL": "dcgm_gpu_utilization",
          "DCGM_FI_DEV_FB_USED": "dcgm_fb_used", "DCGM_FI_DEV_FB_FREE": "dcgm_fb_free",
          "DCGM_FI_DEV_SM_CLOCK": "dcgm_sm_clock", "DCGM_FI_DEV_POWER_USAGE": "dcgm_power_usage"}


@dataclass
class FakeGpu:
    index: int
    uuid: str
    model: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    mig_instance: str | None = None  # GPU_I_ID of a MIG instance row
    fields: dict = field(default_factory=dict)  # field -> value (None: DCGM blank)


def default_fields() -> dict:
    return {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_TEMP": 47, "DCGM_FI_DEV_POWER_USAGE": 312.25,
            "DCGM_FI_DEV_GPU_UTIL": 87, "DCGM_FI_DEV_FB_FREE": 60000, "DCGM_FI_DEV_FB_USED": 20500,
            "DCGM_FI_DEV_FB_RESERVED": 559, "DCGM_FI_DEV_XID_ERRORS": 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.91,
            "DCGM_FI_PROF_SM_ACTIVE": 0.8125, "DCGM_FI_PROF_DRAM_ACTIVE": 0.4375,
            "DCGM_FI_PROF_PCIE_TX_BYTES": 1_000_000, "DCGM_FI_PROF_PCIE_RX_BYTES": 3_000_000,
            "DCGM_FI_PROF_NVLINK_TX_BYTES": 2_000_000_000, "DCGM_FI_PROF_NVLINK_RX_BYTES": 1_000_000_000}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class FakeDcgmExporter:
    def __init__(self, gpus=None, hostname: str = "gpu-node-1", driver: str = "550.54.15"):
        self.gpus: list[FakeGpu] = list(gpus) if gpus is not None else [
            FakeGpu(0, "GPU-5d0e7c8a-1f0b-4c61-9a7e-0d7b2b1c9a01", fields=default_fields()),
            FakeGpu(1, "GPU-8f3b2c1d-2e4a-4b7f-8c9d-1e2f3a4b5c02", pci_bus_id="00000000:2A:00.0",
                    fields=default_fields())]
        self.hostname = hostname
        self.driver = driver
        self.legacy = False  # dcgm-exporter 1.x: lower-case names, uuid/hostname labels
        self.ratio_names = False  # *_RATIO spellings of SM_ACTIVE / DRAM_ACTIVE / GPU_UTIL (value as a ratio)
        self.status = 200
        self.cut_mid_line = False  # body ends inside a sample line, Content-Length matching the short body
        self.short_body = False  # Content-Length promises more than is sent, then the connection closes
        self.garbage_line: str | None = None
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def set(self, index: int, field_name: str, value) -> None:
        self.gpus[index].fields[field_name] = value

    # -- exposition ------------------------------------------------------------------------------------------

    def _name(self, f: str) -> str:
        if self.legacy:
            return LEGACY.get(f, f.lower())
        if self.ratio_names and f in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"):
            return f + "_RATIO"
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
        if self.ratio_names and f == "DCGM_FI_DEV_GPU_UTIL":
            return f"{value / 100:f}"
        return f"{value:f}" if double else str(int(value))

    def exposition(self) -> str:
        lines = []
        for f, (kind, help_text) in FIELD_INFO.items():
            rows = [(g, g.fields[f]) for g in self.gpus if f in g.fields]
            if not rows:
                continue
            name = self._name(f)
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
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
                    cut = body.rfind(b"DCGM_FI_PROF_NVLINK_RX_BYTES{") + 40
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
