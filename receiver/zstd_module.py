"""zstd as this Python has it: the standard library's from 3.14 (PEP 784), its backport before."""

import sys

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

__all__ = ["zstd"]
