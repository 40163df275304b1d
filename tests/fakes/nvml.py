"""A stand-in for the `pynvml` module (nvidia-ml-py) with scriptable GPUs, for unit tests of the NVML probe.

It exposes the functions, constants and NVMLError that the probe uses, with NVML's documented semantics:

- nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, lastSeenTimeStamp) returns
  (NVML_VALUE_TYPE_UNSIGNED_INT, samples) with only the buffered samples newer than lastSeenTimeStamp, and
  raises NVML_ERROR_NOT_FOUND when there are none; the driver's buffer holds a bounded number of samples.
- nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp) likewise, per-process samples.
- nvmlDeviceGetFieldValues(handle, [(fieldId, scopeId), ...]) returns one field value per request, each with
  its own nvmlReturn; the NVLink throughput fields are cumulative KiB, scopeId 0xFFFFFFFF the sum over all
  links, any other scopeId that one link.
- a value union holds only the member of its value type; the other members hold garbage, so reading the wrong
  member gives a wrong number.
- the driver records a utilization sample every `sample_period_us` only while a kernel runs (`run`): an idle
  GPU's buffer runs dry and nvmlDeviceGetSamples raises NVML_ERROR_NOT_FOUND.
- nvmlDeviceGetMemoryInfo(handle) is the v1 struct, whose `used` includes the driver's reserved memory
  (used = total - free); with version=nvmlMemory_v2 it is the v2 struct (version, total, reserved, free, used,
  used without reserved), which drivers before R510 lack (NVML_ERROR_FUNCTION_NOT_FOUND, as pynvml raises it).
- nvmlDeviceGetTemperature is deprecated: a driver may lack it (`legacy_temperature=False`), and
  nvmlDeviceGetTemperatureV(handle, sensor, version=nvmlTemperature_v1) may be missing on old drivers
  (`temperature_v=False`).
- per-process smUtil can read above 100, as real drivers report it.

Every call is counted per function name (`gpu.calls`), errors can be injected per function (`gpu.fail`,
once or always), and a GPU can be lost (every call raises NVML_ERROR_GPU_IS_LOST).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Return codes and constants: the values of nvml.h (and of pynvml; a test compares them).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
SCOPE_ALL_LINKS = 0xFFFFFFFF

CONSTANTS = [n for n in dir() if n.startswith("NVML_")]
# struct versions: nvml.h's NVML_STRUCT_VERSION(struct, n), the values pynvml passes
nvmlMemory_v2 = 0x02000028
nvmlTemperature_v1 = 0x100000C
STRUCT_VERSIONS = ("nvmlMemory_v2", "nvmlTemperature_v1")

_STRINGS = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
            NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_NO_PERMISSION: "Insufficient Permissions", NVML_ERROR_UNKNOWN: "Unknown Error"}
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_MEMBER_OF_TYPE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML error {self.value}")


class Value:
    """An nvmlValue_t: only the member of `value_type` is meaningful."""

    def __init__(self, value_type: int, value):
        for m in _MEMBERS:
            setattr(self, m, 0xDEADBEEF)
        setattr(self, _MEMBER_OF_TYPE[value_type], value)


@dataclass
class UtilSample:
    timeStamp: int
    sampleValue: Value


@dataclass
class ProcessSample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass
class FieldValue:
    fieldId: int
    scopeId: int
    timestamp: int
    latencyUsec: int
    valueType: int
    nvmlReturn: int
    value: Value


@dataclass
class Utilization:
    gpu: int
    memory: int


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class Memory_v2:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass
class FakeGpu:
    uuid: str
    utilization: int = 0  # percent
    memory_total: int = 80 * 2**30
    memory_used: int = 2**30  # what applications hold, without the reserved memory
    memory_reserved: int = 512 * 2**20
    memory_v2: bool = True  # the driver has nvmlDeviceGetMemoryInfo_v2 (R510 and later)
    temperature: int = 40
    temperature_v: bool = True  # the driver has nvmlDeviceGetTemperatureV
    legacy_temperature: bool = True  # the deprecated nvmlDeviceGetTemperature is still there
    nvlink_links: int = 4
    nvlink_tx_kib: int = 0  # cumulative, all links
    nvlink_rx_kib: int = 0
    field_returns: dict = field(default_factory=dict)  # fieldId -> nvmlReturn to report for it
    lost: bool = False
    buffer_size: int = 120  # utilization samples the driver keeps
    sample_period_us: int = 166_667  # the driver's utilization sample period
    clock_us: int = 1_700_000_000_000_000
    samples: list = field(default_factory=list)
    process_samples: list = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    fail: dict = field(default_factory=dict)  # function name -> (code, times or None for always)
    seen: list = field(default_factory=list)  # (function, lastSeenTimeStamp) of each sample query
    scopes: list = field(default_factory=list)  # scopeIds asked for

    def add_samples(self, *percents: int, step_us: int = 16_667) -> None:
        for p in percents:
            self.clock_us += step_us
            self.samples.append(UtilSample(self.clock_us, Value(NVML_VALUE_TYPE_UNSIGNED_INT, p)))
        del self.samples[:-self.buffer_size]

    def run(self, seconds: float, busy: float) -> None:
        """The GPU runs for `seconds` with a kernel resident `busy` of the time (0: idle). The driver samples
        only while something runs, so an idle stretch adds no samples at all."""
        self.utilization = round(busy * 100)
        periods = int(seconds * 1e6 // self.sample_period_us)
        if busy > 0:
            self.add_samples(*[self.utilization] * periods, step_us=self.sample_period_us)
        else:
            self.clock_us += periods * self.sample_period_us

    def add_process_samples(self, pid: int, *sm_percents: int, step_us: int = 100_000) -> None:
        for p in sm_percents:
            self.clock_us += step_us
            self.process_samples.append(ProcessSample(pid, self.clock_us, p))

    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in self.fail:
            code, times = self.fail[fn]
            if times is not None:
                if times <= 1:
                    del self.fail[fn]
                else:
                    self.fail[fn] = (code, times - 1)
            raise NVMLError(code)


class FakeNvml:
    """Module-like: inject as `NvmlProbe(nvml=FakeNvml([...]))`."""

    NVMLError = NVMLError

    def __init__(self, gpus=(), init_error: int | None = None, count_error: int | None = None):
        for name in CONSTANTS + list(STRUCT_VERSIONS):
            setattr(self, name, globals()[name])
        self.gpus = list(gpus)
        self.init_error = init_error
        self.count_error = count_error
        self.inits = 0
        self.shutdowns = 0

    # library
    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        if self.shutdowns >= self.inits:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.shutdowns += 1

    def _initialized(self):
        if self.inits <= self.shutdowns:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlDeviceGetCount(self):
        self._initialized()
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._initialized()
        gpu = self.gpus[index]
        gpu._enter("nvmlDeviceGetHandleByIndex")
        return gpu

    # devices
    def nvmlDeviceGetUUID(self, gpu):
        gpu._enter("nvmlDeviceGetUUID")
        return gpu.uuid

    def nvmlDeviceGetUtilizationRates(self, gpu):
        gpu._enter("nvmlDeviceGetUtilizationRates")
        return Utilization(gpu.utilization, 0)

    def nvmlDeviceGetSamples(self, gpu, sampling_type, last_seen):
        gpu._enter("nvmlDeviceGetSamples")
        gpu.seen.append(("samples", last_seen))
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in gpu.samples if s.timeStamp > last_seen]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return NVML_VALUE_TYPE_UNSIGNED_INT, fresh

    def nvmlDeviceGetMemoryInfo(self, gpu, version=None):
        gpu._enter("nvmlDeviceGetMemoryInfo")
        free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        if not version:
            return Memory(gpu.memory_total, free, gpu.memory_total - free)  # v1: used includes reserved
        if not gpu.memory_v2:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return Memory_v2(version, gpu.memory_total, gpu.memory_reserved, free, gpu.memory_used)

    def nvmlDeviceGetTemperature(self, gpu, sensor):
        gpu._enter("nvmlDeviceGetTemperature")
        if not gpu.legacy_temperature:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.temperature

    def nvmlDeviceGetTemperatureV(self, gpu, sensor, version=nvmlTemperature_v1):
        gpu._enter("nvmlDeviceGetTemperatureV")
        if not gpu.temperature_v:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != nvmlTemperature_v1:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.temperature

    def nvmlDeviceGetFieldValues(self, gpu, field_ids):
        gpu._enter("nvmlDeviceGetFieldValues")
        out = []
        for item in field_ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            gpu.scopes.append(scope)
            total = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_tx_kib,
                     NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_rx_kib}.get(fid)
            ret = gpu.field_returns.get(fid, NVML_SUCCESS if total is not None else NVML_ERROR_NOT_SUPPORTED)
            value = 0
            if ret == NVML_SUCCESS:
                value = total if scope == SCOPE_ALL_LINKS else total // max(1, gpu.nvlink_links)
            out.append(FieldValue(fid, scope, gpu.clock_us, 10, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, ret,
                                  Value(NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value)))
        return out

    def nvmlDeviceGetProcessUtilization(self, gpu, last_seen):
        gpu._enter("nvmlDeviceGetProcessUtilization")
        gpu.seen.append(("processes", last_seen))
        fresh = [s for s in gpu.process_samples if s.timeStamp > last_seen]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return fresh
