"""`sloscope probe NAME...`: run probes on this node and print catalog-named samples."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from contextlib import contextmanager

from sloscope import catalog
from sloscope.arguments import Parser
from sloscope.durations import duration_argument

from .ebpf.syscall_latency import DEFAULT_SYSCALLS
from .gpu.dcgm_exporter import DEFAULT_URL as DCGM_URL
from .spdk.rpc_client import DEFAULT_SOCKET as SPDK_SOCKET
from .registry import FALLBACKS, NODE_PROBES, PROBES, ProbeSet
from .sample import AnySample, HistogramSample

EPILOG = """\
probes (eBPF ones need root, BTF, tracefs and kernel headers, nvml an NVIDIA driver, dcgm a dcgm-exporter,
spdk an SPDK target; without them they fall back as shown):
{probes}
  node             = {node}
  all              = every probe above

output:
  --format table   for people: one block per interval.
  --format json    for machines: JSON Lines. First one {{"record": "status", "requested", "running",
                   "missing", "lost_signals", "notes"}} per requested probe, then one {{"record": "sample", "name",
                   "unit", "instrument", "kind", "attributes", "start_time_unix_nano", "time_unix_nano", ...}}
                   per sample: "value" for kind gauge/counter_delta (deltas over the interval), or the OTLP
                   exponential-histogram fields (count, sum, scale, zero_count, positive_offset,
                   positive_bucket_counts; seconds) for kind histogram.

exit status: 0 when every requested probe (or its fallback) runs, 1 when one produces nothing, 2 on a
usage error, 130 when interrupted.
"""


def _probe_lines() -> str:
    lines = []
    for name, cls in PROBES.items():
        fb = FALLBACKS.get(name)
        extra = f" (fallback: {', '.join(fb)})" if fb else (" (no fallback)" if fb is not None else "")
        lines.append(f"  {name:<16} {cls.description}{extra}\n  {'':<16} signals: {', '.join(cls.signals)}")
    return "\n".join(lines)


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "probe", help="run kernel probes on this node and print their samples",
        description="Run probes on this node for --duration, collecting every --interval (durations: 30s, 500ms), and "
        "print the samples under their signal-catalog names (counters and histograms as deltas per interval).",
        epilog=EPILOG.format(probes=_probe_lines(), node=" ".join(NODE_PROBES)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", metavar="NAME", help="probe names (see below), or 'node' or 'all'")
    parser.add_argument("--duration", type=duration_argument, default=5.0, metavar="DURATION",
                        help="run this long: 10, 10s, 2m (default 5s)")
    parser.add_argument("--interval", type=duration_argument, default=1.0, metavar="DURATION",
                        help="collect every DURATION: 1, 500ms (default 1s)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    parser.add_argument("--syscalls", metavar="LIST",
                        help="syscall probe: comma-separated syscalls (default: %s)" % ",".join(DEFAULT_SYSCALLS))
    parser.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                        help="syscall probe: only these processes (repeatable)")
    parser.add_argument("--cgroup", action="append", default=[], metavar="CGROUP",
                        help="syscall probe: only these cgroup v2 ids or paths (repeatable)")
    parser.add_argument("--per-pid", action="store_true",
                        help="syscall probe: one histogram per process; nvml probe: SM utilization per process")
    parser.add_argument("--dcgm-url", metavar="URL",
                        help="dcgm probe: dcgm-exporter's metrics endpoint (default %s)" % DCGM_URL)
    parser.add_argument("--spdk-socket", metavar="PATH",
                        help="spdk probe: the SPDK target's JSON-RPC socket (default %s)" % SPDK_SOCKET)
    parser.add_argument("--spdk-qd-sampling-us", type=int, default=0, metavar="US",
                        help="spdk probe: turn the target's queue-depth sampling on at this period where it is off "
                             "(bdev_set_qd_sampling_period; one poller per bdev; 0, the default, changes nothing)")
    parser.set_defaults(func=run)
    return parser


def expand_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        if name == "node":
            out.extend(NODE_PROBES)
        elif name == "all":
            out.extend(PROBES)
        elif name in PROBES:
            out.append(name)
        else:
            raise ValueError(f"unknown probe {name!r}; known: {', '.join(PROBES)}, node, all")
    return list(dict.fromkeys(out))


def sample_record(sample: AnySample) -> dict:
    sig = catalog.signal(sample.name)
    return {"record": "sample", "name": sample.name, "unit": sig.unit, "instrument": sig.instrument.value,
            **{k: v for k, v in sample.to_dict().items() if k != "name"}}


def _seconds(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v / 1e-9:.3g}ns"


def format_value(sample: AnySample) -> str:
    unit = catalog.signal(sample.name).unit
    if isinstance(sample, HistogramSample):
        return (f"count={sample.count} mean={_seconds(sample.mean)} "
                f"p50<={_seconds(sample.quantile(0.5))} p99<={_seconds(sample.quantile(0.99))}")
    if unit == "s":
        return _seconds(sample.value)
    value = f"{sample.value:.6g}"
    return f"{value} {unit}" if unit != "1" else value


def format_table(samples: list[AnySample]) -> list[str]:
    rows = []
    for s in sorted(samples, key=lambda s: (s.name, tuple(str(v) for v in s.attributes.values()))):
        attrs = " ".join(f"{k}={v}" for k, v in s.attributes.items())
        kind = "delta" if s.kind == "counter_delta" else s.kind
        rows.append((s.name, attrs, kind, format_value(s)))
    if not rows:
        return ["  (no samples)"]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]


@contextmanager
def _sigterm_interrupts():
    """SIGTERM stops a run the way Ctrl-C does, so probes are detached either way."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        names = expand_names(args.names)
    except ValueError as exc:
        print(f"sloscope probe: {exc}", file=sys.stderr)
        return 2
    options = {}
    syscall_opts = {}
    if args.syscalls:
        syscall_opts["syscalls"] = [s.strip() for s in args.syscalls.split(",") if s.strip()]
    if args.pid:
        syscall_opts["pids"] = args.pid
    if args.cgroup:
        syscall_opts["cgroups"] = args.cgroup
    if args.per_pid:
        syscall_opts["per_pid"] = True
    if syscall_opts:
        options["syscall"] = syscall_opts
    if args.per_pid:
        options["nvml"] = {"per_process": True}
    if args.dcgm_url:
        options["dcgm"] = {"url": args.dcgm_url}
    spdk_opts = {}
    if args.spdk_socket:
        spdk_opts["socket_path"] = args.spdk_socket
    if args.spdk_qd_sampling_us:
        spdk_opts["qd_sampling_period_us"] = args.spdk_qd_sampling_us
    if spdk_opts:
        options["spdk"] = spdk_opts

    def emit(line: str) -> None:
        print(line, file=out, flush=True)

    probes = ProbeSet(names, options=options)
    with _sigterm_interrupts():
        try:
            decisions = probes.start()
            for d in decisions:
                if args.format == "json":
                    emit(json.dumps({"record": "status", **d.to_dict()}))
                else:
                    emit(f"# {d.explain()}")
            if not probes.probes:
                return 1
            started = time.monotonic()
            deadline = started + args.duration
            tick = 0
            while True:
                now = time.monotonic()
                if now >= deadline - 1e-3:
                    break
                tick += 1
                time.sleep(max(0.0, min(started + tick * args.interval, deadline) - now))
                samples = probes.collect()
                if args.format == "json":
                    for s in samples:
                        emit(json.dumps(sample_record(s)))
                else:
                    emit(f"-- interval {tick} at {time.monotonic() - started:.2f} s")
                    for line in format_table(samples):
                        emit(line)
                for name, err in probes.errors.items():
                    print(f"sloscope probe: collecting {name} failed: {err}", file=sys.stderr)
        except KeyboardInterrupt:
            return 130
        finally:  # also when the reader went away (| head): the command then exits 141, as for every subcommand
            probes.stop()
    return 0 if all(d.running for d in decisions) else 1


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="sloscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
