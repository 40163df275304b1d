"""The SLO spec (docs/slo-spec.md): loading and validation with errors that name file, key and expectation."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
TIER_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

DEFAULT_SPEC_YAML = """\
default_tier: standard
tiers:
  p99-latency-critical:
    latency: {percentile: 99, threshold_ms: 800}
    availability: 99.9
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
window: 30d
resolution: 10s
"""


class SpecError(ValueError):
    """A spec that cannot be used; the message says where and what was expected."""


@dataclass(frozen=True)
class TierObjective:
    name: str
    percentile: float
    threshold_ms: float
    availability: float  # percent

    @property
    def error_budget(self) -> float:
        return 1.0 - self.availability / 100.0


@dataclass(frozen=True)
class SloSpec:
    default_tier: str
    tiers: dict[str, TierObjective]
    window_s: float
    resolution_s: float
    source: str = "<built-in>"


def parse_duration(text, where: str) -> float:
    match = _DURATION.match(str(text).strip())
    if not match:
        raise SpecError(f"{where}: expected a duration like 10s, 5m, 30d; got {text!r}")
    seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if seconds <= 0:
        raise SpecError(f"{where}: duration must be positive; got {text!r}")
    return seconds


def _number(value, where: str, low: float, high: float, *, open_low=False, open_high=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: expected a number; got {value!r}")
    too_low = value <= low if open_low else value < low
    too_high = value >= high if open_high else value > high
    if too_low or too_high:
        lo, hi = ("(" if open_low else "[") + str(low), str(high) + (")" if open_high else "]")
        raise SpecError(f"{where}: expected a number in {lo}, {hi}; got {value!r}")
    return float(value)


def _mapping(value, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(required)}; got {type(value).__name__}")
    unknown = sorted(set(map(str, value)) - set(required) - set(optional))
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(required + optional)})")
    for key in required:
        if key not in value:
            raise SpecError(f"{where}: missing key {key!r}")
    return value


def _tier(name, body, where: str) -> TierObjective:
    if not isinstance(name, str) or not TIER_NAME.match(name):
        raise SpecError(f"{where}: tier names are lower-case [a-z0-9._-], at most 63 characters; got {name!r}")
    body = _mapping(body, f"{where}.{name}", ("latency", "availability"))
    latency = _mapping(body["latency"], f"{where}.{name}.latency", ("percentile", "threshold_ms"))
    return TierObjective(
        name=name,
        percentile=_number(latency["percentile"], f"{where}.{name}.latency.percentile", 0, 100,
                           open_low=True, open_high=True),
        threshold_ms=_number(latency["threshold_ms"], f"{where}.{name}.latency.threshold_ms", 0, 1e9, open_low=True),
        availability=_number(body["availability"], f"{where}.{name}.availability", 0, 100,
                             open_low=True, open_high=True),
    )


def parse_spec(text: str, source: str = "<string>") -> SloSpec:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    doc = _mapping(doc, source, ("default_tier", "tiers"), ("window", "resolution"))
    tiers_doc = doc["tiers"]
    if not isinstance(tiers_doc, dict) or not tiers_doc:
        raise SpecError(f"{source}: tiers: expected a non-empty mapping of tier name to objectives")
    tiers = {name: _tier(name, body, f"{source}: tiers") for name, body in tiers_doc.items()}
    default = doc["default_tier"]
    if default not in tiers:
        raise SpecError(f"{source}: default_tier: {default!r} is not one of the tiers ({', '.join(tiers)})")
    resolution = parse_duration(doc.get("resolution", "10s"), f"{source}: resolution")
    window = parse_duration(doc.get("window", "30d"), f"{source}: window")
    if resolution < 1:
        raise SpecError(f"{source}: resolution: expected at least 1s; got {doc.get('resolution')!r}")
    return SloSpec(default, tiers, window, resolution, source)


def load_spec(path: str | Path | None) -> SloSpec:
    """Load a spec file, or the built-in default spec (docs/slo-spec.md) when path is None."""
    if path is None:
        return parse_spec(DEFAULT_SPEC_YAML, "<built-in>")
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the SLO spec: {exc.strerror}") from None
    return parse_spec(text, str(path))
