"""dcgm-exporter probe: scrape its Prometheus text endpoint (default http://127.0.0.1:9400/metrics) and map the
DCGM fields onto the signal catalog, per GPU keyed by the `UUID` label (`hw.id`).

| DCGM field (id; DCGM 4.x name)                       | catalog signal                | conversion             |
|-------------------------------------------------------|-------------------------------|------------------------|
| DCGM_FI_PROF_SM_ACTIVE (1002; PROF_SM_UTIL_RATIO)     | sloscope.gpu.sm.active        | ratio, as is           |
| DCGM_FI_PROF_DRAM_ACTIVE (1005; PROF_DRAM_UTIL_RATIO) | sloscope.gpu.dram.active      | ratio, as is           |
| DCGM_FI_DEV_GPU_UTIL (203; DEV_GPU_UTIL_RATIO)        | hw.gpu.utilization            | percent / 100          |
| DCGM_FI_DEV_FB_USED (252)                             | hw.gpu.memory.usage           | MiB * 2^20             |
| DCGM_FI_DEV_FB_RESERVED (253)                         | sloscope.gpu.memory.reserved  | MiB * 2^20             |
| DCGM_FI_DEV_FB_TOTAL (250), else USED+FREE+RESERVED   | hw.gpu.memory.limit           | MiB * 2^20             |
| DCGM_FI_DEV_GPU_TEMP (150; DEV_GPU_TEMP_CELSIUS)      | hw.gpu.temperature            | as is                  |
| DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES (1011, 1012)        | hw.gpu.io, link nvlink        | B/s integrated         |
| DCGM_FI_PROF_PCIE_{TX,RX}_BYTES (1009, 1010)          | hw.gpu.io, link pcie          | B/s integrated         |

Names, types and units are those of DCGM's dcgm_fields.h and dcgm_fields.cpp (tests/fakes/dcgm_fields.py holds
them as read there, and a test holds this table to them). DCGM 4.x renamed several fields and keeps the old
names as aliases of the same id; both spellings are read. The `_RATIO` in a name is no unit:
DCGM_FI_DEV_GPU_UTIL_RATIO is still the driver's percentage (int64). Any other name is not guessed at (there
is no DCGM_FI_PROF_SM_ACTIVE_RATIO). DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, which the stock counters file
enables, is not read: it sums both directions of every link.

SM_ACTIVE is the mean share of SMs with at least one warp resident over DCGM's sample period; it is not
NVML's kernel-busy time (`sloscope.gpu.kernel.busy.max`), which reads 1.0 for one small kernel.

The PROF *_BYTES fields are rates (bytes per second: DCGM reads them from the GPM "per second" metrics),
while `hw.gpu.io` is a byte counter: each interval's bytes are the trapezoid of the previous and the current
rate times the time between the two scrapes. A series missing from one scrape starts over (no interpolation
across the gap).

The stock dcgm-exporter (etc/default-counters.csv) does not serve SM_ACTIVE nor the NVLink bytes; sloscope's
counters file, deploy/dcgm-exporter-counters.csv, enables every field above. Each needed field the exporter
does not serve is named once in a note and the log, and `missing_signals()` gives, per signal, the fields it
lacks (the node collector exports that as `sloscope.probe.signal.health`).

Accepted spellings: labels `UUID` or `uuid`, `Hostname` or `hostname`; dcgm-exporter 1.x metric names
(dcgm_gpu_temp, dcgm_gpu_utilization, dcgm_fb_used, dcgm_fb_free, dcgm_fi_prof_*). MIG instances (a non-empty
`GPU_I_ID` label) are reported with `hw.id` = "<GPU UUID>/gi<GPU_I_ID>".

Bad input: DCGM's blank sentinels (a field with no value: int64 fields at or above 0x7ffffffffffffff0,
double fields at or above 2^47), NaN and infinities are dropped and counted, never reported. A body that is
cut short (no final newline, or fewer bytes than Content-Length) is a `TruncatedExposition` error, counted,
and the whole scrape is discarded; a malformed line is skipped, counted, and the rest is used.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import socket
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

from ..base import Availability, Probe, ProbeError, ProbeUnavailable
from ..sample import AnySample, Sample

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"
MIB = 2**20

UTILIZATION = "hw.gpu.utilization"
SM_ACTIVE = "sloscope.gpu.sm.active"
DRAM_ACTIVE = "sloscope.gpu.dram.active"
MEMORY_USAGE = "hw.gpu.memory.usage"
MEMORY_LIMIT = "hw.gpu.memory.limit"
MEMORY_RESERVED = "sloscope.gpu.memory.reserved"
TEMPERATURE = "hw.gpu.temperature"
IO = "hw.gpu.io"

DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47


@dataclass(frozen=True)
class Field:
    key: str  # what the probe calls the value
    field_id: int  # DCGM's field id
    dcgm_type: str  # "int64" or "fp64" (DCGM_FT_INT64 / DCGM_FT_DOUBLE)
    unit: str  # "ratio", "percent", "MiB", "Cel", "B/s"


def _fields(*rows) -> dict[str, Field]:
    return {name: Field(key, field_id, dcgm_type, unit) for names, key, field_id, dcgm_type, unit in rows
            for name in names}


# names (the stock spelling first, then DCGM 4.x's), key, id, type, unit
FIELDS: dict[str, Field] = _fields(
    (("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"), "sm_active", 1002, "fp64", "ratio"),
    (("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"), "dram_active", 1005, "fp64", "ratio"),
    (("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"), "gpu_util", 203, "int64", "percent"),
    (("DCGM_FI_DEV_FB_TOTAL",), "fb_total", 250, "int64", "MiB"),
    (("DCGM_FI_DEV_FB_FREE",), "fb_free", 251, "int64", "MiB"),
    (("DCGM_FI_DEV_FB_USED",), "fb_used", 252, "int64", "MiB"),
    (("DCGM_FI_DEV_FB_RESERVED",), "fb_reserved", 253, "int64", "MiB"),
    (("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"), "gpu_temp", 150, "int64", "Cel"),
    (("DCGM_FI_PROF_PCIE_TX_BYTES",), "pcie/transmit", 1009, "int64", "B/s"),
    (("DCGM_FI_PROF_PCIE_RX_BYTES",), "pcie/receive", 1010, "int64", "B/s"),
    (("DCGM_FI_PROF_NVLINK_TX_BYTES",), "nvlink/transmit", 1011, "int64", "B/s"),
    (("DCGM_FI_PROF_NVLINK_RX_BYTES",), "nvlink/receive", 1012, "int64", "B/s"),
)
STOCK_NAME: dict[str, str] = {}  # key -> the name a counters file enables it by
for _name, _field in FIELDS.items():
    STOCK_NAME.setdefault(_field.key, _name)

# What each signal needs from the exporter (memory.limit: FB_TOTAL is not served, so USED + FREE).
NEEDS: dict[str, tuple[str, ...]] = {
    SM_ACTIVE: ("sm_active",), DRAM_ACTIVE: ("dram_active",), UTILIZATION: ("gpu_util",),
    MEMORY_USAGE: ("fb_used",), MEMORY_LIMIT: ("fb_used", "fb_free"), MEMORY_RESERVED: ("fb_reserved",),
    TEMPERATURE: ("gpu_temp",), IO: ("nvlink/transmit", "nvlink/receive", "pcie/transmit", "pcie/receive"),
}
COUNTERS_FILE = "deploy/dcgm-exporter-counters.csv"
LEGACY_NAMES = {  # dcgm-exporter 1.x (and its 1.x-compatibility CSV)
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
}


def field_of(metric: str) -> str | None:
    """The DCGM field a dcgm-exporter metric name stands for, if it is one this probe maps."""
    if metric in FIELDS:
        return metric
    if metric in LEGACY_NAMES:
        return LEGACY_NAMES[metric]
    upper = metric.upper()
    if upper.startswith("DCGM_FI_PROF_") and upper in FIELDS:  # 1.x lower-case DCP names
        return upper
    return None


# -- Prometheus text exposition format ----------------------------------------------------------------------

class ExpositionError(ValueError):
    pass


class TruncatedExposition(ExpositionError):
    pass


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: dict
    value: float


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(line: str, i: int) -> tuple[dict, int]:
    """Labels from line[i] == '{'; returns (labels, index after '}')."""
    labels: dict[str, str] = {}
    i += 1
    while True:
        while i < len(line) and line[i] in " \t":
            i += 1
        if i < len(line) and line[i] == "}":
            return labels, i + 1
        m = _LABEL_NAME.match(line, i)
        if not m:
            raise ValueError(f"bad label name at column {i + 1}")
        name, i = m.group(), m.end()
        while i < len(line) and line[i] in " \t":
            i += 1
        if line[i:i + 2] != '="':
            raise ValueError(f"label {name!r}: expected =\"value\"")
        i += 2
        value = []
        while True:
            if i >= len(line):
                raise ValueError(f"label {name!r}: unterminated value")
            c = line[i]
            if c == "\\":
                if i + 1 >= len(line) or line[i + 1] not in _ESCAPES:
                    raise ValueError(f"label {name!r}: bad escape")
                value.append(_ESCAPES[line[i + 1]])
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                value.append(c)
                i += 1
        labels[name] = "".join(value)
        while i < len(line) and line[i] in " \t":
            i += 1
        if i < len(line) and line[i] == ",":
            i += 1
        elif i < len(line) and line[i] == "}":
            return labels, i + 1
        else:
            raise ValueError(f"after label {name!r}: expected ',' or '}}'")


def parse_sample_line(line: str) -> PromSample:
    m = _NAME.match(line)
    if not m:
        raise ValueError("no metric name")
    name, i = m.group(), m.end()
    labels: dict = {}
    if i < len(line) and line[i] == "{":
        labels, i = _parse_labels(line, i)
    rest = line[i:].split()
    if not rest or len(rest) > 2:
        raise ValueError("expected a value and an optional timestamp")
    try:
        value = float(rest[0])
    except ValueError:
        raise ValueError(f"value {rest[0]!r} is not a number") from None
    if len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1]):
        raise ValueError(f"timestamp {rest[1]!r} is not an integer")
    return PromSample(name, labels, value)


def parse_exposition(text: str) -> tuple[list[PromSample], list[str]]:
    """(samples, problems) from Prometheus text format 0.0.4. A text that does not end with a newline was
    cut short: TruncatedExposition. Malformed lines are skipped and described in `problems`."""
    if text and not text.endswith("\n"):
        tail = text.rsplit("\n", 1)[-1]
        raise TruncatedExposition(f"exposition truncated: the last line has no newline ({tail[:60]!r})")
    samples, problems = [], []
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(parse_sample_line(line))
        except ValueError as exc:
            problems.append(f"line {lineno}: {exc}: {line[:80]!r}")
    return samples, problems


# -- mapping ------------------------------------------------------------------------------------------------

def is_blank(value: float, dcgm_type: str) -> bool:
    """DCGM's "no value" sentinels (DCGM_INT64_BLANK and up, DCGM_FP64_BLANK and up), NaN and infinities."""
    if math.isnan(value) or math.isinf(value):
        return True
    return value >= (DCGM_FP64_BLANK if dcgm_type == "fp64" else float(DCGM_INT64_BLANK))


def gpu_id(labels: dict) -> str | None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        return None
    gi = labels.get("GPU_I_ID")
    return f"{uuid}/gi{gi}" if gi else uuid


def hostname_of(labels: dict) -> str | None:
    return labels.get("Hostname") or labels.get("hostname")


@dataclass
class Reading:
    """One scrape, per hw.id: field key -> value in the field's own unit (ratio, percent, MiB, C, B/s)."""

    gpus: dict[str, dict[str, float]]
    counts: Counter  # what was dropped, by reason
    served: set = field(default_factory=set)  # keys the exporter serves (also when blank)


def read_fields(samples: list[PromSample], hostname: str | None = None) -> Reading:
    gpus: dict[str, dict[str, float]] = {}
    counts: Counter = Counter()
    served: set[str] = set()
    for s in samples:
        name = field_of(s.name)
        if name is None:
            continue
        if hostname is not None and hostname_of(s.labels) not in (None, hostname):
            counts["other host"] += 1
            continue
        f = FIELDS[name]
        served.add(f.key)
        hw = gpu_id(s.labels)
        if hw is None:
            counts["no UUID label"] += 1
            continue
        if is_blank(s.value, f.dcgm_type):
            counts["blank value"] += 1
            continue
        if s.value < 0:
            counts["negative value"] += 1
            continue
        value = s.value / 100.0 if f.unit == "percent" else s.value
        gpus.setdefault(hw, {}).setdefault(f.key, value)  # the first series wins (pod labels may repeat a GPU)
    return Reading(gpus, counts, served)


class DcgmExporterProbe(Probe):
    name = "dcgm"
    source = "http"
    signals = (UTILIZATION, SM_ACTIVE, DRAM_ACTIVE, MEMORY_USAGE, MEMORY_LIMIT, MEMORY_RESERVED, TEMPERATURE, IO)
    description = ("GPU SM/DRAM activity, utilization, memory, temperature, NVLink/PCIe bytes "
                   f"(dcgm-exporter, {DEFAULT_URL})")

    def __init__(self, host=None, url: str = DEFAULT_URL, timeout: float = 2.0, hostname: str | None = None):
        super().__init__(host)
        self.url = url
        self.timeout = timeout
        self.hostname = hostname
        self.error_counts: Counter = Counter()  # scrape failures and dropped values, by reason
        self._rates: dict[tuple[str, str], float] = {}  # (hw.id, link/direction) -> B/s where the interval began
        self._served: set[str] = set(STOCK_NAME)

    def missing_signals(self) -> dict[str, str]:
        """Signal -> the DCGM fields it needs that the exporter does not serve (comma-separated)."""
        out = {}
        for signal, keys in NEEDS.items():
            lacking = [STOCK_NAME[k] for k in keys if k not in self._served]
            if lacking:
                out[signal] = ",".join(lacking)
        return out

    def _see(self, reading: Reading) -> None:
        """Remember what the exporter serves; name each needed field it lacks, once."""
        self._served = set(reading.served)
        for signal, fields in sorted(self.missing_signals().items()):
            self._note(f"dcgm-exporter at {self.url} does not serve {fields.replace(',', ', ')}: no {signal} "
                       f"(enable it in the exporter's counters file, e.g. sloscope's {COUNTERS_FILE})",
                       logging.WARNING)

    # -- scraping --------------------------------------------------------------------------------------------

    def fetch(self) -> str:
        """The exposition text; ProbeError (counted) with a clear reason when it cannot be had whole."""
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            self.error_counts["http status"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: HTTP {exc.code} {exc.reason}") from None
        except http.client.IncompleteRead as exc:
            self.error_counts["truncated"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: response truncated ({len(exc.partial)} bytes, "
                             f"{exc.expected} missing)") from None
        except urllib.error.URLError as exc:
            self.error_counts["unreachable"] += 1
            reason = exc.reason
            if isinstance(reason, ConnectionRefusedError):
                why = "connection refused (dcgm-exporter not running, or on another port: --dcgm-url)"
            elif isinstance(reason, (socket.timeout, TimeoutError)):
                why = f"no answer within {self.timeout} s"
            else:
                why = str(reason)
            raise ProbeError(f"dcgm-exporter at {self.url}: {why}") from None
        except (socket.timeout, TimeoutError):
            self.error_counts["unreachable"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: no answer within {self.timeout} s") from None
        except (http.client.HTTPException, OSError) as exc:
            self.error_counts["unreachable"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: {type(exc).__name__}: {exc}") from None
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.error_counts["not utf-8"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: body is not UTF-8: {exc}") from None

    def scrape(self) -> Reading:
        text = self.fetch()
        try:
            samples, problems = parse_exposition(text)
        except TruncatedExposition as exc:
            self.error_counts["truncated"] += 1
            raise ProbeError(f"dcgm-exporter at {self.url}: {exc}") from None
        if problems:
            self.error_counts["bad line"] += len(problems)
            log.warning("dcgm: %d malformed line(s) skipped, first: %s", len(problems), problems[0])
        reading = read_fields(samples, self.hostname)
        self.error_counts.update(reading.counts)
        return reading

    # -- life cycle ------------------------------------------------------------------------------------------

    def check(self) -> Availability:
        if self.running:
            return Availability(self.name, notes=self.notes)
        try:
            reading = self.scrape()
        except ProbeError as exc:
            return Availability(self.name, (str(exc),))
        if not reading.gpus:
            return Availability(self.name, (f"dcgm-exporter at {self.url}: no DCGM_FI_* field with a GPU UUID "
                                            "label in its answer",))
        return Availability(self.name)

    def _start(self) -> None:
        try:
            reading = self.scrape()
        except ProbeError as exc:
            raise ProbeUnavailable(self.name, [str(exc)]) from exc
        if not reading.gpus:
            raise ProbeUnavailable(self.name, [f"dcgm-exporter at {self.url}: no DCGM_FI_* field with a GPU "
                                               "UUID label in its answer"])
        self._see(reading)
        self._rates = self._rate_points(reading)

    @staticmethod
    def _rate_points(reading: Reading) -> dict[tuple[str, str], float]:
        return {(hw, key): value for hw, fields in reading.gpus.items() for key, value in fields.items() if "/" in key}

    def _collect(self, start: int, now: int) -> list[AnySample]:
        reading = self.scrape()
        self._see(reading)
        out: list[AnySample] = []
        for hw, f in sorted(reading.gpus.items()):
            attrs = {"hw.id": hw}

            def gauge(name, value, **extra):
                out.append(Sample(name, {**attrs, **extra}, now, float(value), "gauge", start))

            if "gpu_util" in f:
                gauge(UTILIZATION, f["gpu_util"], **{"hw.gpu.task": "general"})
            if "sm_active" in f:
                gauge(SM_ACTIVE, f["sm_active"])
            if "dram_active" in f:
                gauge(DRAM_ACTIVE, f["dram_active"])
            if "fb_used" in f:
                gauge(MEMORY_USAGE, f["fb_used"] * MIB)
            if "fb_reserved" in f:
                gauge(MEMORY_RESERVED, f["fb_reserved"] * MIB)
            if "fb_total" in f:
                gauge(MEMORY_LIMIT, f["fb_total"] * MIB)
            elif "fb_used" in f and "fb_free" in f:
                gauge(MEMORY_LIMIT, (f["fb_used"] + f["fb_free"] + f.get("fb_reserved", 0.0)) * MIB)
            if "gpu_temp" in f:
                gauge(TEMPERATURE, f["gpu_temp"])
            for key in sorted(k for k in f if "/" in k):
                rate0 = self._rates.get((hw, key))
                if rate0 is None:
                    continue
                link, direction = key.split("/")
                out.append(Sample(IO, {**attrs, "network.io.direction": direction, "sloscope.gpu.link": link},
                                  now, (rate0 + f[key]) / 2.0 * ((now - start) / 1e9), "counter_delta", start))
        self._rates = self._rate_points(reading)
        return out
