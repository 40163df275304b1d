"""What the bcc loaders share: compile a .c file beside them in a child process, keep only the descriptors of
its maps and attachments, read maps into deltas, detach by closing.

The compile runs in `compile.py`, a short-lived child: bcc with clang and LLVM costs the compiling process
about 70 MiB once imported and more per program, and none of it is needed once the program is in the kernel.
The child passes the map and attachment descriptors back over a Unix socket and exits; this process reads
the maps through bpf(2) (maps.py) and detaches by closing the descriptors.

Maps are cumulative in the kernel and never cleared from user space (clearing races with the programs);
each collect differences the current totals against the previous ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import ClassVar, Hashable, Iterable, Sequence

from ..base import Availability, Probe, ProbeError, ProbeUnavailable, ebpf_missing
from ..sample import AnySample
from .maps import BpfMap

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILER = os.path.join(HERE, "compile.py")
COMPILE_TIMEOUT_S = 180
MAX_DESCRIPTORS = 250  # below the kernel's SCM_MAX_FD (253) per message
HIST_SLOTS = 64  # SLOSCOPE_HIST_SLOTS in hist.h


class LoadError(RuntimeError):
    """The program did not compile, load or attach; the message says why (bcc's and clang's words)."""


@dataclass
class LoadedProgram:
    """A program in the kernel, held by descriptors: closing them all detaches it and frees its maps."""

    maps: dict[str, BpfMap]
    links: list[int]
    syscalls: dict[str, int] = field(default_factory=dict)  # resolved syscall name -> number

    def close(self) -> None:
        for fd in self.links:  # attachments first: no program runs on a map being closed
            os.close(fd)
        self.links = []
        for m in self.maps.values():
            m.close()
        self.maps = {}


def load_program(source: str, cflags: Sequence[str], maps: Sequence[str], syscalls: Sequence[str] = ()
                 ) -> LoadedProgram:
    """Compile, load and attach `source` in a child; keep the named maps and the attachments."""
    request = json.dumps({"source": source, "cflags": list(cflags), "maps": list(maps), "syscalls": list(syscalls)})
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        try:
            # -P: the probes' own modules beside compile.py (tcp.py, maps.py, ...) must not shadow any bcc imports
            proc = subprocess.run([sys.executable, "-P", COMPILER, str(theirs.fileno())], input=request, text=True,
                                  pass_fds=(theirs.fileno(),), capture_output=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise LoadError(f"compiling took over {COMPILE_TIMEOUT_S} s") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 1 << 16, MAX_DESCRIPTORS, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            message, fds = b"", []
    return _loaded(message, fds, proc)


def _loaded(message: bytes, fds: list[int], proc: subprocess.CompletedProcess) -> LoadedProgram:
    """The program the child's reply describes; on any failure, its descriptors closed (which detaches it)."""
    try:
        reply = json.loads(message) if message else {"error": f"the compiler exited with status {proc.returncode}"}
        if "error" not in reply and len(fds) != len(reply["maps"]) + reply["links"]:
            reply = {"error": "descriptors lost on the way"}
        if "error" not in reply:
            names = reply["maps"]
            return LoadedProgram(maps={n: BpfMap(fd) for n, fd in zip(names, fds)}, links=fds[len(names):],
                                 syscalls=reply["syscalls"])
    except (ValueError, KeyError, OSError) as exc:
        reply = {"error": f"unreadable reply from the compiler: {exc}"}
    for fd in fds:
        os.close(fd)
    diagnostics = [line for line in proc.stderr.splitlines() if line.strip()][-8:]
    raise LoadError("; ".join([reply["error"], *diagnostics]))


def histogram(value: Sequence[int]) -> tuple[dict[int, int], int]:
    """A `struct sloscope_hist` map value (hist.h: the slot counts, then the summed ns) as
    ({slot: count}, sum_ns), empty slots left out."""
    return {slot: count for slot, count in enumerate(value[:HIST_SLOTS]) if count}, value[HIST_SLOTS]


def read_histograms(table: BpfMap, keys: Iterable[tuple[bytes, Hashable]]
                    ) -> tuple[dict[Hashable, dict[int, int]], dict[Hashable, int]]:
    """({key: {slot: count}}, {key: sum_ns}) from a map of `struct sloscope_hist`, for (raw key, key) pairs."""
    slots, sums = {}, {}
    for raw, key in keys:
        value = table.u64s(raw)
        if value:
            slots[key], sums[key] = histogram(value)
    return slots, sums


class HistogramDeltas:
    """Cumulative (key -> slot -> count, key -> sum_ns) in, deltas since the previous call out."""

    def __init__(self) -> None:
        self._slots: dict[Hashable, dict[int, int]] = {}
        self._sums: dict[Hashable, int] = {}

    def update(self, slots: dict[Hashable, dict[int, int]], sums: dict[Hashable, int]
               ) -> dict[Hashable, tuple[dict[int, int], int]]:
        out: dict[Hashable, tuple[dict[int, int], int]] = {}
        for key, cur in slots.items():
            prev = self._slots.get(key, {})
            delta = {s: c - prev.get(s, 0) for s, c in cur.items() if c > prev.get(s, 0)}
            sum_delta = max(0, sums.get(key, 0) - self._sums.get(key, 0))
            if delta:
                out[key] = (delta, sum_delta)
        self._slots = {k: dict(v) for k, v in slots.items()}
        self._sums = dict(sums)
        return out


class BccProbe(Probe):
    """Base of the eBPF probes. Subclasses name their `c_file`, its `maps`, the tracepoints they need, and
    `read()`. The programs attach themselves (bcc's TRACEPOINT_PROBE / RAW_TRACEPOINT_PROBE)."""

    source = "ebpf"
    c_file: ClassVar[str]
    maps: ClassVar[tuple[str, ...]]  # the maps read() reads or configure() fills
    any_tracepoint: ClassVar[bool] = False  # True: runs if at least one of tracepoints() exists

    def __init__(self, host=None):
        super().__init__(host)
        self._program: LoadedProgram | None = None

    # -- what subclasses provide -------------------------------------------------------------------
    def tracepoints(self) -> list[str]:
        raise NotImplementedError

    def cflags(self) -> list[str]:
        return []

    def map_names(self) -> tuple[str, ...]:
        return self.maps

    def syscalls_to_resolve(self) -> tuple[str, ...]:
        """Syscall names whose numbers configure() needs (resolved by bcc, in the compiling child)."""
        return ()

    def configure(self, program: LoadedProgram) -> None:
        """Fill the maps that tell the attached programs what to do (filters, indexes)."""

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        raise NotImplementedError

    # -- the Probe interface -----------------------------------------------------------------------
    def check(self) -> Availability:
        try:
            missing, notes = ebpf_missing(self.host, self.tracepoints(), any_of=self.any_tracepoint)
        except Exception as exc:  # a check must never take the caller down
            missing, notes = [f"availability check failed: {type(exc).__name__}: {exc}"], []
        return Availability(self.name, tuple(missing), tuple(notes))

    def _start(self) -> None:
        self._notes = list(self._require_available().notes)
        path = os.path.join(HERE, self.c_file)
        try:
            self._program = load_program(path, [f"-I{HERE}", *self.cflags()], self.map_names(),
                                         self.syscalls_to_resolve())
        except (LoadError, OSError) as exc:
            raise ProbeUnavailable(self.name, [f"BPF program {self.c_file} failed to compile or load: {exc}"]) from exc
        try:
            self.configure(self._program)
        except Exception as exc:  # the failed start's _stop() detaches the program
            raise ProbeUnavailable(self.name, [f"configuring {self.c_file} failed: {exc}"]) from exc

    def _collect(self, start_ns: int, now: int) -> list[AnySample]:
        try:
            return self.read(self._program.maps, start_ns, now)
        except OSError as exc:
            raise ProbeError(f"probe {self.name!r}: reading its maps failed: {exc}") from exc

    def _stop(self) -> None:
        program, self._program = self._program, None
        if program is not None:
            program.close()
