"""The adaptive sampling config (`sampling --config`, `serve --sampling`), read strictly (sloscope/yaml_config.py).
Apart from the policy (sampling/policy.py), which reads a store, so that a config can be checked where the
server's packages are not installed (`sloscope validate` on a node).

    budget_spans_per_s: 100     # kept request spans per second outside hot tiers and nodes
    dwell: 2m                   # a hot tier or node stays at 100 % this long after it was last seen hot
    interval: 5s                # evaluation interval (default: the SLO spec's resolution)

and the other keys of SamplingConfig below (durations: dwell, interval, window, sli_window, incident_lookback,
incident_open).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from sloscope import yaml_config
from sloscope.durations import parse_duration
from sloscope.errors import ConfigError, read_config_text
from sloscope.yaml_config import key_at, refuse_unknown_keys


@dataclass(frozen=True)
class SamplingConfig:
    budget_spans_per_s: float = 100.0  # kept request spans per second outside hot tiers and nodes
    min_probability: float = 0.001
    dwell_s: float = 120.0  # a hot tier or node stays at 100 % this long after it was last seen hot
    interval_s: float | None = None  # evaluation interval; None: the SLO spec's resolution
    window_s: float = 60.0  # observed rates
    sli_window_s: float = 60.0  # hot detection: percentile and error ratio over this window
    error_ratio: float = 0.05
    min_requests: int = 10  # in sli_window_s, for a percentile or an error ratio to count
    tolerance: float = 0.05  # relative change of a probability below which it is left alone
    max_increase: float = 2.0  # a probability at most doubles per evaluation
    correction_gain: float = 0.05  # weight of the last interval in the kept-rate bias estimate (0: off)
    incident_lookback_s: float = 600.0
    incident_open_s: float | None = None  # None: two evaluation intervals
    max_routes: int = 50  # per (tier, service); busier routes first, the rest share the service's entry
    max_services: int = 200  # per tier, in the policy document and the tail config

    def interval_for(self, spec) -> float:
        return self.interval_s if self.interval_s is not None else spec.resolution_s

    def open_for(self, spec) -> float:
        return self.incident_open_s if self.incident_open_s is not None else 2 * self.interval_for(spec)


_DURATION_KEYS = {"dwell": "dwell_s", "interval": "interval_s", "window": "window_s", "sli_window": "sli_window_s",
                  "incident_lookback": "incident_lookback_s", "incident_open": "incident_open_s"}


_NUMBER_KEYS = tuple(f.name for f in fields(SamplingConfig) if f.name not in _DURATION_KEYS.values())
CONFIG_KEYS = tuple(sorted((*_NUMBER_KEYS, *_DURATION_KEYS)))


def parse_config(text: str, source: str = "<string>") -> SamplingConfig:
    """The sampling config YAML: budget_spans_per_s, min_probability, error_ratio, min_requests, tolerance,
    max_increase, max_routes, max_services, and durations (10s, 2m) dwell, interval, window, sli_window,
    incident_lookback, incident_open. ConfigError names the file, the line and the key of what is wrong."""
    doc = yaml_config.parse(text, source)
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping")
    refuse_unknown_keys(source, doc, CONFIG_KEYS)
    values = {}
    for key, value in doc.items():
        if key in _DURATION_KEYS:
            values[_DURATION_KEYS[key]] = parse_duration(value, key_at(source, doc, key))
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{key_at(source, doc, key)}: expected a number; got {value!r}")
            values[key] = value
    return validate(SamplingConfig(**values), source, doc)


def validate(config: SamplingConfig, source: str = "<config>", doc=None) -> SamplingConfig:
    """`config`, or ConfigError naming the value out of range, with its line when `doc` is the YAML it came from."""
    checks = [
        ("budget_spans_per_s", config.budget_spans_per_s > 0, "a positive number"),
        ("min_probability", 2 ** -56 <= config.min_probability <= 1, "a number in [2^-56, 1]"),
        ("error_ratio", 0 < config.error_ratio < 1, "a number in (0, 1)"),
        ("min_requests", config.min_requests >= 1, "at least 1"),
        ("tolerance", 0 <= config.tolerance < 1, "a number in [0, 1)"),
        ("max_increase", config.max_increase > 1, "a number above 1"),
        ("correction_gain", 0 <= config.correction_gain <= 1, "a number in [0, 1]"),
        ("max_routes", config.max_routes >= 0, "0 or more"),
        ("max_services", config.max_services >= 0, "0 or more"),
    ]
    for key, ok, expected in checks:
        if not ok:
            raise ConfigError(f"{key_at(source, doc, key)}: expected {expected}; got {getattr(config, key)!r}")
    return config


def load_config(path: str | Path | None) -> SamplingConfig:
    if path is None:
        return SamplingConfig()
    return parse_config(read_config_text(path, "sampling config"), str(path))
