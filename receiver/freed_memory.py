"""Giving the memory a large decode freed back to the system.

glibc keeps what a thread frees in that thread's arena, and the server decodes in many request threads: after a
request whose decoding built hundreds of megabytes of messages, each arena it touched would stay as large, so a
process's size would follow how many threads ever decoded a large request rather than what is in flight.
malloc_trim returns the free pages of every arena. Elsewhere (another C library) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

try:
    _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc
    _trim = None

# Below it, what a decode frees stays for the next one: trimming walks every arena's free lists.
TRIM_ABOVE_BYTES = 16 * 2**20


def release() -> None:
    """Give back what is free."""
    if _trim is not None:
        _trim(0)
