"""Export requests shaped as the OpenTelemetry Collector's receivers write them, from their documentation:

- hostmetrics (receiver/hostmetricsreceiver, each scraper's metadata.yaml): one resource per scrape, with no node
  until a processor adds one (deploy/otelcol-contrib-gateway.yaml inserts k8s.node.name); a scope per scraper;
  the metric names, units, instruments and attribute names of the metadata (`cpu`/`state`, `device`/`direction`,
  `type`, `protocol`/`state` with gopsutil's upper-case TCP states);
- kubeletstats (receiver/kubeletstatsreceiver/documentation.md): one resource for the node (k8s.node.name), one
  per pod (k8s.pod.uid, k8s.pod.name, k8s.namespace.name) and per container (plus k8s.container.name,
  container.id), gauges of CPUs used ({cpu}) and bytes of working set;
- the prometheus receiver scraping dcgm-exporter: the job and instance as resource attributes (service.name,
  service.instance.id, server.address, server.port, url.scheme), no node; every dcgm-exporter label (gpu, UUID,
  pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION) a data point attribute; Prometheus gauges as
  OTLP gauges of doubles with no unit; the receiver's own `up` and `scrape_duration_seconds` beside them.
"""

from __future__ import annotations

from tests.otlp_builders import attr

HOSTMETRICS_SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/hostmetricsreceiver/internal/" \
                    "scraper/{}scraper"
KUBELETSTATS_SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/kubeletstatsreceiver"
PROMETHEUS_SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
VERSION = "0.120.0"


def _points(points, attrs, start_ns=None, integer=False):
    """points: (time_ns, value); a cumulative sum's points share `start_ns`."""
    out = []
    for t, v in points:
        p = {"attributes": [attr(k, x) for k, x in attrs.items()], "timeUnixNano": str(t)}
        if start_ns is not None:
            p["startTimeUnixNano"] = str(start_ns)
        p.update({"asInt": str(int(v))} if integer else {"asDouble": float(v)})
        out.append(p)
    return out


def gauge(name, unit, points, attrs=None, integer=False):
    return {"name": name, "unit": unit, "gauge": {"dataPoints": _points(points, attrs or {}, integer=integer)}}


def cumulative(name, unit, start_ns, points, attrs=None, integer=False, monotonic=True):
    return {"name": name, "unit": unit, "sum": {
        "aggregationTemporality": 2, "isMonotonic": monotonic,
        "dataPoints": _points(points, attrs or {}, start_ns, integer)}}


def explicit_histogram(name, start_ns, points, attrs=None):
    """A Prometheus histogram as the prometheus receiver writes it: an explicit-bucket OTLP histogram, cumulative.
    points: (time_ns, sum or None, bounds, bucket counts)."""
    return {"name": name, "unit": "", "histogram": {"aggregationTemporality": 2, "dataPoints": [
        {"attributes": [attr(k, v) for k, v in (attrs or {}).items()], "startTimeUnixNano": str(start_ns),
         "timeUnixNano": str(t), "count": str(sum(counts)), **({"sum": total} if total is not None else {}),
         "bucketCounts": [str(c) for c in counts], "explicitBounds": bounds} for t, total, bounds, counts in points]}}


def _scope(name, metrics):
    return {"scope": {"name": name, "version": VERSION}, "metrics": metrics}


def hostmetrics(node, scrapers: dict[str, list]):
    """scrapers: scraper name (cpu, load, memory, paging, disk, network) -> its metrics; the node as the
    resource processor of the gateway config inserts it."""
    resource = {"attributes": [attr("k8s.node.name", node)]}
    return {"resourceMetrics": [{"resource": resource, "scopeMetrics": [
        _scope(HOSTMETRICS_SCOPE.format(scraper), metrics) for scraper, metrics in scrapers.items()]}]}


def kubeletstats(node, node_metrics=(), pods=()):
    """pods: (pod name, namespace, pod metrics, {container name: container metrics})."""
    blocks = [{"resource": {"attributes": [attr("k8s.node.name", node)]},
               "scopeMetrics": [_scope(KUBELETSTATS_SCOPE, list(node_metrics))]}] if node_metrics else []
    for n, (pod, namespace, pod_metrics, containers) in enumerate(pods):
        uid = f"0b6c4a5e-0000-4000-8000-{n:012d}"
        pod_attrs = [attr("k8s.pod.uid", uid), attr("k8s.pod.name", pod), attr("k8s.namespace.name", namespace),
                     attr("k8s.node.name", node)]
        blocks.append({"resource": {"attributes": pod_attrs},
                       "scopeMetrics": [_scope(KUBELETSTATS_SCOPE, pod_metrics)]})
        for container, metrics in containers.items():
            attrs = pod_attrs + [attr("k8s.container.name", container),
                                 attr("container.id", f"containerd://{n}{container}")]
            blocks.append({"resource": {"attributes": attrs}, "scopeMetrics": [_scope(KUBELETSTATS_SCOPE, metrics)]})
    return {"resourceMetrics": blocks}


def dcgm_labels(hostname, gpu=0, uuid="GPU-5b7c53a1-2f0e-4c1d-9d6e-0a1b2c3d4e5f"):
    return {"gpu": str(gpu), "UUID": uuid, "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0", "device": f"nvidia{gpu}",
            "modelName": "NVIDIA H200", "Hostname": hostname, "DCGM_FI_DRIVER_VERSION": "570.124.06"}


def prometheus_scrape(instance, metrics, job="dcgm-exporter", times=()):
    """One scrape of `instance` by the prometheus receiver, with the receiver's own series for each time."""
    host, port = instance.rsplit(":", 1)
    resource = {"attributes": [attr("service.name", job), attr("service.instance.id", instance),
                               attr("server.address", host), attr("server.port", port), attr("url.scheme", "http")]}
    own = [gauge("up", "", [(t, 1.0) for t in times]),
           gauge("scrape_duration_seconds", "", [(t, 0.012) for t in times])]
    return {"resourceMetrics": [{"resource": resource,
                                 "scopeMetrics": [_scope(PROMETHEUS_SCOPE, list(metrics) + own)]}]}
