"""Real faults for the live demo, and the plumbing that makes sure nothing outlives it.

Every process is started in its own process group and stopped by group: SIGTERM, then SIGKILL after a grace
period; each also gets SIGTERM should the demo itself die (setpriv --pdeathsig). The backend's network
namespace (a veth pair, one /24) and every nftables rule inside it go away with the namespace; the service's
memory cgroup is removed once its processes are gone. Leftovers of a run that was killed outright (SIGKILL
leaves no chance to clean up) are recognised by name, `sloscope-live-<pid>` with a dead pid, and removed by
the next run.

The faults, each started and stopped by the demo, one at a time:

- cpu: `stress-ng --cpu N` pinned with taskset to the service's CPUs (N = 16 workers per CPU), in the
  service's session, so that the scheduler shares the CPU per thread as among co-tenants of one cgroup;
- disk: `fio` random 4 MiB direct writes (queue depth 32, an fsync every 32 writes), several jobs, on the
  service's filesystem, in a bounded file set that is removed afterwards. Each of the service's reads and
  fsyncs waits behind what is queued, jobs x depth x block: 512 MiB, a tenth of a second or more even on a
  disk that writes 4-5 GB/s (1 MiB blocks queued only 30-40 ms there, under the demo's objective);
- network: an nftables rule in the backend's namespace dropping a share of the packets arriving there
  (`numgen random mod 100 < P`), so the service's calls lose packets on their path;
- memory: `stress-ng --vm` in the service's memory cgroup (a pod's memory limit) allocating most of the limit
  once and holding it, so that the kernel must reclaim the service's file-backed weights, which the service
  then faults back in; checked against /proc/meminfo's MemAvailable first, and bounded by the cgroup's limit,
  so that the rest of the machine never feels it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("sloscope.live")

PREFIX = "sloscope-live-"
NFT_TABLE = "sloscope_live_fault"
# Children get SIGTERM when the demo dies, even by SIGKILL (util-linux setpriv; PR_SET_PDEATHSIG).
PDEATHSIG = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=30)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- processes -------------------------------------------------------------------------------------------

class Processes:
    """Child processes by name, each in its own process group; stop() and stop_all() end the whole group."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], stdout_path: Path | None = None) -> subprocess.Popen:
        log_file = open(self.log_dir / f"{name}.log", "ab")
        stdout = open(stdout_path, "wb") if stdout_path else log_file
        # A process group of its own (stopped as a group), but the same session: with autogroup scheduling a
        # new session would be a CPU group of its own, and a noisy neighbour would get a share as a group,
        # not per thread as co-tenants of one cgroup do.
        if PDEATHSIG:
            argv = PDEATHSIG + argv
        try:
            proc = subprocess.Popen(argv, stdout=stdout, stderr=log_file, stdin=subprocess.DEVNULL, process_group=0)
        finally:
            log_file.close()  # the child holds its own descriptors
            stdout.close()
        self.procs[name] = proc
        return proc

    def running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def stop(self, name: str, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        _signal_group(proc, sig)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", name, grace_s)
            _signal_group(proc, signal.SIGKILL)
            return proc.wait(timeout=10)
        finally:
            _signal_group(proc, signal.SIGKILL)  # whatever it left behind in its group

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            try:
                self.stop(name)
            except Exception:  # keep stopping the others
                log.exception("stopping %s", name)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --- the backend's network namespace ---------------------------------------------------------------------

@dataclass
class BackendNetwork:
    """A network namespace for the backend, joined to this one by a veth pair: 10.200.N.1/24 here,
    10.200.N.2/24 there (N: the first /24 of 10.200.0.0/16 not in use on this machine)."""

    tag: str = field(default_factory=lambda: str(os.getpid()))
    netns: str = ""
    host_if: str = ""
    ns_if: str = ""
    host_ip: str = ""
    backend_ip: str = ""

    def __post_init__(self):
        self.netns = PREFIX + self.tag
        short = self.tag[-8:]
        self.host_if, self.ns_if = f"slh{short}", f"sln{short}"  # interface names: 15 characters at most

    def up(self) -> "BackendNetwork":
        subnet = _free_subnet()
        self.host_ip, self.backend_ip = str(subnet[1]), str(subnet[2])
        run("ip", "netns", "add", self.netns)
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        run("ip", "link", "set", self.ns_if, "netns", self.netns)
        run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        run("ip", "-n", self.netns, "addr", "add", f"{self.backend_ip}/24", "dev", self.ns_if)
        run("ip", "-n", self.netns, "link", "set", self.ns_if, "up")
        run("ip", "-n", self.netns, "link", "set", "lo", "up")
        return self

    def exec_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def down(self) -> None:
        run("ip", "netns", "delete", self.netns, check=False)  # takes its end of the veth and its nft rules
        run("ip", "link", "delete", self.host_if, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    used = set(re.findall(r"inet 10\.200\.(\d+)\.", run("ip", "-o", "-4", "addr", "show").stdout))
    for n in range(256):
        if str(n) not in used:
            return ipaddress.ip_network(f"10.200.{n}.0/24")
    raise RuntimeError("no free /24 in 10.200.0.0/16 for the backend's namespace")


def remove_leftovers() -> list[str]:
    """Namespaces, interfaces and cgroups of earlier runs whose process is gone (a run killed by SIGKILL)."""
    removed = []
    for root in (*MemoryCgroup.V2_ROOTS, MemoryCgroup.V1_ROOT):
        for path in Path(root).glob(PREFIX + "*") if Path(root).is_dir() else ():
            match = re.fullmatch(re.escape(PREFIX) + r"(\d+)", path.name)
            if match and not pid_alive(int(match.group(1))):
                try:
                    path.rmdir()
                    removed.append(str(path))
                except OSError:
                    pass
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(re.escape(PREFIX) + r"(\d+)", name)
        if match and not pid_alive(int(match.group(1))):
            run("ip", "netns", "delete", name, check=False)
            run("ip", "link", "delete", f"slh{match.group(1)[-8:]}", check=False)
            removed.append(name)
    return removed


# --- faults ----------------------------------------------------------------------------------------------

class Fault:
    name: str = ""
    cause: str = ""  # the taxonomy cause it should be attributed to

    def describe(self) -> str:
        raise NotImplementedError

    def start(self, procs: Processes, duration_s: float) -> None:
        raise NotImplementedError

    def stop(self, procs: Processes) -> None:
        procs.stop(f"fault-{self.name}", grace_s=5)


class CpuFault(Fault):
    name, cause = "cpu", "cpu_contention"

    def __init__(self, cpus: str, workers_per_cpu: int = 16):
        self.cpus = cpus
        self.workers = workers_per_cpu * len(parse_cpus(cpus))

    def describe(self) -> str:
        return f"stress-ng --cpu {self.workers} pinned (taskset -c {self.cpus}) to the service's CPUs"

    def start(self, procs: Processes, duration_s: float) -> None:
        procs.start(f"fault-{self.name}", ["taskset", "-c", self.cpus, "stress-ng", "--cpu", str(self.workers),
                                           "--timeout", f"{int(duration_s) + 5}s", "--quiet"])


class DiskFault(Fault):
    name, cause = "disk", "disk_io"

    def __init__(self, directory: Path, cpus: str, jobs: int = 4, size_mib: int = 128, block_kib: int = 4096,
                 iodepth: int = 32, fsync_every: int = 32):
        self.directory = directory
        self.cpus = cpus
        self.jobs, self.size_mib, self.block_kib, self.iodepth, self.fsync_every = (
            jobs, size_mib, block_kib, iodepth, fsync_every)

    def describe(self) -> str:
        return (f"fio (taskset -c {self.cpus}): {self.jobs} jobs of random {self.block_kib} KiB direct writes, "
                f"queue depth {self.iodepth}, fsync every {self.fsync_every} writes, {self.size_mib} MiB each, in "
                f"{self.directory}")

    def start(self, procs: Processes, duration_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        procs.start(f"fault-{self.name}", [
            "taskset", "-c", self.cpus,
            "fio", "--name=sloscope-live-disk", f"--directory={self.directory}", "--rw=randwrite",
            f"--bs={self.block_kib}k", "--direct=1", "--ioengine=libaio", f"--iodepth={self.iodepth}",
            f"--fsync={self.fsync_every}", f"--size={self.size_mib}M", f"--numjobs={self.jobs}",
            "--time_based", f"--runtime={int(duration_s) + 5}", "--unlink=1", "--output-format=terse"])

    def stop(self, procs: Processes) -> None:
        super().stop(procs)
        shutil.rmtree(self.directory, ignore_errors=True)


class LossFault(Fault):
    name, cause = "network", "network_loss"

    def __init__(self, network: BackendNetwork, percent: int = 25):
        self.network = network
        self.percent = percent

    def describe(self) -> str:
        return (f"nftables in {self.network.netns}: drop {self.percent}% of the packets arriving at the "
                f"backend ({self.network.backend_ip})")

    def _nft(self, *args: str, check: bool = True):
        return run("ip", "netns", "exec", self.network.netns, "nft", *args, check=check)

    def start(self, procs: Processes, duration_s: float) -> None:
        self._nft("add", "table", "inet", NFT_TABLE)
        self._nft("add", "chain", "inet", NFT_TABLE, "input", "{ type filter hook input priority 0; policy accept; }")
        self._nft("add", "rule", "inet", NFT_TABLE, "input", "ip", "daddr", self.network.backend_ip,
                  "numgen", "random", "mod", "100", "<", str(self.percent), "drop")

    def stop(self, procs: Processes) -> None:
        self._nft("delete", "table", "inet", NFT_TABLE, check=False)


class MemoryCgroup:
    """A memory cgroup for the service and its co-tenants, as a pod's memory limit: cgroup v2 (memory.max)
    where the memory controller is there, else v1 (memory.limit_in_bytes). Processes join it through
    `wrap(argv)` before they exec, so that the page cache they create is charged to it."""

    V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
    V1_ROOT = "/sys/fs/cgroup/memory"

    def __init__(self, tag: str, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.path: Path | None = None
        self.version = 0
        for root in self.V2_ROOTS:
            controllers = Path(root, "cgroup.controllers")
            if controllers.exists() and "memory" in controllers.read_text().split():
                self.path, self.version = Path(root, PREFIX + tag), 2
                return
        if Path(self.V1_ROOT, "memory.limit_in_bytes").exists():
            self.path, self.version = Path(self.V1_ROOT, PREFIX + tag), 1

    @property
    def available(self) -> bool:
        return self.path is not None

    def create(self) -> "MemoryCgroup":
        if self.path is None:
            raise RuntimeError("no memory cgroup controller (cgroup v2 memory or v1 memory) is mounted")
        self.path.mkdir(exist_ok=True)
        limit = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        (self.path / limit).write_text(str(self.limit_bytes))
        return self

    def usage(self) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int((self.path / name).read_text())

    def wrap(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(50):  # the last processes may take a moment to be reaped
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        log.warning("could not remove %s (processes still in it?)", self.path)


class MemoryFault(Fault):
    """A co-tenant in the service's memory cgroup allocating all but `leave_mib` of its limit, once, and holding
    it (no swap: anonymous memory stays). The service's file-backed weights then no longer fit: the kernel
    reclaims them and the service faults them back in, stalling on memory (PSI memory)."""

    name, cause = "memory", "memory_pressure"

    def __init__(self, cgroup: MemoryCgroup, cpus: str, leave_mib: int = 192):
        self.cgroup = cgroup
        self.cpus = cpus
        self.leave_mib = leave_mib
        self.bytes = cgroup.limit_bytes - leave_mib * 2**20

    def describe(self) -> str:
        return (f"stress-ng --vm 1 --vm-bytes {self.bytes // 2**20}M --vm-keep --vm-populate --vm-hang 0 (taskset -c "
                f"{self.cpus}) in the service's memory cgroup ({self.cgroup.limit_bytes // 2**20} MiB limit): "
                f"allocate, hold, and leave {self.leave_mib} MiB for the service's weights and page cache")

    def start(self, procs: Processes, duration_s: float) -> None:
        available = meminfo()["MemAvailable"]
        if available < self.bytes + 1024 * 2**20:
            raise RuntimeError(f"MemAvailable is {available / 2**20:.0f} MiB: too little to allocate "
                               f"{self.bytes / 2**20:.0f} MiB safely")
        procs.start(f"fault-{self.name}", self.cgroup.wrap([
            "taskset", "-c", self.cpus, "stress-ng", "--vm", "1", "--vm-bytes", f"{self.bytes // 2**20}M",
            "--vm-keep", "--vm-populate", "--vm-method", "write64", "--vm-hang", "0",
            "--timeout", f"{int(duration_s) + 5}s", "--quiet"]))


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def parse_cpus(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def missing_tools(names) -> list[str]:
    return [n for n in names if shutil.which(n) is None]


def wait_for(predicate, seconds: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()
