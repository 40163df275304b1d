"""Pressure stall information: /proc/pressure/{cpu,io,memory} -> sloscope.pressure.stall (s, deltas)."""

from __future__ import annotations

from .common import ProcfsProbe

SIGNAL = "sloscope.pressure.stall"
RESOURCES = ("cpu", "io", "memory")


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """'some avg10=0.00 avg60=0.00 avg300=0.00 total=123' lines -> {"some": {"avg10": 0.0, ..., "total": 123}}.
    `total` is in microseconds."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        fields = {}
        for item in parts[1:]:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"PSI line {line!r}: {item!r} is not key=value")
            fields[key] = int(value) if key == "total" else float(value)
        if "total" not in fields:
            raise ValueError(f"PSI line {line!r} has no total")
        out[parts[0]] = fields
    return out


class PressureProbe(ProcfsProbe):
    name = "pressure"
    signals = (SIGNAL,)
    description = "pressure stall time per resource (/proc/pressure/{cpu,io,memory})"
    files = tuple(f"pressure/{r}" for r in RESOURCES)
    hints = {f: "kernel without CONFIG_PSI, or PSI disabled: boot with psi=1" for f in files}

    def read_counters(self):
        out = {}
        for resource in RESOURCES:
            for kind, fields in parse_pressure(self.read_text(f"pressure/{resource}")).items():
                out[(SIGNAL, (("pressure.resource", resource), ("pressure.kind", kind)))] = fields["total"] / 1e6
        return out
