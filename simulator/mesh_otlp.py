"""The mesh's requests (simulator/mesh.py) as OTLP/JSON trace lines: per pod a resource, per call a CLIENT span in
the caller and the SERVER span it reached in the callee, an INTERNAL span for the handler's own work, and only the
entry's span with the tier header."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sloscope.simulator import traffic
from sloscope.simulator.otlp_json import attribute as _kv
from sloscope.simulator.otlp_json import TRACES_RESOURCE_TAIL, traces_resource_head
from sloscope.simulator.mesh import (GRPC_INTERNAL, GRPC_OK, GRPC_PORT, GRPC_UNAVAILABLE, GRPC_UNKNOWN, HTTP_PORT,
                                     NAMESPACE, MeshPlan, draw_requests)

SERVER_ROOT = ('{"traceId":"%016x%016x","spanId":"%016x","name":"%s","kind":2,"startTimeUnixNano":"%d",'
               '"endTimeUnixNano":"%d","attributes":[%s,%s%s],"status":%s}')
SERVER_CHILD = ('{"traceId":"%016x%016x","spanId":"%016x","parentSpanId":"%016x","name":"%s","kind":2,'
                '"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":[%s,%s],"status":%s}')
CLIENT = ('{"traceId":"%016x%016x","spanId":"%016x","parentSpanId":"%016x","name":"%s","kind":3,'
          '"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":[%s,%s],"status":%s}')
INTERNAL = ('{"traceId":"%016x%016x","spanId":"%016x","parentSpanId":"%016x","name":"%s","kind":1,'
            '"startTimeUnixNano":"%d","endTimeUnixNano":"%d","status":{}}')


def _grpc_status(code: int) -> str:
    return "{}" if code == GRPC_OK else '{"code":2,"message":"gRPC status %d"}' % code


@dataclass
class _Static:
    server_attrs: list  # per service
    client_attrs: list  # per edge
    names: list  # per service
    client_names: list  # per edge
    status_frag: list  # per service: code -> attribute
    server_status: list  # per service: code -> status object
    client_status: list  # per callee service: code -> status object
    heads: list  # per pod


def _static(plan: MeshPlan) -> _Static:
    if "static" in plan.cache:
        return plan.cache["static"]
    topo = plan.topology
    http_codes = (200, 500) + traffic.STATUS_CODES_4XX + traffic.STATUS_CODES_5XX
    grpc_codes = (GRPC_OK, GRPC_UNKNOWN, GRPC_INTERNAL, GRPC_UNAVAILABLE)
    server_attrs, names, status_frag, server_status, client_status = [], [], [], [], []
    for svc in topo.services:
        names.append(svc.span_name)
        if svc.protocol == "http":
            server_attrs.append(",".join([_kv("http.request.method", svc.operation[0]),
                                          _kv("http.route", svc.operation[1])]))
            status_frag.append({c: _kv("http.response.status_code", c) for c in http_codes})
            server_status.append({c: traffic._status_object(c) for c in http_codes})
            client_status.append({c: traffic._status_object(c, client=True) for c in http_codes})
        else:
            server_attrs.append(",".join([_kv("rpc.system", "grpc"), _kv("rpc.service", svc.operation[0]),
                                          _kv("rpc.method", svc.operation[1])]))
            status_frag.append({c: _kv("rpc.grpc.status_code", c) for c in grpc_codes})
            server_status.append({c: _grpc_status(c) for c in grpc_codes})
            client_status.append(server_status[-1])
    client_attrs, client_names = [], []
    for _, j in topo.edges:
        callee = topo.services[j]
        common = [_kv("peer.service", callee.name), _kv("server.address", callee.address)]
        if callee.protocol == "http":
            client_attrs.append(",".join(common + [_kv("server.port", HTTP_PORT),
                                                   _kv("http.request.method", callee.operation[0])]))
            client_names.append(callee.operation[0])
        else:
            client_attrs.append(",".join(common + [_kv("server.port", GRPC_PORT), _kv("rpc.system", "grpc"),
                                                   _kv("rpc.service", callee.operation[0]),
                                                   _kv("rpc.method", callee.operation[1])]))
            client_names.append(callee.span_name)
    heads = [traces_resource_head([
        ("service.name", topo.services[p.service].name), ("service.namespace", NAMESPACE),
        ("service.instance.id", p.name), ("host.name", topo.nodes[p.node]), ("k8s.node.name", topo.nodes[p.node]),
        ("k8s.namespace.name", NAMESPACE), ("k8s.deployment.name", topo.services[p.service].name),
        ("k8s.pod.name", p.name)], scope="opentelemetry") for p in topo.pods]
    plan.cache["static"] = _Static(server_attrs, client_attrs, names, client_names, status_frag, server_status,
                                   client_status, heads)
    return plan.cache["static"]


@dataclass
class TraceBatch:
    """One chunk's spans as OTLP/JSON lines per flush interval: one line per node, one resource per pod."""

    lines: dict  # interval -> [line, ...]
    server: int
    client: int
    internal: int


def _ns(plan: MeshPlan, seconds: np.ndarray) -> np.ndarray:
    return plan.start_ns + np.round(seconds * 1e9).astype(np.int64)


def render_chunk(plan: MeshPlan, chunk: int, a: int, b: int) -> TraceBatch:
    """The spans of the requests arriving in seconds [a, b), in the flush intervals of their end (kept within
    this chunk's)."""
    req = draw_requests(plan, chunk, a, b)
    first_iv, last_iv = a // plan.flush, (b - 1) // plan.flush
    if req is None:
        return TraceBatch({}, 0, 0, 0)
    topo, st = plan.topology, _static(plan)
    ns = len(topo.services)
    by_pod: dict = {}
    counts = [0, 0, 0]

    def put(pods: np.ndarray, ends: np.ndarray, strings: list) -> None:
        iv = np.clip((ends - plan.start_ns) // (plan.flush * 10**9), first_iv, last_iv)
        for key, s in zip((pods * (last_iv + 1) + iv).tolist(), strings):
            by_pod.setdefault(key, []).append(s)

    tf = traffic.TIER_FRAGMENTS
    for i, svc in enumerate(topo.services):
        sel = np.flatnonzero(req.called[i])
        if not len(sel):
            continue
        h, lo, sid = req.ids[sel, 0].tolist(), req.ids[sel, 1].tolist(), req.ids[sel, 2 + i].tolist()
        start, end = _ns(plan, req.start[i][sel]), _ns(plan, req.end[i][sel])
        codes = req.code[i][sel].tolist()
        attrs, name, sfr, sob = st.server_attrs[i], st.names[i], st.status_frag[i], st.server_status[i]
        if i == 0:
            strings = [SERVER_ROOT % (x, y, s, name, s0, e0, attrs, sfr[c], tf[fr], sob[c]) for x, y, s, s0, e0, c, fr
                       in zip(h, lo, sid, start.tolist(), end.tolist(), codes, req.frag[sel].tolist())]
        else:
            k = topo.parent_edge[i]
            parent = req.ids[sel, 2 + 2 * ns + k].tolist()
            strings = [SERVER_CHILD % (x, y, s, ps, name, s0, e0, attrs, sfr[c], sob[c]) for x, y, s, ps, s0, e0, c
                       in zip(h, lo, sid, parent, start.tolist(), end.tolist(), codes)]
        put(req.pod[i][sel], end, strings)
        counts[0] += len(sel)
        if svc.work:
            # the own work after the calls, less the framework's bit at either end
            own_after = req.end[i][sel] - req.work_start[i][sel]
            w0 = _ns(plan, req.work_start[i][sel] + 0.05 * own_after)
            w1 = np.maximum(_ns(plan, req.end[i][sel] - 0.05 * own_after), w0 + 1)
            wid = req.ids[sel, 2 + ns + i].tolist()
            put(req.pod[i][sel], w1, [INTERNAL % (x, y, w, s, svc.work, s0, e0) for x, y, w, s, s0, e0
                                      in zip(h, lo, wid, sid, w0.tolist(), w1.tolist())])
            counts[2] += len(sel)
    for k, (i, j) in enumerate(topo.edges):
        sel = np.flatnonzero(req.e_called[k])
        if not len(sel):
            continue
        c0, c1 = _ns(plan, req.c_start[k][sel]), _ns(plan, req.c_end[k][sel])
        codes = req.code[j][sel].tolist()
        attrs, name, sfr, cso = st.client_attrs[k], st.client_names[k], st.status_frag[j], st.client_status[j]
        strings = [CLIENT % (x, y, c, ps, name, s0, e0, attrs, sfr[code], cso[code]) for x, y, c, ps, s0, e0, code
                   in zip(req.ids[sel, 0].tolist(), req.ids[sel, 1].tolist(), req.ids[sel, 2 + 2 * ns + k].tolist(),
                          req.ids[sel, 2 + i].tolist(), c0.tolist(), c1.tolist(), codes)]
        put(req.pod[i][sel], c1, strings)
        counts[1] += len(sel)
    lines: dict = {}
    stride = last_iv + 1
    for j in range(first_iv, last_iv + 1):
        for node in range(len(topo.nodes)):
            res = [st.heads[p] + ",".join(by_pod[p * stride + j]) + TRACES_RESOURCE_TAIL
                   for p, pod in enumerate(topo.pods) if pod.node == node and p * stride + j in by_pod]
            if res:
                lines.setdefault(j, []).append('{"resourceSpans":[' + ",".join(res) + "]}")
    return TraceBatch(lines, *counts)
