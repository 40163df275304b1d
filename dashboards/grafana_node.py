"""The node dashboard (`sloscope-node`): the physical layer of the nodes serving the selected tiers (GPU,
storage, kernel, probe health), with the incident causes ranked for the node on top. Panels whose series the
exporter does not export (yet) are left out, and `exporter_gaps()` lists them. A panel whose signal has a
physical alert draws that alert's threshold from the spec's `physical_limits`."""

from __future__ import annotations

from dataclasses import dataclass

from sloscope import taxonomy
from sloscope.slo_spec import PhysicalLimits, SloSpec

from sloscope import metric_names
from sloscope.dashboards.grafana_panels import (DEFAULT_DATASOURCE_UID, INCIDENTS_UID, NODE_UID, OVERVIEW_UID, above,
                                                cm, dashboard, dm, ds_ref, exported, exported_names, fmt_ms, fmt_num,
                                                gd, heat_panel, matchers, query, series_panel, statetimeline,
                                                threshold_steps, with_row)

# Series the node dashboard wants that the exporter may not export yet: the constant expected in
# sloscope/metric_names.py, the series name expected, the catalog signal it comes from, its labels and its kind.
WANTED = {
    "GPU_IO": ("sloscope_gpu_io_bytes_total", "hw.gpu.io", ("node", "gpu", "link", "direction"), "counter"),
    "TCP_RETRANSMITS": ("sloscope_tcp_retransmits_total", "sloscope.tcp.retransmits", ("node",), "counter"),
    "PRESSURE_STALL": ("sloscope_pressure_stall_seconds_total", "sloscope.pressure.stall",
                       ("node", "resource", "kind"), "counter"),
    "SYSCALL_DURATION": ("sloscope_syscall_duration_seconds", "sloscope.syscall.duration", ("node", "syscall"),
                         "histogram"),
    "BLOCK_IO_DURATION": ("sloscope_block_io_duration_seconds", "sloscope.block.io.duration", ("node", "device"),
                          "histogram"),
    "RUNQUEUE_DELAY": ("sloscope_cpu_runqueue_delay_seconds", "sloscope.cpu.runqueue.delay", ("node",),
                       "histogram"),
    "REMEDIATION_ACTIONS": ("sloscope_remediation_actions_total", "remediation_audit table (alerts/)",
                            ("alert", "action", "target", "decision"), "counter"),
}


@dataclass(frozen=True)
class Gap:
    """A panel (or annotation) left out because the exporter does not export the series it needs."""

    panel: str
    dashboard: str
    constant: str  # expected in sloscope/metric_names.py
    series: str  # expected series name (histograms: the family; _bucket/_count/_sum are queried)
    source: str
    labels: tuple[str, ...]
    kind: str


def _seed(cause: str, signal: str) -> float | None:
    return taxonomy.BY_ID[cause].seed_threshold.get(signal)


def _gauge_expr(name: str, by: str) -> str:
    return f'max by ({by}) ({name}{{node=~"$node"}})'


def _wanted_in(gaps: list[Gap]):
    """`wanted(constant, panel)`: the exported name of the series a panel needs, or None, the panel then recorded
    in gaps."""

    def wanted(constant: str, panel: str) -> str | None:
        series, source, labels, kind = WANTED[constant]
        name = getattr(metric_names, constant, None)
        if exported(name, kind):
            return name
        gaps.append(Gap(panel, NODE_UID, constant, name or series, source, labels, kind))
        return None

    return wanted


def _node_panels(gaps: list[Gap], limits: PhysicalLimits) -> list[tuple[str, list]]:
    """(row title, panels) of the node dashboard; panels whose series are not exported are recorded in gaps."""
    wanted = _wanted_in(gaps)
    return [("GPU", _gpu_panels(wanted)), ("Storage (SPDK, NVMe, block)", _storage_panels(wanted, limits)),
            ("Kernel (network, CPU, syscalls)", _kernel_panels(wanted)), ("Probes", _probe_panels())]


def _gpu_panels(wanted) -> list:
    """Kernel-busy time, SM and HBM activity, utilization, memory, temperature; NVLink and PCIe bytes."""
    gpu = [
        series_panel("GPU kernel busy (peak in window, NVML), per GPU", "percentunit",
                     "Peak share of time any kernel ran within each collection window (NVML utilization samples; "
                     "0 on an idle GPU). Near 100% while requests slow down: kernels queue behind co-tenants. One "
                     "small kernel reads 100% here, so read it beside SM active.",
                     [query(_gauge_expr(metric_names.GPU_KERNEL_BUSY_MAX, "node, gpu"), "{{node}} {{gpu}}")],
                     w=8, min_val=0, max_val=1),
        series_panel("GPU SM active (DCGM), per GPU", "percentunit",
                     "Mean share of SMs with at least one warp resident (DCGM SM_ACTIVE, needs sloscope's "
                     "dcgm-exporter counters file). High while requests slow down: the SMs themselves are full.",
                     [query(_gauge_expr(metric_names.GPU_SM_ACTIVE, "node, gpu"), "{{node}} {{gpu}}")],
                     w=8, min_val=0, max_val=1),
        series_panel("GPU utilization", "percentunit", "GPU utilization per GPU (NVML / DCGM GPU_UTIL).",
                     [query(_gauge_expr(metric_names.GPU_UTILIZATION, "node, gpu"), "{{node}} {{gpu}}")],
                     w=8, min_val=0, max_val=1),
        series_panel("GPU DRAM (HBM) active", "percentunit",
                     "HBM bandwidth utilization (DCGM DRAM_ACTIVE): saturation slows memory-bound inference.",
                     [query(_gauge_expr(metric_names.GPU_DRAM_ACTIVE, "node, gpu"), "{{node}} {{gpu}}")],
                     w=8, min_val=0, max_val=1),
        series_panel("GPU memory used", "bytes",
                     "Framebuffer in use per GPU (without the driver's reserved memory, shown apart), and its size: "
                     f"steady growth is a leak (the rule: {taxonomy.GPU_MEMORY_LEAK.text}).",
                     [query(_gauge_expr(metric_names.GPU_MEMORY_USED, "node, gpu"), "{{node}} {{gpu}} used", "A"),
                      query(_gauge_expr(metric_names.GPU_MEMORY_LIMIT, "node, gpu"), "{{node}} {{gpu}} size", "B"),
                      query(_gauge_expr(metric_names.GPU_MEMORY_RESERVED, "node, gpu"), "{{node}} {{gpu}} reserved",
                            "C")],
                     w=8, min_val=0),
        series_panel("GPU temperature", "celsius", "GPU temperature; throttling starts near the dashed line.",
                     [query(_gauge_expr(metric_names.GPU_TEMPERATURE, "node, gpu"), "{{node}} {{gpu}}")],
                     w=8, thresholds=above(_seed("gpu_thermal", "hw.gpu.temperature") or 85.0)),
    ]
    for link, label in (("nvlink", "NVLink"), ("pcie", "PCIe")):
        name = wanted("GPU_IO", f"{label} throughput")
        if name:
            gpu.append(series_panel(
                f"{label} throughput", "Bps",
                f"{label} bytes per second per GPU and direction: a drop while requests slow down means the "
                f"interconnect is contended.",
                [query(f'sum by (node, gpu, direction) (rate({name}{{node=~"$node", link="{link}"}}'
                       f'[$__rate_interval]))', "{{node}} {{gpu}} {{direction}}")], w=8, min_val=0))

    return gpu


def _storage_panels(wanted, limits: PhysicalLimits) -> list:
    """SPDK bdev wait and queue depth, reactor busy, NVMe temperature; block I/O latency. The dashed lines are
    where the physical alerts fire, so that the panel shows what an alert saw."""
    storage = [
        series_panel("SPDK bdev I/O wait", "s",
                     "Mean wait per I/O of each SPDK bdev and direction; above the dashed line "
                     f"({fmt_ms(limits.spdk_bdev_wait_s * 1000)}) the NVMe queue is congested.",
                     [query(_gauge_expr(metric_names.SPDK_BDEV_IO_WAIT, "node, bdev, direction"),
                            "{{node}} {{bdev}} {{direction}}")],
                     w=8, min_val=0, thresholds=above(limits.spdk_bdev_wait_s)),
        series_panel("SPDK bdev queue depth", "short", "Mean number of I/Os in flight per bdev.",
                     [query(_gauge_expr(metric_names.SPDK_BDEV_QUEUE_DEPTH, "node, bdev"), "{{node}} {{bdev}}")],
                     w=8, min_val=0),
        series_panel("SPDK reactor busy", "percentunit",
                     "Busy share of each SPDK reactor (lcore); a saturated reactor delays every bdev it polls.",
                     [query(_gauge_expr(metric_names.SPDK_REACTOR_BUSY, "node, lcore"), "{{node}} lcore {{lcore}}")],
                     w=8, min_val=0, max_val=1, thresholds=above(limits.spdk_reactor_busy)),
        series_panel("NVMe temperature", "celsius",
                     f"NVMe composite temperature; above {fmt_num(limits.nvme_temperature_c)} C drives throttle.",
                     [query(_gauge_expr(metric_names.NVME_TEMPERATURE, "node, bdev, device"),
                            "{{node}} {{bdev}}{{device}}")],
                     w=8, thresholds=above(limits.nvme_temperature_c)),
    ]
    name = wanted("BLOCK_IO_DURATION", "Block I/O latency")
    if name:
        storage.append(heat_panel("Block I/O latency", "s", "Kernel block request latency (eBPF), per bucket.",
                                  f'sum by (le) (increase({name}_bucket{{node=~"$node"}}[$__rate_interval]))'))

    return storage


def _kernel_panels(wanted) -> list:
    """TCP retransmits, pressure stall, run-queue delay and syscall latency."""
    kernel = []
    name = wanted("TCP_RETRANSMITS", "TCP retransmits")
    if name:
        kernel.append(series_panel("TCP retransmits", "cps", "TCP segments retransmitted per second: packet loss.",
                                   [query(f'sum by (node) (rate({name}{{node=~"$node"}}[$__rate_interval]))',
                                          "{{node}}")], w=8, min_val=0))
    name = wanted("PRESSURE_STALL", "Pressure stall")
    if name:
        kernel.append(series_panel(
            "Pressure stall (PSI)", "percentunit",
            "Share of time some task was stalled on CPU, I/O or memory (Linux pressure stall information).",
            [query(f'sum by (node, resource, kind) (rate({name}{{node=~"$node"}}[$__rate_interval]))',
                   "{{node}} {{resource}} {{kind}}")], w=8, min_val=0))
    for constant, title, what in (
            ("RUNQUEUE_DELAY", "Run-queue delay", "Wake-up to running delay of tasks (eBPF): CPU contention."),
            ("SYSCALL_DURATION", "Syscall latency", "Syscall latency (eBPF): slow runtime paths, lock contention.")):
        name = wanted(constant, title)
        if name:
            kernel.append(heat_panel(title, "s", what,
                                     f'sum by (le) (increase({name}_bucket{{node=~"$node"}}[$__rate_interval]))'))
    return kernel


def _state_panel(title: str, description: str, expr: str, legend: str, states: tuple[str, str]):
    """A state timeline of a 0/1 series, 0 red and 1 green, named by `states`."""
    down, up = states
    return (statetimeline.Panel().title(title).unit("none").datasource(ds_ref()).span(24).height(6)
            .description(description).with_target(query(expr, legend))
            .mappings([dm.ValueMap(options={"0": dm.ValueMappingResult(text=down, color="red", index=0),
                                            "1": dm.ValueMappingResult(text=up, color="green", index=1)})])
            .thresholds(threshold_steps((None, "red"), (1, "green"))).show_value(cm.VisibilityMode.NEVER)
            .merge_values(True).row_height(0.9))


def _probe_panels() -> list:
    """Probe health, and the signals a running probe cannot produce; both once the exporter exports them."""
    probe_up = getattr(metric_names, "PROBE_UP", None)
    if not (probe_up and probe_up in exported_names()):
        return []
    return [
        _state_panel("Probe health",
                     "Per node and probe: up (the probe runs itself and collects) or down (missing, so a "
                     "fallback runs in its place, or failing). A signal whose probe is down is not evidence.",
                     f'max by (node, probe, running) ({probe_up}{{node=~"$node"}})', "{{node}} {{probe}} {{running}}",
                     ("down", "up")),
        _state_panel("Signals a running probe cannot produce",
                     "Per node, probe and signal: down while the source lacks what the signal needs (`needs`: "
                     "DCGM fields the dcgm-exporter does not serve, or SPDK queue-depth sampling that is off).",
                     f'min by (node, probe, signal, needs) ({metric_names.PROBE_SIGNAL_UP}{{node=~"$node"}})',
                     "{{node}} {{probe}} {{signal}} {{needs}}", ("missing", "produced")),
    ]


def node_dashboard(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> gd.Dashboard:
    board = dashboard(NODE_UID, "sloscope / node physical layer",
                      "The physical layer of the nodes serving the selected tiers: GPU, storage and kernel signals as "
                      "sloscope exports them, with the incident causes ranked for the node on top. Opened from the "
                      "incidents dashboard over an incident's time range.", spec, datasource_uid, time_from="now-1h")
    board = board.with_row(gd.Row("Incidents on the node"))
    board = board.with_panel(series_panel(
        "Incident cause scores", "none",
        "Score (0..1) of each cause sloscope ranks for the node's open incidents.",
        [query(f'max by (node, cause) ({metric_names.INCIDENT_CAUSE_SCORE}{{{matchers()}}})', "{{node}} {{cause}}")],
        w=24, h=6, min_val=0, max_val=1))
    for title, panels in _node_panels([], spec.physical_limits):
        if panels:
            board = with_row(board, title, panels)
    return board


def exporter_gaps() -> list[Gap]:
    """Panels and annotations left out because `sloscope serve` does not export the series they need."""
    gaps: list[Gap] = []
    _node_panels(gaps, PhysicalLimits())  # which panels are left out does not depend on their thresholds
    series, source, labels, kind = WANTED["REMEDIATION_ACTIONS"]
    name = getattr(metric_names, "REMEDIATION_ACTIONS", None)
    if not exported(name, kind):
        gaps.append(Gap("annotation: remediation executed", f"{NODE_UID}, {INCIDENTS_UID}, {OVERVIEW_UID}",
                        "REMEDIATION_ACTIONS", name or series, source, labels, kind))
    return gaps
