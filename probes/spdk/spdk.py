"""SPDK target probe over JSON-RPC (probes/spdk/rpc_client.py).

Each collect asks for `bdev_get_iostat` (every bdev, or the `bdevs` given, in the parameter form the target
takes: rpc_client.py) and `framework_get_reactors`, and compares with the previous answer:

- `spdk.bdev.io.wait` (s), per bdev and `disk.io.direction` read/write:
  Δread_latency_ticks / Δnum_read_ops / tick_rate (the same for writes): the mean time an I/O spent in the
  bdev layer, submit to complete. A direction without I/O in the interval has no mean and no sample.
- `spdk.bdev.queue_depth` ({io}): Δweighted_io_time / Δio_time, the mean queue depth while the bdev was busy
  (0 when it was idle throughout).
- `spdk.bdev.utilization` (ratio): Δio_time / elapsed, capped at 1.

  Units, from SPDK's source (lib/bdev/bdev.c, lib/bdev/bdev_rpc.c): io_time, weighted_io_time and
  queue_depth exist only while queue-depth sampling is on (`bdev_set_qd_sampling_period NAME PERIOD_US`);
  the RPC writes them only when the period is non-zero. The sampling poller runs every `period`
  microseconds; whenever it finds I/O outstanding it adds `period` to io_time and `period * depth` to
  weighted_io_time. So io_time is in MICROSECONDS (busy time at the granularity of one period, not ticks),
  weighted_io_time in microsecond-I/Os. Elapsed time comes from the same answer's `ticks`/`tick_rate` (the
  target's TSC), or the wall clock between collects on targets too old to send `ticks`.

  Queue-depth sampling is off by default, and again after every target restart (it is per bdev, in memory).
  With `qd_sampling_period_us` > 0 (`--spdk-qd-sampling-us`) the probe turns it on for every bdev it finds
  with it off, at start and whenever a bdev answers without it (a restart, a new bdev, someone turning it
  off); a period someone else set is left alone. Its cost, in the target: one poller per bdev at that period,
  and each poll visits every I/O channel of the bdev (a message to each SPDK thread that has one) to count
  the I/O outstanding: at 10000 us, 100 channel walks a second per bdev. With 0 (the default) the probe
  changes nothing in the target: it names the bdevs without sampling once, and `missing_signals()` reports
  spdk.bdev.queue_depth and spdk.bdev.utilization as needing bdev_set_qd_sampling_period.
- `spdk.reactor.busy` (ratio), per `spdk.reactor.lcore`: Δbusy / (Δbusy + Δidle), both in TSC ticks.
- `sloscope.nvme.temperature` (Cel): for each NVMe controller of the target (bdev_nvme_get_controllers),
  bdev_nvme_get_controller_health_info's `temperature_celsius`, with `spdk.bdev.name` the controller name
  (its bdevs are named after it: Nvme0 -> Nvme0n1). SPDK already converts the health page's Kelvin
  (it writes `temperature - 273` as an unsigned number, so a sensor reading below 273 K wraps to a huge
  value, which is dropped); an answer carrying only a raw `temperature` is taken as Kelvin. When the target
  gives no temperature (no bdev_nvme module, no controllers), kernel-attached drives are read from
  /sys/class/nvme/*/hwmon*/temp1_input (millidegrees) with `system.device` nvmeN.

Restarts: a target restart resets every counter. It is recognised by a changed tick_rate, the target's
`ticks` going backwards, or the app_thread's `elapsed` (ticks since it started) going backwards; then every
baseline is taken anew and that interval reports no deltas. A single bdev or reactor whose counters went
down (bdev_reset_iostat, a bdev deleted and re-created under the same name) is re-baselined alone. So
neither produces a negative or a huge value.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..base import Availability, Probe, ProbeError, ProbeUnavailable, now_ns
from ..sample import AnySample, Sample
from .nvme_sysfs import read_nvme_temperatures, temperature_samples
from .rpc_client import (DEFAULT_SOCKET, METHOD_NOT_FOUND, SpdkError, SpdkRpcClient, SpdkRpcError)

log = logging.getLogger(__name__)

WAIT = "spdk.bdev.io.wait"
QUEUE_DEPTH = "spdk.bdev.queue_depth"
UTILIZATION = "spdk.bdev.utilization"
REACTOR_BUSY = "spdk.reactor.busy"
NVME_TEMPERATURE = "sloscope.nvme.temperature"

BDEV_COUNTERS = ("num_read_ops", "num_write_ops", "read_latency_ticks", "write_latency_ticks")
QD_COUNTERS = ("io_time", "weighted_io_time")
PLAUSIBLE_CELSIUS = (-60.0, 200.0)


def _number(obj: dict, key: str, where: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key!r} is {value!r}, not a number")
    if value < 0:
        raise ValueError(f"{where}: {key!r} is negative ({value})")
    return value


@dataclass
class IostatSnapshot:
    tick_rate: float
    ticks: float | None  # the target's TSC when it answered (SPDK >= 22.x), else None
    wall_ns: int
    bdevs: dict[str, dict[str, float]]
    bad: list[str] = field(default_factory=list)  # entries that could not be read

    @property
    def sampling_off(self) -> list[str]:
        """Bdevs answering without queue-depth sampling (no io_time)."""
        return sorted(name for name, values in self.bdevs.items() if "io_time" not in values)


@dataclass
class ReactorSnapshot:
    tick_rate: float
    app_elapsed: float | None  # ticks since the app_thread started: goes back when the target restarts
    lcores: dict[int, tuple[float, float]]  # lcore -> (busy, idle) ticks
    bad: list[str] = field(default_factory=list)


def parse_iostat(result: Any, wall_ns: int) -> IostatSnapshot:
    """bdev_get_iostat's result -> snapshot. A malformed top level raises ValueError; a malformed bdev entry
    is left out and named in `bad`."""
    if not isinstance(result, dict):
        raise ValueError(f"bdev_get_iostat: result is a {type(result).__name__}, not an object "
                         "(a target older than SPDK 20.01?)")
    tick_rate = _number(result, "tick_rate", "bdev_get_iostat")
    if tick_rate <= 0:
        raise ValueError("bdev_get_iostat: tick_rate is 0")
    ticks = _number(result, "ticks", "bdev_get_iostat") if "ticks" in result else None
    bdevs_in = result.get("bdevs")
    if not isinstance(bdevs_in, list):
        raise ValueError(f"bdev_get_iostat: 'bdevs' is {type(bdevs_in).__name__}, not a list")
    bdevs: dict[str, dict[str, float]] = {}
    bad: list[str] = []
    for i, entry in enumerate(bdevs_in):
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ValueError(f"bdevs[{i}]: not an object with a name")
            where = f"bdev {entry['name']}"
            values = {k: _number(entry, k, where) for k in BDEV_COUNTERS}
            if "io_time" in entry or "weighted_io_time" in entry:
                values.update({k: _number(entry, k, where) for k in QD_COUNTERS})
            bdevs[entry["name"]] = values
        except ValueError as exc:
            bad.append(str(exc))
    return IostatSnapshot(float(tick_rate), None if ticks is None else float(ticks), wall_ns, bdevs, bad)


def parse_reactors(result: Any) -> ReactorSnapshot:
    if not isinstance(result, dict):
        raise ValueError(f"framework_get_reactors: result is a {type(result).__name__}, not an object")
    tick_rate = _number(result, "tick_rate", "framework_get_reactors")
    reactors = result.get("reactors")
    if not isinstance(reactors, list):
        raise ValueError("framework_get_reactors: 'reactors' is not a list")
    lcores: dict[int, tuple[float, float]] = {}
    app_elapsed = None
    bad: list[str] = []
    for i, r in enumerate(reactors):
        try:
            if not isinstance(r, dict) or isinstance(r.get("lcore"), bool) or not isinstance(r.get("lcore"), int):
                raise ValueError(f"reactors[{i}]: not an object with an integer lcore")
            where = f"reactor {r['lcore']}"
            lcores[r["lcore"]] = (_number(r, "busy", where), _number(r, "idle", where))
        except ValueError as exc:
            bad.append(str(exc))
            continue
        for t in r.get("lw_threads") or ():
            if isinstance(t, dict) and t.get("name") == "app_thread" and isinstance(t.get("elapsed"), (int, float)):
                app_elapsed = float(t["elapsed"])
    return ReactorSnapshot(float(tick_rate), app_elapsed, lcores, bad)


def restart_reason(prev_io: IostatSnapshot | None, cur_io: IostatSnapshot | None,
                   prev_re: ReactorSnapshot | None, cur_re: ReactorSnapshot | None) -> str | None:
    """Why the target looks restarted between two collects, or None."""
    if prev_io and cur_io:
        if cur_io.tick_rate != prev_io.tick_rate:
            return f"tick_rate changed ({prev_io.tick_rate:g} -> {cur_io.tick_rate:g})"
        if prev_io.ticks is not None and cur_io.ticks is not None and cur_io.ticks < prev_io.ticks:
            return "the target's ticks went backwards"
    if prev_re and cur_re:
        if cur_re.tick_rate != prev_re.tick_rate:
            return f"reactor tick_rate changed ({prev_re.tick_rate:g} -> {cur_re.tick_rate:g})"
        if (prev_re.app_elapsed is not None and cur_re.app_elapsed is not None
                and cur_re.app_elapsed < prev_re.app_elapsed):
            return "the app_thread restarted (its elapsed ticks went backwards)"
    return None


def bdev_samples(prev: IostatSnapshot, cur: IostatSnapshot, start_ns: int, now: int,
                 resets: Counter | None = None) -> list[AnySample]:
    """Samples from two iostat snapshots of the same target run."""
    out: list[AnySample] = []
    if cur.ticks is not None and prev.ticks is not None:
        elapsed_us = (cur.ticks - prev.ticks) / cur.tick_rate * 1e6
    else:
        elapsed_us = (cur.wall_ns - prev.wall_ns) / 1e3
    for name, c in sorted(cur.bdevs.items()):
        p = prev.bdevs.get(name)
        if p is None:
            continue  # new bdev: this answer is its baseline
        keys = BDEV_COUNTERS + (QD_COUNTERS if "io_time" in c and "io_time" in p else ())
        d = {k: c[k] - p[k] for k in keys}
        if any(v < 0 for v in d.values()):
            if resets is not None:
                resets[name] += 1
            continue  # its counters were reset: re-baselined by keeping `cur`
        attrs = {"spdk.bdev.name": name}
        for direction in ("read", "write"):
            ops = d[f"num_{direction}_ops"]
            if ops > 0:
                out.append(Sample(WAIT, {**attrs, "disk.io.direction": direction}, now,
                                  d[f"{direction}_latency_ticks"] / ops / cur.tick_rate, "gauge", start_ns))
        if "io_time" in d:
            busy_us = d["io_time"]
            out.append(Sample(QUEUE_DEPTH, attrs, now, d["weighted_io_time"] / busy_us if busy_us > 0 else 0.0,
                              "gauge", start_ns))
            if elapsed_us > 0:
                out.append(Sample(UTILIZATION, attrs, now, min(1.0, busy_us / elapsed_us), "gauge", start_ns))
    return out


def reactor_samples(prev: ReactorSnapshot, cur: ReactorSnapshot, start_ns: int, now: int,
                    resets: Counter | None = None) -> list[AnySample]:
    out: list[AnySample] = []
    for lcore, (busy, idle) in sorted(cur.lcores.items()):
        if lcore not in prev.lcores:
            continue
        p_busy, p_idle = prev.lcores[lcore]
        d_busy, d_idle = busy - p_busy, idle - p_idle
        if d_busy < 0 or d_idle < 0:
            if resets is not None:
                resets[f"lcore {lcore}"] += 1
            continue
        if d_busy + d_idle > 0:
            out.append(Sample(REACTOR_BUSY, {"spdk.reactor.lcore": lcore}, now, d_busy / (d_busy + d_idle),
                              "gauge", start_ns))
    return out


def health_temperature(info: Any) -> float | None:
    """Celsius from bdev_nvme_get_controller_health_info's answer, or None when absent or implausible."""
    if not isinstance(info, dict):
        return None
    value = info.get("temperature_celsius")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        celsius = float(value)
    else:
        kelvin = info.get("temperature")
        if isinstance(kelvin, bool) or not isinstance(kelvin, (int, float)):
            return None
        celsius = float(kelvin) - 273.15
    lo, hi = PLAUSIBLE_CELSIUS
    return celsius if lo <= celsius <= hi else None


def controller_names(result: Any) -> list[str]:
    """Names from bdev_nvme_get_controllers (both the older flat and the newer "ctrlrs" shape carry "name")."""
    if not isinstance(result, list):
        return []
    return [c["name"] for c in result if isinstance(c, dict) and isinstance(c.get("name"), str)]


class SpdkProbe(Probe):
    name = "spdk"
    source = "spdk"
    signals = (WAIT, QUEUE_DEPTH, UTILIZATION, REACTOR_BUSY, NVME_TEMPERATURE)
    description = ("SPDK bdev wait, queue depth and utilization, reactor busy, NVMe temperature "
                   "(JSON-RPC on the target's socket, default %s)" % DEFAULT_SOCKET)

    def __init__(self, host=None, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0, sysfs: str = "/sys",
                 qd_sampling_period_us: int = 0, bdevs: Sequence[str] = ()):
        super().__init__(host)
        if isinstance(qd_sampling_period_us, bool) or int(qd_sampling_period_us) < 0:
            raise ValueError("qd_sampling_period_us must be a non-negative integer")
        self.qd_sampling_period_us = int(qd_sampling_period_us)
        self.bdevs = tuple(bdevs)
        self.qd_sampling_enabled: Counter = Counter()  # bdev -> times the probe turned sampling on
        self.socket_path = socket_path
        self.timeout = timeout
        self.sysfs = sysfs
        self.client = SpdkRpcClient(socket_path, timeout)
        self.error_counts: Counter = Counter()  # what went wrong, by kind
        self.resets: Counter = Counter()  # bdevs / lcores re-baselined after their counters went down
        self.restarts = 0
        self._iostat: IostatSnapshot | None = None
        self._reactors: ReactorSnapshot | None = None
        self._reactors_supported = True
        self._nvme_rpc = True
        self._failed_controllers: set[str] = set()

    def _socket_problem(self) -> str | None:
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            return (f"SPDK socket {self.socket_path}: not found (is spdk_tgt running? its -r option sets the "
                    "path; --spdk-socket tells sloscope)")
        except PermissionError:
            return f"SPDK socket {self.socket_path}: not accessible by euid {os.geteuid()}"
        if not stat.S_ISSOCK(st.st_mode):
            return f"SPDK socket {self.socket_path}: not a Unix socket"
        return None

    def check(self) -> Availability:
        if self.running:
            return Availability(self.name, notes=self.notes)
        problem = self._socket_problem()
        if problem:
            return Availability(self.name, (problem,))
        probe_client = SpdkRpcClient(self.socket_path, self.timeout)
        try:
            parse_iostat(probe_client.bdev_get_iostat(self.bdevs), now_ns())
        except SpdkError as exc:
            return Availability(self.name, (str(exc),))
        except ValueError as exc:
            return Availability(self.name, (f"SPDK answered bdev_get_iostat in an unknown shape: {exc}",))
        finally:
            probe_client.close()
        return Availability(self.name)

    def _start(self) -> None:
        problem = self._socket_problem()
        if problem:
            raise ProbeUnavailable(self.name, [problem])
        try:
            self._iostat, self._reactors = self._read_counters(now_ns())
            if self._enable_sampling(self._iostat):
                self._iostat, self._reactors = self._read_counters(now_ns())
        except (SpdkError, ValueError) as exc:  # the failed start's _stop() closes the client
            raise ProbeUnavailable(self.name, [str(exc)]) from exc

    def _stop(self) -> None:
        self.client.close()

    def missing_signals(self) -> dict[str, str]:
        missing = {}
        if self._iostat is not None and self._iostat.sampling_off:
            missing.update({QUEUE_DEPTH: "bdev_set_qd_sampling_period", UTILIZATION: "bdev_set_qd_sampling_period"})
        if not self._reactors_supported:
            missing[REACTOR_BUSY] = "framework_get_reactors"
        return missing

    def _enable_sampling(self, iostat: IostatSnapshot) -> bool:
        """Turn queue-depth sampling on where it is off, if configured to; else name those bdevs once.
        True when it turned any on."""
        off = iostat.sampling_off
        if not off:
            return False
        if not self.qd_sampling_period_us:
            self._note(f"queue-depth sampling is off on bdev {', '.join(off)}: no {QUEUE_DEPTH} or {UTILIZATION} "
                       "there (SPDK starts with it off; --spdk-qd-sampling-us turns it on, or "
                       "bdev_set_qd_sampling_period)", logging.WARNING)
            return False
        enabled = False
        for name in off:
            try:
                self.client.bdev_set_qd_sampling_period(name, self.qd_sampling_period_us)
            except SpdkRpcError as exc:
                self.error_counts["bdev_set_qd_sampling_period"] += 1
                log.warning("spdk: turning queue-depth sampling on for %s failed: %s", name, exc)
                continue
            self.qd_sampling_enabled[name] += 1
            log.info("spdk: queue-depth sampling on for bdev %s every %d us", name, self.qd_sampling_period_us)
            enabled = True
        return enabled

    def _read_counters(self, wall_ns: int) -> tuple[IostatSnapshot, ReactorSnapshot | None]:
        iostat = parse_iostat(self.client.bdev_get_iostat(self.bdevs), wall_ns)
        for problem in iostat.bad:
            self.error_counts["malformed bdev entry"] += 1
            log.warning("spdk: bdev_get_iostat: %s (left out)", problem)
        return iostat, (self._read_reactors() if self._reactors_supported else None)

    def _read_reactors(self) -> ReactorSnapshot | None:
        try:
            answer = self.client.framework_get_reactors()
        except SpdkRpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                self._reactors_supported = False
                self._note("framework_get_reactors not offered by this target: no spdk.reactor.busy")
            else:
                self.error_counts["framework_get_reactors"] += 1
                log.warning("spdk: %s", exc)
            return None
        try:
            reactors = parse_reactors(answer)
        except ValueError as exc:
            self.error_counts["malformed framework_get_reactors"] += 1
            log.warning("spdk: %s", exc)
            return None
        for problem in reactors.bad:
            self.error_counts["malformed reactor entry"] += 1
            log.warning("spdk: framework_get_reactors: %s (left out)", problem)
        return reactors

    def _temperatures(self, start: int, now: int) -> list[AnySample]:
        out: list[AnySample] = []
        if self._nvme_rpc:
            try:
                names = controller_names(self.client.bdev_nvme_get_controllers())
            except SpdkRpcError as exc:
                if exc.code == METHOD_NOT_FOUND:
                    self._nvme_rpc = False
                    self._note("bdev_nvme_get_controllers not offered (no bdev_nvme module): NVMe temperatures "
                               "from sysfs only")
                else:
                    self.error_counts["bdev_nvme_get_controllers"] += 1
                    log.warning("spdk: %s", exc)
                names = []
            except SpdkError as exc:
                self.error_counts["bdev_nvme_get_controllers"] += 1
                log.warning("spdk: %s", exc)
                names = []
            for name in names:
                if name in self._failed_controllers:
                    continue
                try:
                    celsius = health_temperature(self.client.bdev_nvme_get_controller_health_info(name))
                except SpdkRpcError as exc:
                    self._failed_controllers.add(name)
                    self._note(f"controller {name}: no health information ({exc.message}); not asked again")
                    continue
                except SpdkError as exc:
                    self.error_counts["bdev_nvme_get_controller_health_info"] += 1
                    log.warning("spdk: %s", exc)
                    continue
                if celsius is None:
                    self.error_counts["implausible NVMe temperature"] += 1
                    continue
                out.append(Sample(NVME_TEMPERATURE, {"spdk.bdev.name": name}, now, celsius, "gauge", start))
        if not out:
            out = temperature_samples(read_nvme_temperatures(self.sysfs), start, now)
        return out

    def _collect(self, start: int, now: int) -> list[AnySample]:
        try:
            iostat, reactors = self._read_counters(now)
        except SpdkError as exc:
            self.error_counts[type(exc).__name__] += 1
            raise ProbeError(f"spdk: {exc}") from exc
        except ValueError as exc:
            self.error_counts["malformed bdev_get_iostat"] += 1
            raise ProbeError(f"spdk: {exc}") from exc
        samples: list[AnySample] = []
        reason = restart_reason(self._iostat, iostat, self._reactors, reactors)
        if reason:
            self.restarts += 1
            self._failed_controllers.clear()
            self.client.iostat_takes_names = None  # it may be another release now
            log.warning("spdk: target restarted (%s): counters re-baselined, no deltas this interval", reason)
        else:
            if self._iostat is not None:
                samples.extend(bdev_samples(self._iostat, iostat, start, now, self.resets))
            if self._reactors is not None and reactors is not None:
                samples.extend(reactor_samples(self._reactors, reactors, start, now, self.resets))
        self._iostat = iostat
        self._enable_sampling(iostat)
        if reactors is not None or not self._reactors_supported:
            self._reactors = reactors
        samples.extend(self._temperatures(start, now))
        return samples
