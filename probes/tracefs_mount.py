"""tracefs where it is missing: a fresh mount namespace (`ip netns exec` remounts /sys) or a container whose
/sys has no tracing mount shows an empty /sys/kernel/tracing, and every eBPF probe that attaches to a
tracepoint would fall back to procfs. A privileged process can mount it itself, in its own mount namespace
only (nothing on the host changes), as `mount -t tracefs tracefs /sys/kernel/tracing` would.
"""

from __future__ import annotations

import ctypes
import errno
import os

from .base import TRACEFS_MOUNTS

TRACEFS = "/sys/kernel/tracing"
DEBUGFS = "/sys/kernel/debug"  # kernels before 4.1 have tracefs only as debugfs's tracing/


def tracefs_present() -> bool:
    return any(os.path.isdir(os.path.join(m, "events")) for m in TRACEFS_MOUNTS)


def _mount(source: str, target: str, fstype: str) -> int:
    """0, or the errno of mount(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), fstype.encode(), 0, None) == 0:
        return 0
    return ctypes.get_errno()


def ensure_tracefs() -> str | None:
    """Mount tracefs when none is visible and this process is root. None when nothing was needed; else what
    happened, for the log (the probes then say what they lack, if it did not work)."""
    if tracefs_present() or os.geteuid() != 0:
        return None
    if os.path.isdir(TRACEFS):
        target, fstype = TRACEFS, "tracefs"
    else:
        target, fstype = DEBUGFS, "debugfs"
    error = _mount(fstype, target, fstype)
    if error:
        return f"tracefs was not mounted; mounting {fstype} on {target} failed: {errno.errorcode.get(error, error)} " \
               f"({os.strerror(error)})"
    if not tracefs_present():
        return f"mounted {fstype} on {target}, but no tracing events are visible there"
    return f"tracefs was not mounted: mounted {fstype} on {target}"
