"""SPDK probes: a JSON-RPC 2.0 client for the target's Unix socket (also used for remediation writes), the
bdev/reactor/NVMe-temperature probe, and NVMe temperatures from sysfs for kernel-attached drives."""
