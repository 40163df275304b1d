"""The SLO spec (docs/slo-spec.md): loading and validation with errors that name file, key and expectation.

Besides tiers and objectives, a spec may set the physical layer's alert thresholds (`physical_limits`) and
declare causes of its own and any OTLP metric as evidence for a cause (`causes`, `evidence`); errors in those
also name the YAML line."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from sloscope import catalog, taxonomy, yaml_config

from sloscope.durations import parse_duration
from sloscope.errors import ConfigError, read_config_text
from sloscope.yaml_config import at, key_at

TIER_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_SERVICE_NAME = 253  # as the receiver bounds the service names it stores

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


SPEC_REQUIRED = ("default_tier", "tiers")
SPEC_OPTIONAL = ("window", "resolution", "physical_limits", "causes", "evidence")


class SpecError(ConfigError):
    """A spec that cannot be used; the message says where and what was expected."""


# An inference request's token objectives (docs/slo-spec.md), beside latency: time to first token, time per output
# token and time in the queue, each judged on the requests whose spans give it (receiver/token_timings.py).
TOKEN_SLIS = ("ttft", "tpot", "queue")
TOKEN_NAMES = {"ttft": "time to first token", "tpot": "time per output token", "queue": "queue time"}


@dataclass(frozen=True)
class TokenObjective:
    """A tier's objective on one of TOKEN_SLIS: that time at `percentile` no more than `threshold_ms`."""

    sli: str
    percentile: float
    threshold_ms: float

    @property
    def allowance(self) -> float:
        """The share of requests the percentile allows above the threshold (p95: 0.05)."""
        return 1.0 - self.percentile / 100.0


@dataclass(frozen=True)
class TierObjective:
    name: str
    percentile: float
    threshold_ms: float
    availability: float  # percent
    # Where given, the services the tier is judged at instead of its traces' entry (docs/tiers.md), each with its
    # own percentile, threshold_ms and availability (the tier's where it gives none).
    services: tuple["ServiceObjective", ...] = ()
    tokens: tuple[TokenObjective, ...] = ()  # in TOKEN_SLIS order, those the tier gives

    def token(self, sli: str) -> TokenObjective | None:
        return next((t for t in self.tokens if t.sli == sli), None)

    @property
    def error_budget(self) -> float:
        return 1.0 - self.availability / 100.0

    def at(self, service: str) -> "TierObjective":
        """The objective a service is judged by in this tier: its own where the spec gives one, else the tier's."""
        own = next((s for s in self.services if s.service == service), None)
        return self if own is None else replace(self, percentile=own.percentile, threshold_ms=own.threshold_ms,
                                                availability=own.availability, services=())


@dataclass(frozen=True)
class ServiceObjective:
    """A service a tier is judged at, with its own objective."""

    service: str
    percentile: float
    threshold_ms: float
    availability: float  # percent


@dataclass(frozen=True)
class PhysicalLimits:
    """The physical layer's alert thresholds (alerts/node_rules.py), in the units the alerts compare: ratios and
    seconds. The defaults are the field's; a fleet whose hardware or load differs sets its own in the spec."""

    gpu_utilization: float = 0.8
    nvme_temperature_c: float = 65.0
    spdk_bdev_wait_s: float = 0.005
    spdk_reactor_busy: float = 0.7
    node_error_ratio: float = 0.05

    def seed_levels(self) -> dict[str, float]:
        """The limits that are also the taxonomy's seed thresholds (a level harmful by itself), by signal."""
        return {"sloscope.nvme.temperature": self.nvme_temperature_c, "spdk.bdev.io.wait": self.spdk_bdev_wait_s,
                "spdk.reactor.busy": self.spdk_reactor_busy}


@dataclass(frozen=True)
class SloSpec:
    default_tier: str
    tiers: dict[str, TierObjective]
    window_s: float
    resolution_s: float
    source: str = "<built-in>"
    taxonomy: taxonomy.Taxonomy = taxonomy.BUILT_IN  # the built-in causes with what the spec declares
    physical_limits: PhysicalLimits = PhysicalLimits()


def _number(value, where: str, low: float, high: float, *, open_low=False, open_high=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SpecError(f"{where}: expected a number; got {value!r}")
    too_low = value <= low if open_low else value < low
    too_high = value >= high if open_high else value > high
    if too_low or too_high:
        lo, hi = ("(" if open_low else "[") + str(low), str(high) + (")" if open_high else "]")
        raise SpecError(f"{where}: expected a number in {lo}, {hi}; got {value!r}")
    return float(value)


def _mapping(value, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(required or optional)}; "
                        f"got {type(value).__name__}")
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
    body = _mapping(body, f"{where}.{name}", ("latency", "availability"), ("services", *TOKEN_SLIS))
    latency = _mapping(body["latency"], f"{where}.{name}.latency", ("percentile", "threshold_ms"))
    tier = TierObjective(
        name=name,
        percentile=_percentile(latency["percentile"], f"{where}.{name}.latency.percentile"),
        threshold_ms=_threshold(latency["threshold_ms"], f"{where}.{name}.latency.threshold_ms"),
        availability=_availability(body["availability"], f"{where}.{name}.availability"),
        tokens=tuple(_token(sli, body[sli], f"{where}.{name}.{sli}") for sli in TOKEN_SLIS if sli in body),
    )
    if "services" not in body:
        return tier
    return replace(tier, services=_services(tier, body["services"], f"{where}.{name}.services"))


def _token(sli: str, body, where: str) -> TokenObjective:
    body = _mapping(body, where, ("percentile", "threshold_ms"))
    return TokenObjective(sli, _percentile(body["percentile"], f"{where}.percentile"),
                          _threshold(body["threshold_ms"], f"{where}.threshold_ms"))


def _percentile(value, where: str) -> float:
    return _number(value, where, 0, 100, open_low=True, open_high=True)


def _threshold(value, where: str) -> float:
    return _number(value, where, 0, 1e9, open_low=True)


def _availability(value, where: str) -> float:
    return _number(value, where, 0, 100, open_low=True, open_high=True)


def _services(tier: TierObjective, body, where: str) -> tuple[ServiceObjective, ...]:
    """A tier's `services`: service name -> its own percentile, threshold_ms and availability, each optional (null
    or {} keeps the tier's)."""
    if not isinstance(body, dict) or not body:
        raise SpecError(f"{where}: expected a non-empty mapping of service name to its objective ({{}} for the "
                        "tier's)")
    out = []
    for service, own in body.items():
        if not isinstance(service, str) or not service or len(service) > MAX_SERVICE_NAME:
            raise SpecError(f"{where}: expected service names of 1 to {MAX_SERVICE_NAME} characters; got "
                            f"{service!r}")
        own = _mapping({} if own is None else own, f"{where}.{service}", (),
                       ("percentile", "threshold_ms", "availability"))
        out.append(ServiceObjective(
            service, _percentile(own.get("percentile", tier.percentile), f"{where}.{service}.percentile"),
            _threshold(own.get("threshold_ms", tier.threshold_ms), f"{where}.{service}.threshold_ms"),
            _availability(own.get("availability", tier.availability), f"{where}.{service}.availability")))
    return tuple(out)


def parse_spec(text: str, source: str = "<string>") -> SloSpec:
    doc = _mapping(yaml_config.parse(text, source, SpecError), source, SPEC_REQUIRED, SPEC_OPTIONAL)
    tiers_doc = doc["tiers"]
    if not isinstance(tiers_doc, dict) or not tiers_doc:
        raise SpecError(f"{source}: tiers: expected a non-empty mapping of tier name to objectives")
    tiers = {name: _tier(name, body, f"{source}: tiers") for name, body in tiers_doc.items()}
    default = doc["default_tier"]
    if default not in tiers:
        raise SpecError(f"{source}: default_tier: {default!r} is not one of the tiers ({', '.join(tiers)})")
    try:
        resolution = parse_duration(doc.get("resolution", "10s"), f"{source}: resolution")
        window = parse_duration(doc.get("window", "30d"), f"{source}: window")
    except ConfigError as exc:  # a spec's callers catch SpecError
        raise SpecError(str(exc)) from None
    if resolution < 1:
        raise SpecError(f"{source}: resolution: expected at least 1s; got {doc.get('resolution')!r}")
    limits = _physical_limits(doc, source)
    known = _declared_taxonomy(doc, source)
    if "physical_limits" in doc:
        known = known.with_seed_levels(limits.seed_levels())
    return SloSpec(default, tiers, window, resolution, source, known, limits)


def load_spec(path: str | Path | None) -> SloSpec:
    """Load a spec file, or the built-in default spec (docs/slo-spec.md) when path is None."""
    if path is None:
        return parse_spec(DEFAULT_SPEC_YAML, "<built-in>")
    return parse_spec(read_config_text(path, "SLO spec", SpecError), str(path))


# --- physical limits ------------------------------------------------------------------------------------------------

# Percent keys, as `availability` is written: key -> (field, lowest percent). 100 is a level no ratio exceeds, so
# it silences the alert. Below 10 % busy is no saturation, and the floor refuses a ratio written by mistake (0.95
# would otherwise drain every GPU above 0.95 % busy).
PERCENT_LIMITS = {"gpu_utilization_percent": ("gpu_utilization", 10),
                  "spdk_reactor_busy_percent": ("spdk_reactor_busy", 10),
                  "node_error_percent": ("node_error_ratio", 0)}
NVME_TEMPERATURE_CEILING_C = 150  # above any drive's operating range: a larger number is in kelvin or Fahrenheit
# A wait past the kernel's NVMe I/O timeout (nvme_core.io_timeout, 30 s) is a failed I/O, not a slow one.
SPDK_BDEV_WAIT_CEILING_S = 30
PHYSICAL_LIMIT_KEYS = ("gpu_utilization_percent", "nvme_temperature_c", "spdk_bdev_wait",
                       "spdk_reactor_busy_percent", "node_error_percent")


def _bdev_wait(value, where: str) -> float:
    try:
        seconds = parse_duration(value, where)
    except ConfigError as exc:  # a spec's callers catch SpecError
        raise SpecError(str(exc)) from None
    if seconds > SPDK_BDEV_WAIT_CEILING_S:
        raise SpecError(f"{where}: expected a duration of at most {SPDK_BDEV_WAIT_CEILING_S}s (the NVMe I/O "
                        f"timeout); got {value!r}")
    return seconds


def _percent(value, where: str, lowest: float) -> float:
    """A percent limit as the ratio the alert compares."""
    try:
        return _number(value, where, lowest, 100, open_low=lowest == 0) / 100
    except SpecError as exc:
        raise SpecError(f"{exc} (a percent, as availability is written: 95 for 95 %)") from None


def _physical_limits(doc: dict, source: str) -> PhysicalLimits:
    """The spec's `physical_limits`, each key defaulting to the field's threshold."""
    if "physical_limits" not in doc:
        return PhysicalLimits()
    body = _mapping(doc["physical_limits"], f"{at(source, doc, 'physical_limits')}: physical_limits", (),
                    PHYSICAL_LIMIT_KEYS)
    where = {key: f"{at(source, body, key)}: physical_limits.{key}" for key in body}
    limits = {PERCENT_LIMITS[key][0]: _percent(value, where[key], PERCENT_LIMITS[key][1])
              for key, value in body.items() if key in PERCENT_LIMITS}
    if "nvme_temperature_c" in body:
        limits["nvme_temperature_c"] = _number(body["nvme_temperature_c"], where["nvme_temperature_c"], 0,
                                               NVME_TEMPERATURE_CEILING_C, open_low=True)
    if "spdk_bdev_wait" in body:
        limits["spdk_bdev_wait_s"] = _bdev_wait(body["spdk_bdev_wait"], where["spdk_bdev_wait"])
    return PhysicalLimits(**limits)


# --- declared causes and evidence -----------------------------------------------------------------------------------

CAUSE_ID = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# An OpenTelemetry instrument name (a letter, then letters, digits, _ . - /; at most 255) or a Prometheus metric
# name (letters, digits, _ and :, not starting with a digit), as a receiver passes either on.
METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_.:/-]{0,254}$")
DIRECTIONS = tuple(d.value for d in catalog.Direction)


def _text(body: dict, key: str, where: str) -> str:
    value = body[key]
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}: {key}: expected a non-empty string; got {value!r}")
    return value


def _finite(body: dict, key: str, where: str, low: float = -math.inf) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        bound = f" of at least {low:g}" if low > -math.inf else ""
        raise SpecError(f"{where}: {key}: expected a number{bound}; got {value!r}")
    return float(value)


def _declared_cause(cause_id, body, source: str, causes: dict) -> taxonomy.Cause:
    where = f"{at(source, causes, cause_id)}: causes.{cause_id}"
    if not isinstance(cause_id, str) or not CAUSE_ID.match(cause_id):
        raise SpecError(f"{where}: cause ids are lower-case [a-z0-9_], starting with a letter; got {cause_id!r}")
    if cause_id in taxonomy.BY_ID:
        raise SpecError(f"{where}: {cause_id!r} is a built-in cause (docs/taxonomy.md); declare evidence for it "
                        "under evidence: without defining it again")
    body = _mapping(body, where, ("layer", "physical", "remediation"), ("explained_by",))
    remediation = _text(body, "remediation", where)
    try:
        remediation.format(node="NODE")
    except (KeyError, IndexError, ValueError):
        raise SpecError(f"{at(source, body, 'remediation')}: causes.{cause_id}.remediation: only {{node}} may "
                        f"stand in braces; got {remediation!r}") from None
    explained_by = body.get("explained_by", [])
    if not isinstance(explained_by, list) or not all(isinstance(c, str) for c in explained_by):
        raise SpecError(f"{at(source, body, 'explained_by')}: causes.{cause_id}.explained_by: expected a list of "
                        f"cause ids; got {explained_by!r}")
    return taxonomy.Cause(cause_id, _text(body, "layer", where), (), _text(body, "physical", where), remediation,
                          explained_by=tuple(explained_by))


def _where(body: dict, where: str) -> tuple[tuple[str, str], ...]:
    restriction = body.get("where", {})
    if not isinstance(restriction, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
            for k, v in restriction.items()):
        raise SpecError(f"{where}: where: expected a mapping of attribute name to a string or integer value; "
                        f"got {restriction!r}")
    return tuple(sorted((k, str(v)) for k, v in restriction.items()))


def _declared_evidence(n: int, body, source: str, known: dict, seen: dict) -> tuple:
    """(cause id, evidence, seed threshold or None, declared signal) of the n-th evidence item."""
    where = f"{at(source, body)}: evidence[{n}]"
    body = _mapping(body, where, ("metric", "cause", "harmful"), ("threshold", "noise_floor", "where"))
    metric, cause_id = body["metric"], body["cause"]
    named = key_at(source, body, "metric", f"evidence[{n}].metric")
    if not isinstance(metric, str) or not METRIC_NAME.match(metric):
        raise SpecError(f"{named}: {metric!r} is not a valid OTLP or Prometheus metric name")
    if metric in taxonomy.BUILT_IN.evidence_signals:
        raise SpecError(f"{named}: {metric!r} is a catalog signal that a built-in cause reads already "
                        "(docs/catalog.md, docs/taxonomy.md)")
    if cause_id not in known:
        raise SpecError(f"{at(source, body, 'cause')}: evidence[{n}].cause: unknown cause {cause_id!r}: define it "
                        f"under causes: (layer, physical, remediation), or use one of {', '.join(known)}")
    if body["harmful"] not in DIRECTIONS:
        raise SpecError(f"{at(source, body, 'harmful')}: evidence[{n}].harmful: expected up or down; got "
                        f"{body['harmful']!r}")
    if (metric, cause_id) in seen:
        raise SpecError(f"{named}: {metric!r} is declared for {cause_id} twice (first on line "
                        f"{seen[metric, cause_id]})")
    seen[metric, cause_id] = body.line_of("metric")
    threshold = _finite(body, "threshold", f"{at(source, body, 'threshold')}: evidence[{n}]") \
        if "threshold" in body else None
    floor = _finite(body, "noise_floor", f"{at(source, body, 'noise_floor')}: evidence[{n}]", 0.0) \
        if "noise_floor" in body else 0.0
    ev = taxonomy.Evidence(metric, _where(body, f"{at(source, body, 'where')}: evidence[{n}]"),
                           producer=taxonomy.SPEC_PRODUCER, measure=metric)
    return cause_id, ev, threshold, taxonomy.DeclaredSignal(metric, catalog.Direction(body["harmful"]), floor)


def _declared_taxonomy(doc: dict, source: str) -> taxonomy.Taxonomy:
    """The built-in taxonomy with the spec's `causes` and `evidence`; SpecError names the line of anything wrong."""
    if "causes" not in doc and "evidence" not in doc:
        return taxonomy.BUILT_IN
    causes_doc, items = doc.get("causes", {}), doc.get("evidence", [])
    if not isinstance(causes_doc, dict):
        raise SpecError(f"{at(source, doc, 'causes')}: causes: expected a mapping of cause id to its definition")
    if not isinstance(items, list) or not items:
        raise SpecError(f"{at(source, doc, 'evidence')}: evidence: expected a non-empty list of declared metrics")
    new = [_declared_cause(cause_id, body, source, causes_doc) for cause_id, body in causes_doc.items()]
    known = {**taxonomy.BY_ID, **{c.id: c for c in new}}
    seen: dict = {}
    declared = [_declared_evidence(n, body, source, known, seen) for n, body in enumerate(items)]
    signals: dict[str, taxonomy.DeclaredSignal] = {}
    for (cause_id, ev, _, signal), body in zip(declared, items):
        first = signals.setdefault(signal.name, signal)
        if first != signal:
            raise SpecError(f"{at(source, body, 'harmful')}: evidence: {signal.name!r} is declared with two "
                            "readings; its harmful direction and noise_floor must be the same for every cause")
    for cause in new:
        unknown = [c for c in cause.explained_by if c not in known]
        if unknown:
            raise SpecError(f"{at(source, causes_doc[cause.id], 'explained_by')}: causes.{cause.id}.explained_by: "
                            f"unknown cause {unknown[0]!r}")
        if not any(cause_id == cause.id for cause_id, *_ in declared):
            raise SpecError(f"{at(source, causes_doc, cause.id)}: causes.{cause.id}: no evidence names it, so it "
                            "could never be found; declare a metric for it under evidence:")
    return taxonomy.declared(tuple(new), tuple((c, ev, t) for c, ev, t, _ in declared), tuple(signals.values()))

