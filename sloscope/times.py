"""The one time grammar: every time sloscope reads (a flag, a query parameter, an Alertmanager alert, a
Kubernetes object, a JSON document of its own) is an RFC 3339 time, and where a command or a page allows it, a
duration back from a reference moment (docs/cli-json.md):

    time     := date ["T" | "t" | " " clock [fraction] [zone]]    2026-12-07T10:30:00Z, 2026-12-07 10:30:00.5+01:00
    clock    := HH:MM:SS          fraction := "." 1 to 9 digits (nanoseconds are read to the microsecond)
    zone     := "Z" | "z" | +HH:MM | -HH:MM                        no zone: UTC
    relative := a duration of sloscope.durations (30m, 1h30m)   counted back from the reference

Times come back as naive UTC datetimes, the stores' own kind. Every error names where the value came from (the
flag, the query parameter, the file and key), given as `where`. Where a program writes the time (Alertmanager's
alerts), its zone is required (`zone_required`): a date alone or a clock without a zone did not come from it.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from sloscope.durations import is_duration, parse_duration
from sloscope.errors import ConfigError

_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})?)?",
                      re.ASCII)
EXAMPLE = "2026-12-07T10:30:00Z"


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def _read(text, where: str, zone_required: bool = False) -> datetime | None:
    """An RFC 3339 time as naive UTC; None where text is not written as one; ConfigError where it is, but names
    no moment (2026-02-30, or 0001-01-01T00:00:00+01:00, in year 0 in UTC), or no zone where one is required."""
    m = _RFC3339.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    date, clock, fraction, zone = m.groups()
    if zone_required and zone is None:
        raise ConfigError(f"{_prefix(where)}{text[:40]!r} has no zone: expected an RFC 3339 time with Z or an "
                          f"offset, like {EXAMPLE}")
    offset = "+00:00" if zone in (None, "Z", "z") else zone
    try:
        t = datetime.fromisoformat(f"{date}T{clock or '00:00:00'}.{(fraction or '').ljust(6, '0')[:6]}{offset}")
        return t.astimezone(timezone.utc).replace(tzinfo=None)
    except ValueError:
        raise ConfigError(f"{_prefix(where)}{text[:40]!r} is not a day and time of the calendar") from None
    except OverflowError:
        raise ConfigError(f"{_prefix(where)}{text[:40]!r} is outside the years 1 to 9999 in UTC") from None


def rfc3339_or_none(text) -> datetime | None:
    """An RFC 3339 time as naive UTC; None where text is not one."""
    try:
        return _read(text, "")
    except ConfigError:
        return None


def parse_rfc3339(text, where: str = "", zone_required: bool = False) -> datetime:
    """An RFC 3339 time as naive UTC; ConfigError (a ValueError) naming `where` otherwise, and where
    `zone_required` and the time has no zone (a date alone, or a clock without Z or an offset)."""
    t = _read(text, where, zone_required)
    if t is None:
        raise ConfigError(f"{_prefix(where)}expected an RFC 3339 time like {EXAMPLE}; got {str(text)[:40]!r}")
    return t


def parse_time(text: str, reference: datetime | None, where: str = "") -> datetime:
    """RFC 3339, or a duration back from `reference`, the newest stored request (e.g. 1h). ConfigError naming
    `where` otherwise, and where a relative time has nothing to count back from."""
    t = _read(text, where)
    if t is not None:
        return t
    try:
        seconds = parse_duration(text, where)
    except ConfigError:
        if is_duration(text):  # a duration, but not above zero: parse_duration says so
            raise
        raise ConfigError(f"{_prefix(where)}{str(text)[:40]!r} is neither an RFC 3339 time nor a duration back "
                          f"(like {EXAMPLE} or 30m)") from None
    if reference is None:
        raise ConfigError(f"{_prefix(where)}a relative time counts back from the newest stored request, and there "
                          "is none: give an RFC 3339 time")
    return reference - timedelta(seconds=seconds)


def rfc3339(t: datetime, fraction: bool = False) -> str:
    """A naive UTC (or aware) datetime in RFC 3339, whole seconds: how sloscope's JSON writes times. With
    `fraction`, its microseconds where it has any, trailing zeros left out: for times that must read back as they
    were (a simulated run may start at any microsecond; the live demo's fault windows are measured to it)."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc)
    if fraction and t.microsecond:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0") + "Z"
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")
