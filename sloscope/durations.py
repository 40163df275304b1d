"""The one duration grammar (docs/slo-spec.md, "Durations"): the SLO spec, the collector's, sampling's and
remediation's configs, and every command-line duration read it.

    duration := number                    plain seconds: 90, 2.5, 1e3 (also a YAML number)
              | (number unit)+            250ms, 30s, 5m, 1h30m, 1.5h, 7d, 2w
    unit     := ms | s | m | min | h | d | w   (any case)

Whitespace may stand around the whole and between a number and its unit, as in `10 s`. The value must be
above zero.
"""

from __future__ import annotations

import argparse
import math
import re

from sloscope.errors import ConfigError

UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
EXAMPLES = "250ms, 30s, 5m, 1h30m, 7d, 2w or plain seconds (90)"

_NUMBER = r"[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?"
_PLAIN = re.compile(rf"\s*({_NUMBER})\s*", re.IGNORECASE)
_TERM_TEXT = rf"\s*({_NUMBER})\s*(ms|min|s|m|h|d|w)\s*"  # `ms` and `min` before `m`: the longest unit wins
_TERM = re.compile(_TERM_TEXT, re.IGNORECASE)
_TERMS = re.compile(rf"(?:{_TERM_TEXT})+", re.IGNORECASE)


def is_duration(value) -> bool:
    """Whether value is written in the grammar, whatever it amounts to (zero too)."""
    seconds = _seconds(value)
    return seconds is not None and math.isfinite(seconds)


def parse_duration(value, where: str = "") -> float:
    """Seconds from a duration of the grammar above. `where` names the value in the error (a file and key, a
    flag); empty where the caller adds its own (argparse names the option)."""
    seconds = _seconds(value)
    prefix = f"{where}: " if where else ""
    if seconds is None or not math.isfinite(seconds):
        raise ConfigError(f"{prefix}expected a duration like {EXAMPLES}; {value!r} is not a duration")
    if seconds <= 0:
        raise ConfigError(f"{prefix}expected a duration above zero; got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration in the grammar's own words, largest units first: 600 -> 10m, 5400 -> 1h30m, 0.25 -> 250ms."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    text, rest = "", round(seconds)
    for unit in ("w", "d", "h", "m", "s"):
        count, rest = divmod(rest, UNIT_SECONDS[unit])
        text += f"{count}{unit}" if count else ""
    return text


def duration_argument(text: str) -> float:
    """parse_duration as an argparse type: a flag's value, its error said as argparse says it (naming the flag)."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(value) -> float | None:
    """The seconds `value` stands for; None when it is not a duration at all."""
    if isinstance(value, bool):  # YAML's yes/no are not durations, though bool is an int
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    plain = _PLAIN.fullmatch(value)
    if plain:
        return float(plain.group(1))
    if not _TERMS.fullmatch(value):
        return None
    return sum(float(number) * UNIT_SECONDS[unit.lower()] for number, unit in _TERM.findall(value))
