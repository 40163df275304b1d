"""Paging: /proc/vmstat -> system.paging.faults ({fault}, deltas) by system.paging.type (major, minor).

A major fault reads its page from disk. On a node without swap that is the page cache (mapped model
weights, libraries) taken back under memory pressure and needed again: memory pressure that the kernel's
memory PSI barely sees, because the waiting is for the read (I/O), not for reclaim."""

from __future__ import annotations

from .common import ProcfsProbe

SIGNAL = "system.paging.faults"


def parse_vmstat(text: str) -> dict[str, int]:
    """'name value' lines -> {name: value}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ValueError(f"vmstat line {line!r} is not 'name value'")
        out[parts[0]] = int(parts[1])
    return out


def vmstat_value(text: str, name: str) -> int:
    """The value of one counter, found by its line rather than by parsing all of them (the probe needs two of
    about 190)."""
    key = f"\n{name} "
    found = ("\n" + text).find(key)
    if found < 0:
        raise KeyError(name)
    start = found + len(key) - 1  # in text, without the newline put in front
    end = text.find("\n", start)
    return int(text[start:] if end < 0 else text[start:end])


class VmstatProbe(ProcfsProbe):
    name = "vmstat"
    signals = (SIGNAL,)
    description = "page faults, major (read from disk) and minor (/proc/vmstat pgmajfault, pgfault)"
    files = ("vmstat",)

    def read_counters(self):
        text = self.read_text("vmstat")
        try:
            major, total = vmstat_value(text, "pgmajfault"), vmstat_value(text, "pgfault")
        except KeyError as exc:
            raise ValueError(f"/proc/vmstat has no {exc.args[0]}") from None
        return {(SIGNAL, (("system.paging.type", "major"),)): float(major),
                (SIGNAL, (("system.paging.type", "minor"),)): float(total - major)}
