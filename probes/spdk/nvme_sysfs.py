"""NVMe composite temperature of kernel-attached drives from sysfs -> sloscope.nvme.temperature (Cel).

The kernel's NVMe driver registers a hwmon device per controller (CONFIG_NVME_HWMON); `temp1_input` is the
composite temperature in millidegrees Celsius. Recent kernels put it under /sys/class/nvme/nvmeN/hwmonM/,
older ones under the controller's PCI device (/sys/class/nvme/nvmeN/device/hwmon/hwmonM/); both are read.
Drives that SPDK drives are unbound from the kernel driver and do not appear here: for those the SPDK probe
asks the target (bdev_nvme_get_controller_health_info).
"""

from __future__ import annotations

import glob
import os

from ..base import Availability, Probe
from ..sample import AnySample, Sample

SIGNAL = "sloscope.nvme.temperature"
PATTERNS = ("hwmon*/temp1_input", "device/hwmon/hwmon*/temp1_input")


def read_nvme_temperatures(sysfs: str = "/sys") -> dict[str, float]:
    """{controller (nvme0, ...): composite temperature in Celsius} for every controller with a readable one."""
    out: dict[str, float] = {}
    for ctrl in sorted(glob.glob(os.path.join(sysfs, "class", "nvme", "nvme*"))):
        for pattern in PATTERNS:
            for path in sorted(glob.glob(os.path.join(ctrl, pattern))):
                try:
                    with open(path) as f:
                        text = f.read().strip()
                    out[os.path.basename(ctrl)] = int(text) / 1000.0
                except (OSError, ValueError):
                    continue  # a sensor that cannot be read right now (e.g. -EIO while the drive resets)
                break
            if os.path.basename(ctrl) in out:
                break
    return out


def temperature_samples(temps: dict[str, float], start_ns: int, now: int) -> list[AnySample]:
    return [Sample(SIGNAL, {"system.device": dev}, now, float(t), "gauge", start_ns)
            for dev, t in sorted(temps.items())]


class NvmeSysfsProbe(Probe):
    name = "nvme"
    source = "sysfs"
    signals = (SIGNAL,)
    description = "NVMe composite temperature of kernel-attached drives (/sys/class/nvme/*/hwmon*)"

    def __init__(self, host=None, sysfs: str = "/sys"):
        super().__init__(host)
        self.sysfs = sysfs

    def check(self) -> Availability:
        if read_nvme_temperatures(self.sysfs):
            return Availability(self.name)
        return Availability(self.name, (
            f"{os.path.join(self.sysfs, 'class', 'nvme')}: no NVMe controller with a hwmon temperature "
            "(no kernel-attached NVMe drive, or a kernel without CONFIG_NVME_HWMON)",))

    def _collect(self, start_ns: int, now: int) -> list[AnySample]:
        return temperature_samples(read_nvme_temperatures(self.sysfs), start_ns, now)
