"""Kernel maps by file descriptor, through the bpf(2) syscall: what a loaded probe needs after its compile.

The collector holds only these descriptors (and the attachments'): bcc, clang and LLVM stay in the process
that compiled the program (probes/ebpf/compile.py), which has exited by then.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from typing import Iterator

# bpf(2) command numbers and map types (include/uapi/linux/bpf.h)
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET_INFO_BY_FD = 15
PER_CPU_MAP_TYPES = {5, 6, 10}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
BPF_NR = {"x86_64": 321, "aarch64": 280, "arm64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}

_libc = ctypes.CDLL(None, use_errno=True)


class MapInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


class ElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("key", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    machine = platform.machine()
    if machine not in BPF_NR:
        raise OSError(f"bpf(2): syscall number unknown on {machine}")
    result = _libc.syscall(BPF_NR[machine], cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        return -ctypes.get_errno()
    return result


def _check(result: int, what: str) -> None:
    if result < 0:
        raise OSError(-result, f"bpf(2) {what}: {os.strerror(-result)}")


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """Per-CPU map values hold one slot per possible CPU (not online: hot-pluggable ones count too)."""
    with open(path) as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


class BpfMap:
    """One kernel map. Values of per-CPU maps come back as every CPU's copy, 8-byte aligned, one after another."""

    def __init__(self, fd: int):
        self.fd = fd
        info = MapInfo()
        attr = InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
        _check(_bpf(BPF_OBJ_GET_INFO_BY_FD, attr), "map info")
        self.name = info.name.decode()
        self.key_size, self.value_size = info.key_size, info.value_size
        per_cpu = info.type in PER_CPU_MAP_TYPES
        self.cpus = possible_cpus() if per_cpu else 1
        self.stride = (self.value_size + 7) // 8 * 8 if per_cpu else self.value_size

    def lookup(self, key: bytes) -> bytes | None:
        keybuf = ctypes.create_string_buffer(key, self.key_size)
        value = ctypes.create_string_buffer(self.stride * self.cpus)
        attr = ElemAttr(map_fd=self.fd, key=ctypes.addressof(keybuf), value=ctypes.addressof(value))
        result = _bpf(BPF_MAP_LOOKUP_ELEM, attr)
        if result == -2:  # ENOENT
            return None
        _check(result, f"lookup in {self.name}")
        return value.raw

    def update(self, key: bytes, value: bytes) -> None:
        """Set an entry of a map that is not per-CPU (the filters and indexes user space fills)."""
        keybuf = ctypes.create_string_buffer(key, self.key_size)
        valuebuf = ctypes.create_string_buffer(value, self.value_size)
        attr = ElemAttr(map_fd=self.fd, key=ctypes.addressof(keybuf), value=ctypes.addressof(valuebuf))
        _check(_bpf(BPF_MAP_UPDATE_ELEM, attr), f"update of {self.name}")

    def keys(self) -> Iterator[bytes]:
        """Every key (of a hash, those present; of an array, every index)."""
        current = ctypes.create_string_buffer(self.key_size)
        following = ctypes.create_string_buffer(self.key_size)
        attr = ElemAttr(map_fd=self.fd, key=0, value=ctypes.addressof(following))
        while True:
            result = _bpf(BPF_MAP_GET_NEXT_KEY, attr)
            if result == -2:  # ENOENT: past the last key
                return
            _check(result, f"next key of {self.name}")
            yield following.raw
            ctypes.memmove(current, following, self.key_size)
            attr.key = ctypes.addressof(current)

    def u64s(self, key: bytes) -> tuple[int, ...]:
        """The value as unsigned 64-bit fields, each summed over CPUs; () when the key is absent."""
        raw = self.lookup(key)
        if raw is None:
            return ()
        fields = self.value_size // 8
        total = [0] * fields
        for cpu in range(self.cpus):
            for i, v in enumerate(struct.unpack_from(f"={fields}Q", raw, cpu * self.stride)):
                total[i] += v
        return tuple(total)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def index_key(index: int) -> bytes:
    return struct.pack("=I", index)
