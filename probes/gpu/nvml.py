"""NVML probe (nvidia-ml-py, imported as `pynvml` only when the probe is checked or started).

Per GPU, keyed by its UUID (`hw.id`), each collect reports:

- `hw.gpu.utilization` (ratio): nvmlDeviceGetUtilizationRates().gpu / 100, the driver's percentage of time a
  kernel ran over its last sample period; attribute `hw.gpu.task`=general.
- `sloscope.gpu.kernel.busy.max` (ratio): the maximum of the driver's utilization samples
  (nvmlDeviceGetSamples, NVML_GPU_UTILIZATION_SAMPLES) taken since the previous collect: the share of each
  sample period during which any kernel ran, however few SMs it used (one small kernel reads 1.0; DCGM's
  `sloscope.gpu.sm.active` is the other signal, the share of SMs in use). Each call passes the newest timestamp
  already seen, so every driver sample lands in exactly one window; samples buffered before `start()` are
  skipped. The driver records samples only while a kernel runs, so a window without new samples
  (NVML_ERROR_NOT_FOUND) is an idle GPU and reads 0 (collects are seconds apart; the driver samples every
  1/6 s to 1 s, depending on the product).
- `hw.gpu.memory.usage` / `hw.gpu.memory.limit` / `sloscope.gpu.memory.reserved` (bytes): the v2 struct of
  nvmlDeviceGetMemoryInfo (used without the driver's reserved memory, as DCGM's FB_USED, and reserved apart).
  Drivers without it (before R510) give the v1 struct, whose used includes reserved: then there is no
  reserved value and the note says so.
- `hw.gpu.temperature` (Cel): nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU), else the deprecated
  nvmlDeviceGetTemperature on drivers without it.
- `hw.gpu.io` (bytes, delta): NVLink data throughput field values NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}
  with scopeId UINT_MAX (the aggregate over all links); they are cumulative KiB, reported as byte deltas per
  interval with `network.io.direction` transmit/receive and `sloscope.gpu.link`=nvlink. A counter that goes
  down (driver reload) counts as a reset (0), never as a negative delta.
- with `per_process=True`: per-process SM utilization (nvmlDeviceGetProcessUtilization since the previous
  collect, mean smUtil per pid / 100, each sample clamped to 100: drivers report more) as `hw.gpu.utilization`
  with a `process.pid` attribute.

Errors: a feature a GPU does not support (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, or a
driver without the function) is logged once and not asked again on that GPU; where an older call exists
(memory v1, the deprecated temperature call) it is used from then on. NVML_ERROR_GPU_IS_LOST marks that
GPU lost and the probe unhealthy (`healthy`, `notes`); the other GPUs go on, and only when every GPU is lost
does `collect` raise. Other errors skip the feature for this interval and are counted in `error_counts`.
Without a driver, `check()` says so in one line.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..base import Availability, Probe, ProbeError, ProbeUnavailable
from ..sample import AnySample, Sample

log = logging.getLogger(__name__)

UTILIZATION = "hw.gpu.utilization"
KERNEL_BUSY_MAX = "sloscope.gpu.kernel.busy.max"
MEMORY_USAGE = "hw.gpu.memory.usage"
MEMORY_LIMIT = "hw.gpu.memory.limit"
MEMORY_RESERVED = "sloscope.gpu.memory.reserved"
TEMPERATURE = "hw.gpu.temperature"
IO = "hw.gpu.io"

NVLINK_SCOPE_ALL_LINKS = 0xFFFFFFFF  # nvmlFieldValue_t.scopeId for the aggregate over every link
KIB = 1024
MAX_PERCENT = 100.0

# nvmlValueType_t -> member of the nvmlValue_t union
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def load_pynvml():
    return importlib.import_module("pynvml")


def nvml_value(value_type: int, value: Any) -> float:
    """The number held by an nvmlValue_t union of the given nvmlValueType_t."""
    member = VALUE_MEMBERS.get(int(value_type))
    if member is None:
        raise ValueError(f"unknown NVML value type {value_type}")
    return float(getattr(value, member))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _GpuLost(Exception):
    pass


_SKIP = object()


@dataclass
class GpuState:
    index: int
    handle: Any
    uuid: str
    lost: bool = False
    last_sample_ts: int = 0  # newest utilization-sample timestamp seen (µs, the driver's clock)
    last_process_ts: int = 0
    nvlink_kib: dict[str, float] = field(default_factory=dict)  # direction -> cumulative KiB
    unsupported: set[str] = field(default_factory=set)


class NvmlProbe(Probe):
    name = "nvml"
    source = "nvml"
    signals = (UTILIZATION, KERNEL_BUSY_MAX, MEMORY_USAGE, MEMORY_LIMIT, MEMORY_RESERVED, TEMPERATURE, IO)
    description = ("per-GPU utilization, peak kernel-busy time per window, memory, temperature, NVLink bytes "
                   "(NVML via nvidia-ml-py)")

    def __init__(self, host=None, nvml=None, per_process: bool = False):
        super().__init__(host)
        self._nvml = nvml  # a pynvml-like module; the real one is imported on first use
        self.per_process = per_process
        self.gpus: list[GpuState] = []
        self.error_counts: Counter = Counter()  # feature -> errors other than "not supported"
        self._initialized = False

    # -- life cycle ------------------------------------------------------------------------------------------

    def _module(self):
        if self._nvml is None:
            self._nvml = load_pynvml()
        return self._nvml

    def _init_problem(self) -> str | None:
        """Load pynvml and nvmlInit(); None when NVML is up, else the one line that says why not."""
        try:
            nv = self._module()
        except Exception as exc:  # ImportError, or a broken install
            return f"pynvml: not importable (pip package nvidia-ml-py): {type(exc).__name__}: {exc}"
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
                return "NVIDIA driver: libnvidia-ml.so not found (no NVIDIA driver on this host)"
            if code == nv.NVML_ERROR_DRIVER_NOT_LOADED:
                return "NVIDIA driver: installed but not loaded (the nvidia kernel module is not running)"
            if code == nv.NVML_ERROR_NO_PERMISSION:
                return "NVIDIA driver: no permission to open the GPU devices (/dev/nvidia*)"
            return f"NVML: nvmlInit failed: {exc}"
        except OSError as exc:
            return f"NVIDIA driver: libnvidia-ml.so could not be loaded: {exc}"
        self._initialized = True
        return None

    def _stop(self) -> None:
        """nvmlShutdown() for each nvmlInit() (after a check, a start, or a start that failed)."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # shutting down must not raise
                log.debug("nvmlShutdown failed: %s", exc)

    def check(self) -> Availability:
        if self.running:
            return Availability(self.name, notes=self.notes)
        problem = self._init_problem()
        if problem:
            return Availability(self.name, (problem,))
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            return Availability(self.name, (f"NVML: nvmlDeviceGetCount failed: {exc}",))
        finally:
            self._stop()
        if count == 0:
            return Availability(self.name, ("NVML: no NVIDIA GPU on this host",))
        return Availability(self.name)

    def _start(self) -> None:
        problem = self._init_problem()
        if problem:
            raise ProbeUnavailable(self.name, [problem])
        self.gpus = self._enumerate()
        if not self.gpus:
            raise ProbeUnavailable(self.name, ["NVML: no usable NVIDIA GPU on this host"] + self._notes)
        for gpu in self.gpus:
            try:
                self._prime(gpu)
            except _GpuLost:
                self._mark_lost(gpu)

    @property
    def healthy(self) -> bool:
        return not any(g.lost for g in self.gpus)

    def missing_signals(self) -> dict[str, str]:
        """Signals some GPU's driver cannot give, with the NVML call or fields they need."""
        needs = {"memory v2": (MEMORY_RESERVED, "nvmlDeviceGetMemoryInfo_v2"),
                 "nvlink": (IO, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")}
        return dict(needs[f] for gpu in self.gpus for f in sorted(gpu.unsupported) if f in needs)

    def _enumerate(self) -> list[GpuState]:
        nv = self._nvml
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise ProbeUnavailable(self.name, [f"NVML: nvmlDeviceGetCount failed: {exc}"]) from exc
        gpus = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as exc:
                self._note(f"GPU {index}: skipped, NVML could not open it: {exc}", logging.WARNING)
                continue
            gpus.append(GpuState(index, handle, uuid))
        return gpus

    def _mark_lost(self, gpu: GpuState) -> None:
        gpu.lost = True
        self._note(f"GPU {gpu.uuid} lost (NVML_ERROR_GPU_IS_LOST): no more samples from it; the other GPUs go on",
                   logging.ERROR)

    # -- reading ---------------------------------------------------------------------------------------------

    def _call(self, gpu: GpuState, feature: str, fn, *args, empty_codes=()):
        """One NVML call for one feature of one GPU: its result, `_SKIP`, or () for "nothing new"."""
        nv = self._nvml
        if feature in gpu.unsupported:
            return _SKIP
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from exc
            if code in empty_codes:
                return ()
            if code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                        getattr(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", nv.NVML_ERROR_NOT_SUPPORTED)):
                self._unsupported(gpu, feature, str(exc))
                return _SKIP
            self.error_counts[feature] += 1
            log.warning("nvml: GPU %s: reading %s failed: %s", gpu.uuid, feature, exc)
            return _SKIP

    def _call_newest(self, gpu: GpuState, *attempts):
        """The first of (feature, function name, args, kwargs) that the bindings and the driver have, newest
        first; `_SKIP` when none has it, or when one that has it failed this time (counted by `_call`)."""
        for feature, function, args, kwargs in attempts:
            if feature in gpu.unsupported:
                continue
            fn = getattr(self._nvml, function, None)
            if fn is None:
                self._unsupported(gpu, feature, f"these nvidia-ml-py bindings lack {function}")
                continue
            got = self._call(gpu, feature, lambda: fn(gpu.handle, *args, **kwargs))
            if got is not _SKIP or feature not in gpu.unsupported:
                return got
        return _SKIP

    def _memory(self, gpu: GpuState):
        """(used, total, reserved or None) bytes, or `_SKIP`."""
        nv = self._nvml
        version = getattr(nv, "nvmlMemory_v2", None)
        attempts = [("memory v1 (used includes reserved)", "nvmlDeviceGetMemoryInfo", (), {})]
        if version is not None:
            attempts.insert(0, ("memory v2", "nvmlDeviceGetMemoryInfo", (), {"version": version}))
        mem = self._call_newest(gpu, *attempts)
        if mem is _SKIP:
            return _SKIP
        return mem.used, mem.total, getattr(mem, "reserved", None)

    def _temperature(self, gpu: GpuState):
        sensor = self._nvml.NVML_TEMPERATURE_GPU
        return self._call_newest(gpu, ("temperature", "nvmlDeviceGetTemperatureV", (sensor,), {}),
                                 ("temperature (deprecated call)", "nvmlDeviceGetTemperature", (sensor,), {}))

    def _unsupported(self, gpu: GpuState, feature: str, why: str) -> None:
        gpu.unsupported.add(feature)
        self._note(f"GPU {gpu.uuid}: {feature} not supported ({why}); not asked again")

    def _utilization_samples(self, gpu: GpuState) -> list[float] | None:
        """Utilization samples (percent) newer than the last one seen, advancing the mark; [] when there are
        none (an idle GPU), None when they cannot be read."""
        nv = self._nvml
        got = self._call(gpu, "samples", nv.nvmlDeviceGetSamples, gpu.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                         gpu.last_sample_ts, empty_codes=(nv.NVML_ERROR_NOT_FOUND,))
        if got is _SKIP:
            return None
        if not got:
            return []
        value_type, samples = got
        fresh = [s for s in samples if int(s.timeStamp) > gpu.last_sample_ts]
        if not fresh:
            return []
        gpu.last_sample_ts = max(int(s.timeStamp) for s in fresh)
        return [nvml_value(value_type, s.sampleValue) for s in fresh]

    def _process_samples(self, gpu: GpuState) -> dict[int, list[float]]:
        nv = self._nvml
        # pynvml raises NVMLError(NVML_SUCCESS) when the size query finds no process samples at all
        got = self._call(gpu, "processes", nv.nvmlDeviceGetProcessUtilization, gpu.handle, gpu.last_process_ts,
                         empty_codes=(nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS))
        if got is _SKIP or not got:
            return {}
        per_pid: dict[int, list[float]] = {}
        newest = gpu.last_process_ts
        for s in got:
            ts = int(s.timeStamp)
            if ts <= gpu.last_process_ts:
                continue
            newest = max(newest, ts)
            per_pid.setdefault(int(s.pid), []).append(min(MAX_PERCENT, float(s.smUtil)))
        gpu.last_process_ts = newest
        return per_pid

    def _nvlink_kib(self, gpu: GpuState) -> dict[str, float]:
        """Cumulative NVLink data KiB per direction (aggregate scope); {} when unsupported or failing."""
        nv = self._nvml
        tx = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        rx = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        if tx is None or rx is None:
            self._unsupported(gpu, "nvlink", "these nvidia-ml-py bindings lack the NVLink throughput fields")
            return {}
        fields = [(tx, NVLINK_SCOPE_ALL_LINKS), (rx, NVLINK_SCOPE_ALL_LINKS)]
        got = self._call(gpu, "nvlink", nv.nvmlDeviceGetFieldValues, gpu.handle, fields)
        if got is _SKIP:
            return {}
        out = {}
        for direction, fv in zip(("transmit", "receive"), got):
            ret = int(fv.nvmlReturn)
            if ret == nv.NVML_SUCCESS:
                out[direction] = nvml_value(fv.valueType, fv.value)
            elif ret == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost
            elif ret in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported(gpu, "nvlink", f"field value returned {ret}")
                return {}
            else:
                self.error_counts["nvlink"] += 1
                log.warning("nvml: GPU %s: NVLink %s field returned NVML error %d", gpu.uuid, direction, ret)
        return out

    def _prime(self, gpu: GpuState) -> None:
        """Baselines at start: skip the driver's buffered samples, remember the NVLink counters."""
        self._utilization_samples(gpu)
        if self.per_process:
            self._process_samples(gpu)
        gpu.nvlink_kib = self._nvlink_kib(gpu)

    def _collect(self, start: int, now: int) -> list[AnySample]:
        samples: list[AnySample] = []
        for gpu in self.gpus:
            if gpu.lost:
                continue
            try:
                samples.extend(self._collect_gpu(gpu, start, now))
            except _GpuLost:
                self._mark_lost(gpu)
        if self.gpus and all(g.lost for g in self.gpus):
            raise ProbeError("nvml: every GPU is lost (NVML_ERROR_GPU_IS_LOST)")
        return samples

    def _collect_gpu(self, gpu: GpuState, start: int, now: int) -> list[AnySample]:
        """Everything from one GPU, or _GpuLost (then nothing from it this interval)."""
        nv = self._nvml
        hw = {"hw.id": gpu.uuid}
        out: list[AnySample] = []

        def gauge(name, value, **attrs):
            out.append(Sample(name, {**hw, **attrs}, now, float(value), "gauge", start))

        util = self._call(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates, gpu.handle)
        if util is not _SKIP:
            gauge(UTILIZATION, util.gpu / 100.0, **{"hw.gpu.task": "general"})
        window = self._utilization_samples(gpu)
        if window is not None:
            gauge(KERNEL_BUSY_MAX, min(MAX_PERCENT, max(window, default=0.0)) / 100.0)
        mem = self._memory(gpu)
        if mem is not _SKIP:
            used, total, reserved = mem
            gauge(MEMORY_USAGE, used)
            gauge(MEMORY_LIMIT, total)
            if reserved is not None:
                gauge(MEMORY_RESERVED, reserved)
        temp = self._temperature(gpu)
        if temp is not _SKIP:
            gauge(TEMPERATURE, temp)
        if "nvlink" not in gpu.unsupported:
            current = self._nvlink_kib(gpu)
            for direction, kib in current.items():
                previous = gpu.nvlink_kib.get(direction)
                if previous is not None:
                    delta = (kib - previous) * KIB if kib >= previous else 0.0  # went down: a reset
                    out.append(Sample(IO, {**hw, "network.io.direction": direction, "sloscope.gpu.link": "nvlink"},
                                      now, float(delta), "counter_delta", start))
                gpu.nvlink_kib[direction] = kib
        if self.per_process:
            for pid, utils in sorted(self._process_samples(gpu).items()):
                gauge(UTILIZATION, sum(utils) / len(utils) / 100.0,
                      **{"hw.gpu.task": "general", "process.pid": pid})
        return out
