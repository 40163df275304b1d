"""RCA accuracy on public real data: the Online Boutique faults of Nezha (IntelligentDDS/Nezha, FSE'23).

Reads a local copy of the Nezha repository's data (`--data DIR`, holding rca_data/); fetches nothing and writes
nothing into it. Only the Online Boutique days 2022-08-22 and 2022-08-23 are read. Per fault it converts the
fault's trace minutes and the pods' metrics around it to OTLP/JSON as the Collector's file exporter writes it (one
export request per line), loads them into a fresh DuckDB store with `sloscope ingest`, asks
`sloscope rca --at` for the moment after the injection, and scores the top entry:

- service AC@1, every fault: the injected pod's service is the `service` of the first of `moment.causes`, or,
  where no cause is ranked, of the first of `moment.culprits`;
- (node, cause) AC@1, physical faults: the first cause names the injected pod's node and the cause the fault
  produces (cpu_contention and cpu_consumed: `cpu_contention`; network_delay: `network_latency`);
- application, code faults (return, exception): the first cause is `application`, on the injected pod's service.
A key the answer lacks counts as a miss.

    .venv/bin/python benchmarks/public_rca.py --data /path/to/Nezha [--day 2022-08-22] [--limit N] [--work DIR]

What the CSVs become:

- Spans (trace/HH_MM_trace.csv): service = the pod name without its ReplicaSet and pod suffixes
  (`cartservice-579f59597d-wc2lz` -> `cartservice`); resource attributes service.name, k8s.pod.name,
  k8s.namespace.name (NAMESPACE: the data names none) and k8s.node.name (the grouping below). The CSVs hold no
  span kind, status or node. Kind: SERVER for a root span or one whose parent sits in another pod; else CLIENT
  for a span with a child in another pod, with `peer.service` = that child's service (the earliest child's,
  where several pods answer one span); else INTERNAL. A span whose parent is in none of the case's files (it
  ran in a minute the copy lacks) is judged by its children alone. No status: the data has none. Frontend's
  root spans, the requests that enter the shop, carry the tier header (catalog.TIER_HEADER_ATTRIBUTE) with one
  tier for all (TIER). Spans are read from the fault's files together (a trace crosses the files' minute
  boundaries) and each (TraceID, SpanID) is kept once (neighbouring files overlap by a second or so).
- Nodes: the data names no node, but every pod's metric file carries three node-level columns
  (NodeCpuUsageRate(%), NodeMemoryUsageRate(%), NodeNetworkReceiveBytes) that pods on one node share. Rows
  are matched by the minute of their `Time` column (UTC; the `TimeStamp` column is corrupt in some files); two
  pods are on one node when all three columns are equal (relative difference under NODE_TOLERANCE) in at least
  NODE_MATCH of the minutes at which both have all three (a zero there is a sample the data lacks: about 60
  minutes of two pods on 2022-08-22); nodes are the connected groups of that relation, named node-1, node-2,
  ... in the order of their first pod's name, per day (a pod rescheduled between the days is a new pod). The
  grouping is printed with each pair's matching minutes.
- Metrics, at their own 60 s resolution and at their `Time`: per pod (resource k8s.pod.name, k8s.namespace.name,
  k8s.node.name) kubeletstats' `k8s.pod.cpu.usage` = CpuUsage(m) / 1000 cores and `k8s.pod.memory.working_set`
  = MemoryUsage(Mi) * 2^20 bytes; per node (resource k8s.node.name) hostmetrics' `system.cpu.utilization`
  {state: user} = NodeCpuUsageRate(%) / 100 and `system.memory.utilization` {state: used} =
  NodeMemoryUsageRate(%) / 100. A value of exactly 0 is a missing sample and not written. Node CPU is no
  `k8s.node.cpu.usage`: that counts cores, and the data gives a share without the node's CPU count, which no
  column gives (the pods' usage leaves out what else runs on the node). NodeCpuUsageRate(%) is the share of
  all the node's CPUs that is not idle; hostmetrics splits that share per CPU and per state, the data does not,
  so it is one series without a `cpu` attribute, with `state: user`, the state that holds most of a busy
  node's time, and one of the three (user, system, steal) that the taxonomy reads alike for cpu_contention; it
  is an upper bound of the user share (system, interrupt and iowait time are in it too).
  Not mapped, for want of a catalog signal of that meaning: CpuUsageRate(%) and MemoryUsageRate(%) (shares of
  the pod's limits, the same movement as the usage above), SyscallRead/Write (counts, where the catalog has
  syscall latency), Network{Receive,Transmit}Bytes and NodeNetworkReceiveBytes (throughput), the Pod*LatencyP*,
  PodWorkload and PodSuccessRate columns and front_service.csv, source_50.csv, destination_50.csv (what the
  spans measure themselves), dependency.csv (the spans give the call graph), and the logs.

When: the copy's trace file HH_MM holds the spans that started in the minute up to HH:MM plus the collection's
offset (about 19 s on 2022-08-22, 27 s on 2022-08-23), and a fault injected in minute M has the files of M, M+1
and M+2. So its requests start 33-100 s before the injection and end 1 min 20 s to 2 min 27 s after it. The
moment asked is the minute from OFFSET (60 s) after the injection: it lies where the faulty spans are, and its one
metric sample comes a full minute or more after the injection (the first sample after it holds part of a normal
minute). The minute from 2 min after the injection would hold no spans at all for an injection past the offset.
`--baseline 10m --lookback 1m` (the defaults of `sloscope rca`) then end the baseline at the injection: it holds
every request of the case from before the fault and ten of the metrics' 60 s samples, more than the six steps a
series' baseline needs (the first fault of a day has only the two or three samples taken since the metrics
began). The faults are 8-9 minutes apart, often several in a row on one pod, and their metrics move for 3 to 6
minutes, so a fault's baseline can hold the end of the previous one (up to about half of its samples); the data
leaves no quieter stretch, and the baseline is the project's default, not fitted to this. A fault is analysed when the
copy holds the trace file of its injection minute (the requests before it, for the baseline) and of M+2 (the
requests of the moment); the others are skipped and counted, with the minutes the copy lacks. Each case's store
gets the spans of its own files and the metrics from BASELINE + LOOKBACK + METRIC_MARGIN before the moment to
METRIC_MARGIN after its end.

Targets: service AC@1 >= 0.9; (node, cause) AC@1 >= 0.85 over the physical faults; application >= 0.8 of the code
faults. For reference, the published service-level top-1 on Online Boutique (Nezha's paper, its 56 faults): Nezha
92.86 % (it reads the logs too), MicroRank 41.07 %, PDiagnose 41.07 %.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sloscope.durations import parse_duration

# The conversion beside this script (run as a script or loaded from its file, the folder is on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from nezha_otlp import (NAMESPACE, TIER, MetricRow, SpanReport, count_points, group_nodes,  # noqa: E402, F401
                        metric_requests, read_pod_metrics, read_spans, service_of, span_kinds, trace_requests,
                        write_jsonl)

DAYS = ("2022-08-22", "2022-08-23")  # Online Boutique; the Train Ticket days are not read

OFFSET = timedelta(seconds=60)
BASELINE, LOOKBACK = "10m", "1m"
METRIC_MARGIN = timedelta(minutes=5)


PHYSICAL = {"cpu_contention": "cpu_contention", "cpu_consumed": "cpu_contention", "network_delay": "network_latency"}
CODE = ("return", "exception")
APPLICATION = "application"

TARGET_SERVICE, TARGET_NODE_CAUSE, TARGET_APPLICATION = 0.9, 0.85, 0.8
PUBLISHED = (("Nezha (reads logs too)", 92.86), ("MicroRank", 41.07), ("PDiagnose", 41.07))

def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- faults ---


@dataclass(frozen=True)
class Fault:
    day: str
    at: datetime  # the injection, UTC
    pod: str
    kind: str  # Nezha's inject_type

    @property
    def service(self) -> str:
        return service_of(self.pod)

    @property
    def expected_cause(self) -> str | None:
        if self.kind in PHYSICAL:
            return PHYSICAL[self.kind]
        return APPLICATION if self.kind in CODE else None

    def minutes(self) -> tuple[str, ...]:
        """The names of its trace files: the injection minute and the two after it."""
        first = self.at.replace(second=0, microsecond=0)
        return tuple(f"{(first + timedelta(minutes=k)):%H_%M}_trace.csv" for k in range(3))


def read_faults(day_dir: Path) -> list[Fault]:
    """The faults of DAY-fault_list.json, in time order."""
    day = day_dir.name
    listing = json.loads((day_dir / f"{day}-fault_list.json").read_text())
    faults = [Fault(day, datetime.strptime(f["inject_time"], "%Y-%m-%d %H:%M:%S"), f["inject_pod"], f["inject_type"])
              for hour in listing.values() for f in hour]
    return sorted(faults, key=lambda f: f.at)


# --- sloscope ---


def sloscope_command() -> str:
    """The CLI beside the interpreter that runs this (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "sloscope"
    return str(beside) if beside.exists() else (shutil.which("sloscope") or "sloscope")


_INGESTED = re.compile(r"ingested \d+ lines .*?: (?P<requests>\d+) requests, (?P<samples>\d+) samples")


def ingest(db: Path, files: list[Path]) -> dict:
    """Runs `sloscope ingest`; its exit status, the requests and samples it says it loaded, and its stderr."""
    done = subprocess.run([sloscope_command(), "ingest", "--db", str(db), *map(str, files)],
                          capture_output=True, text=True)
    if done.returncode == 2:
        raise RuntimeError(f"sloscope ingest: {done.stderr.strip()}")
    match = _INGESTED.search(done.stderr)
    return {"rc": done.returncode, "requests": int(match["requests"]) if match else None,
            "samples": int(match["samples"]) if match else None, "stderr": done.stderr.strip()}


def rca_moment(db: Path, at: datetime, baseline: str = BASELINE, lookback: str = LOOKBACK, top: int = 5) -> dict:
    """`sloscope rca --at` as JSON: the document, or {"error": ...}."""
    done = subprocess.run([sloscope_command(), "rca", "--db", str(db), "--at", f"{at:%Y-%m-%dT%H:%M:%SZ}",
                           "--baseline", baseline, "--lookback", lookback, "--top", str(top), "--format", "json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        return {"error": f"not JSON: {exc}"}


# --- scoring ---


def _first(moment: dict, key: str) -> dict | None:
    entries = moment.get(key) if isinstance(moment, dict) else None
    return entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else None


def score(fault: Fault, node: str | None, document: dict) -> dict:
    """The hits of one answer (None where a measure does not apply to the fault) and what its top entry says."""
    moment = document.get("moment") if isinstance(document, dict) else None
    moment = moment if isinstance(moment, dict) else {}
    cause, culprit = _first(moment, "causes"), _first(moment, "culprits")
    top = cause or culprit
    expected = fault.expected_cause
    out = {"service": bool(top) and top.get("service") == fault.service, "node_cause": None, "application": None}
    if fault.kind in PHYSICAL:
        out["node_cause"] = bool(cause) and cause.get("node") == node and cause.get("cause") == expected
    elif fault.kind in CODE:
        out["application"] = bool(cause) and cause.get("cause") == APPLICATION and cause.get("service") == fault.service
    if cause:
        got = " ".join(str(cause.get(k) or "?") for k in ("service", "node", "cause"))
    elif culprit:
        got = " ".join(str(culprit.get(k) or "?") for k in ("service", "node", "kind")) + " (culprit)"
    else:
        diagnosis = moment.get("diagnosis")
        verdict = diagnosis.get("verdict") if isinstance(diagnosis, dict) else None
        error = document.get("error") if isinstance(document, dict) else None
        got = f"- ({verdict or error or 'no answer'})"
    out["got"] = got
    out["expected"] = f"{fault.service} {node or '?'} {expected or fault.kind}"
    return out


# --- the run ---


def missing_minutes(fault: Fault, trace_dir: Path) -> list[str]:
    """The trace minutes (HH_MM) that the analysis of this fault needs and the copy lacks: the injection minute's
    (the requests before it, for the baseline) and the one two minutes on (the requests of the moment)."""
    names = fault.minutes()
    return [name[:5] for name in (names[0], names[2]) if not (trace_dir / name).exists()]


def run_case(fault: Fault, day_dir: Path, pods: dict[str, list[MetricRow]], node_of: dict[str, str], workdir: Path,
             offset: timedelta) -> dict:
    files = [day_dir / "trace" / name for name in fault.minutes() if (day_dir / "trace" / name).exists()]
    report = SpanReport()
    spans = read_spans(files, report)
    kinds = span_kinds(spans, report)
    at = fault.at + offset
    since = at - timedelta(seconds=parse_duration(BASELINE) + parse_duration(LOOKBACK)) - METRIC_MARGIN
    until = at + timedelta(minutes=1) + METRIC_MARGIN
    epoch = datetime(1970, 1, 1)
    since_ns, until_ns = (int((t - epoch) / timedelta(microseconds=1)) * 1000 for t in (since, until))
    workdir.mkdir(parents=True, exist_ok=True)
    traces = write_jsonl(workdir / "traces.jsonl", trace_requests(spans, kinds, node_of))
    metric_reqs = metric_requests(pods, node_of, since_ns, until_ns)
    metrics = write_jsonl(workdir / "metrics.jsonl", metric_reqs)
    db = workdir / "store.duckdb"
    for stale in workdir.glob("store.duckdb*"):  # a fresh store each time, also in a kept --work directory
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    began = time.perf_counter()
    loaded = ingest(db, [traces, metrics])
    ingest_s = time.perf_counter() - began
    began = time.perf_counter()
    document = rca_moment(db, at)
    rca_s = time.perf_counter() - began
    return {"spans": len(spans), "points": count_points(metric_reqs), "span_report": report, "loaded": loaded,
            "document": document, "at": at, "ingest_s": ingest_s, "rca_s": rca_s,
            "files": [f.name for f in files]}


def ratio(hits: list[bool]) -> str:
    return f"{sum(hits)}/{len(hits)} = {sum(hits) / len(hits):.3f}" if hits else "0/0 (none)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the local copy of the Nezha repository")
    parser.add_argument("--day", action="append", choices=DAYS, help="only this day (repeatable; default both)")
    parser.add_argument("--limit", type=int, help="analyse at most this many faults")
    parser.add_argument("--work", type=Path, help="keep each case's OTLP/JSON files and store here")
    parser.add_argument("--json", type=Path, help="also write every fault's answer and scores here")
    args = parser.parse_args()
    root = args.data / "rca_data"
    if not root.is_dir():
        parser.error(f"--data {args.data}: no rca_data/ in it")
    work = args.work or Path(tempfile.mkdtemp(prefix="public_rca-"))
    results, skipped = [], []
    try:
        for day in args.day or DAYS:
            if args.limit is not None and len(results) >= args.limit:
                break
            day_dir = root / day
            faults = read_faults(day_dir)
            log(f"{day}: reading the pods' metrics")
            pods, bad_rows = read_pod_metrics(day_dir / "metric")
            grouping = group_nodes(pods)
            print(f"nodes of {day} ({len(pods)} pods, {bad_rows} metric rows left out):")
            for line in grouping.lines():
                print(f"  {line}")
            for fault in faults:
                if args.limit is not None and len(results) >= args.limit:
                    break
                missing = missing_minutes(fault, day_dir / "trace")
                if missing:
                    skipped.append((fault, missing))
                    continue
                log(f"[{len(results) + 1}] {day} {fault.at:%H:%M:%S} {fault.pod} {fault.kind}")
                case = run_case(fault, day_dir, pods, grouping.node_of, work / day / f"{fault.at:%H%M%S}",
                                OFFSET)
                node = grouping.node_of.get(fault.pod)
                case.update(fault=fault, node=node, **score(fault, node, case["document"]))
                r, loaded = case["span_report"], case["loaded"]
                log(f"    files {', '.join(case['files'])}: {case['spans']:,} spans ({dict(r.kinds)}, "
                    f"{r.orphans} orphans, {r.duplicates} duplicates, {r.malformed} malformed), "
                    f"{case['points']} points; ingest exit {loaded['rc']} ({loaded['requests']} requests, "
                    f"{loaded['samples']} samples) {case['ingest_s']:.1f} s; rca {case['rca_s']:.1f} s")
                if loaded["rc"] != 0:
                    log(f"    ingest: {loaded['stderr'][-800:]}")
                results.append(case)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report(results, skipped)
    if args.json:
        args.json.write_text(json.dumps([
            {"day": c["fault"].day, "inject_time": f"{c['fault'].at:%Y-%m-%dT%H:%M:%SZ}", "pod": c["fault"].pod,
             "type": c["fault"].kind, "node": c["node"], "at": f"{c['at']:%Y-%m-%dT%H:%M:%SZ}",
             "service_hit": c["service"], "node_cause_hit": c["node_cause"], "application_hit": c["application"],
             "answer": c["document"]} for c in results], indent=1))
    return 0


def report(results: list[dict], skipped: list[tuple[Fault, list[str]]]) -> None:
    print()
    rows = [("day", "time", "pod", "type", "expected", "got", "service", "cause")]
    for c in results:
        f = c["fault"]
        cause = c["node_cause"] if f.kind in PHYSICAL else c["application"]
        rows.append((f.day, f"{f.at:%H:%M:%S}", f.pod, f.kind, c["expected"], c["got"], "ok" if c["service"] else "-",
                     "" if cause is None else ("ok" if cause else "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
        if n == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    total = len(results) + len(skipped)
    print(f"\nfaults: {total}; analysed {len(results)}; skipped {len(skipped)} for want of a trace file (the injection "
          "minute's, for the baseline, or that of two minutes on, for the moment)")
    for f, missing in skipped:
        print(f"  skipped {f.day} {f.at:%H:%M:%S} {f.pod} {f.kind}: no {' or '.join(missing)} trace file")
    services = [c["service"] for c in results]
    physical = [c["node_cause"] for c in results if c["fault"].kind in PHYSICAL]
    code = [c["application"] for c in results if c["fault"].kind in CODE]
    print()
    for name, hits, target in (("service AC@1", services, TARGET_SERVICE),
                               ("(node, cause) AC@1, physical faults", physical, TARGET_NODE_CAUSE),
                               ("application, code faults", code, TARGET_APPLICATION)):
        verdict = "meets" if hits and sum(hits) / len(hits) >= target else "below"
        print(f"{name:<37} {ratio(hits):<18} target >= {target:.2f}: {verdict}")
    print("published service-level top-1 on Online Boutique: "
          + ", ".join(f"{name} {value:.2f} %" for name, value in PUBLISHED))


if __name__ == "__main__":
    sys.exit(main())
