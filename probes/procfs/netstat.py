"""/proc/net/snmp and /proc/net/netstat, parsed by header name -> sloscope.tcp.retransmits (Tcp RetransSegs).

Both files come in line pairs: 'Prefix: Name1 Name2 ...' then 'Prefix: value1 value2 ...'. Columns are looked
up by name, never by position, because kernels add columns. Read through /proc/PID/net/... to see the network
namespace of PID."""

from __future__ import annotations

from .common import ProcfsProbe

SIGNAL = "sloscope.tcp.retransmits"


def parse_netstat(text: str) -> dict[str, dict[str, int]]:
    """{"Tcp": {"RetransSegs": 12, ...}, "TcpExt": {...}, ...}"""
    out: dict[str, dict[str, int]] = {}
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) % 2:
        raise ValueError("snmp/netstat text has an odd number of lines (header without values)")
    for header, values in zip(lines[0::2], lines[1::2]):
        hprefix, _, hnames = header.partition(":")
        vprefix, _, vvalues = values.partition(":")
        if hprefix != vprefix:
            raise ValueError(f"header {hprefix!r} followed by values for {vprefix!r}")
        names, nums = hnames.split(), vvalues.split()
        if len(names) != len(nums):
            raise ValueError(f"{hprefix}: {len(names)} names but {len(nums)} values")
        out.setdefault(hprefix, {}).update(zip(names, (int(v) for v in nums)))
    return out


class NetstatProbe(ProcfsProbe):
    name = "netstat"
    signals = (SIGNAL,)
    description = "TCP segments retransmitted (/proc/net/snmp RetransSegs; /proc/net/netstat parsed alongside)"
    files = ("net/snmp", "net/netstat")

    def counters(self) -> dict[str, dict[str, int]]:
        """Every counter of both files, by prefix and name."""
        out = parse_netstat(self.read_text("net/snmp"))
        for prefix, values in parse_netstat(self.read_text("net/netstat")).items():
            out.setdefault(prefix, {}).update(values)
        return out

    def read_counters(self):
        tcp = parse_netstat(self.read_text("net/snmp")).get("Tcp", {})
        if "RetransSegs" not in tcp:
            raise ValueError(f"{self.path('net/snmp')} has no Tcp RetransSegs column")
        return {(SIGNAL, ()): float(tcp["RetransSegs"])}
