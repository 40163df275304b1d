"""The one size grammar: every byte count sloscope reads (serve's and the webhook's flags, the collector's
config) is a Kubernetes quantity of bytes, with an optional B:

    size := number [unit] ["B"]          268435456, 256Mi, 256MiB, 256MB, 1.5GiB, 64k, 1e9
    unit := Ki Mi Gi Ti Pi Ei            binary: 1024, 1024², ...  (as the Collector's *_mib settings)
          | k K M G T P E                decimal: 1000, 1000², ... (as Kubernetes reads 256M)

Units are read in any case (mi is Mi, kb is kB), but for a bare `m`: Kubernetes reads it as milli, which no
byte count means, so `256m` is refused as ambiguous (`256M`, `256MB` or `256Mi`). A size must come to a whole
number of bytes above zero and below 2^63.
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

from sloscope.errors import ConfigError

_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
# Digits and exponent bounded, so that reading a hostile value costs nothing (1e9999999 would take seconds).
_SIZE = re.compile(r"\s*([0-9]{0,40}\.?[0-9]{1,40}(?:e[-+]?[0-9]{1,2})?)\s*(?:([kmgtpe])(i?))?(b?)\s*",
                   re.IGNORECASE)
EXAMPLES = "268435456, 256MiB, 256MB, 1.5GiB"
LARGEST = 2**63 - 1  # what a signed 64-bit count holds, as every consumer of a size does


def parse_size(value, where: str = "") -> int:
    """Bytes from a size of the grammar above (or a YAML integer); ConfigError naming `where` otherwise."""
    prefix = f"{where}: " if where else ""
    number = _bytes(value)
    if number is None:
        raise ConfigError(f"{prefix}expected a size like {EXAMPLES}; {value!r} is not a size")
    if number == "milli":
        raise ConfigError(f"{prefix}{value!r} is ambiguous: Kubernetes reads m as milli; write M or MB (decimal) "
                          "or Mi or MiB (binary)")
    if number != int(number):
        raise ConfigError(f"{prefix}{value!r} is not a whole number of bytes")
    if not 0 < number <= LARGEST:
        raise ConfigError(f"{prefix}expected a size above zero and below 2^63 bytes; got {value!r}")
    return int(number)


def _bytes(value):
    """The bytes value stands for (exact: a fraction of a byte stays one), None where it is not a size, or
    "milli" for the one ambiguous unit."""
    if isinstance(value, bool):  # YAML's yes/no are not sizes, though bool is an int
        return None
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if not match:
        return None
    number, unit, binary, suffix = match.groups()
    if unit == "m" and not binary and not suffix:
        return "milli"
    scale = (1024 if binary else 1000) ** _POWERS[unit.lower()] if unit else 1
    return Fraction(number) * scale  # exact: 1.5GiB is 1610612736 bytes, not a float's guess


def size_text(n: int) -> str:
    """Bytes as parse_size reads them, in the largest binary unit that holds them exactly: 33554432 -> 32MiB."""
    for unit, power in (("Ei", 6), ("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        if n and n % 1024**power == 0:
            return f"{n // 1024**power}{unit}B"
    return str(n)


def size_argument(text: str) -> int:
    """parse_size as an argparse type: its error said as argparse says it (naming the flag)."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
