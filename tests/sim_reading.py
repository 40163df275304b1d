"""Reading what the simulator writes: OTLP/JSON lines, attributes, SERVER spans per SLI step, metric points."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np

START = "2026-03-01T12:00:00Z"
START_NS = int(datetime.fromisoformat(START.replace("Z", "+00:00")).timestamp()) * 10**9
TIERS = {"p99-latency-critical": (99, 0.8, 0.001), "standard": (95, 0.2, 0.005)}


def read_lines(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def attrs(kvs) -> dict:
    out = {}
    for kv in kvs or []:
        v = kv["value"]
        if "stringValue" in v:
            out[kv["key"]] = v["stringValue"]
        elif "intValue" in v:
            out[kv["key"]] = int(v["intValue"])
        elif "doubleValue" in v:
            out[kv["key"]] = v["doubleValue"]
        elif "arrayValue" in v:
            out[kv["key"]] = [x.get("stringValue", x.get("intValue")) for x in v["arrayValue"].get("values", [])]
        else:
            out[kv["key"]] = None
    return out


def fold_tier(a: dict) -> str:
    """docs/tiers.md: only declared tiers survive; anything else is the default tier."""
    v = a.get("http.request.header.x-slo-tier", a.get("slo.tier"))
    if isinstance(v, list):
        v = v[0] if len(v) == 1 else None
    return v if isinstance(v, str) and v in TIERS else "standard"


def server_spans(lines: list[dict]) -> list[tuple]:
    """(node, service, tier, start_ns, end_ns, failed) per SERVER span."""
    out = []
    for line in lines:
        for rs in line["resourceSpans"]:
            res = attrs(rs["resource"]["attributes"])
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if sp["kind"] != 2:
                        continue
                    a = attrs(sp["attributes"])
                    node = a.get("k8s.node.name", res["k8s.node.name"])
                    failed = a["http.response.status_code"] >= 500 or sp.get("status", {}).get("code") == 2
                    out.append((node, res["service.name"], fold_tier(a), int(sp["startTimeUnixNano"]),
                                int(sp["endTimeUnixNano"]), failed))
    return out


def steps(spans, key=lambda s: s[3]):
    """(tier, service, node, 10 s step) -> (latencies in s, failures)."""
    groups = defaultdict(lambda: ([], [0]))
    for s in spans:
        g = groups[(s[2], s[1], s[0], key(s) // 10**10)]
        g[0].append((s[4] - s[3]) / 1e9)
        g[1][0] += s[5]
    return groups


def metric_points(lines: list[dict]):
    """node -> name -> attribute key -> list of (time, point) and the metric's instrument key and unit."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    kinds = {}
    for line in lines:
        for rm in line["resourceMetrics"]:
            node = attrs(rm["resource"]["attributes"])["k8s.node.name"]
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    key = next(k for k in ("gauge", "sum", "exponentialHistogram") if k in m)
                    kinds[m["name"]] = (key, m["unit"], m[key])
                    for dp in m[key]["dataPoints"]:
                        ak = json.dumps(attrs(dp.get("attributes")), sort_keys=True)
                        out[node][m["name"]][ak].append((int(dp["timeUnixNano"]), dp))
    return out, kinds


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q))
