"""Which metrics sloscope keeps, and how, by name: the contract between the decoders that read OTLP
(sloscope.receiver) and the ClickHouse store, which applies the same rules in SQL to the rows the Collector's
ClickHouse exporter wrote. A rule follows from the catalog's signal (sloscope/catalog.py); a metric an SLO spec
declares as evidence gets the rule of its family, or a plain one."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from sloscope import catalog


# A value outside its metric's range is no measurement of it, and sums and rates of it could overflow: beyond what
# OTLP's 64-bit asInt holds, or for a ratio (unit 1) or a percentage far outside [0, 1] or [0, 100].
VALUE_LIMIT = float(2**63)
UNIT_RANGES = {"1": (-1.0, 2.0), "%": (-100.0, 200.0)}


@dataclass(frozen=True)
class MetricRule:
    """How the decoders keep the data points of one metric name (see catalog.Signal)."""

    counter: bool = False  # a catalog counter: its sums are read as counters, whatever their monotonicity
    resource_attributes: tuple[str, ...] = ()  # resource attributes kept among each point's attributes
    node_attribute: str = ""  # a point attribute naming the node where the resource names none
    blank_from: float = math.inf  # values from here up are no measurement
    dropped_attributes: frozenset[str] = frozenset()  # point attributes not kept (catalog.Signal says why)
    # Explicit-bucket histograms are kept only where the catalog's signal says its producers write them (the inference
    # engines' Prometheus histograms) and for declared metrics: sloscope's own histograms are exponential.
    explicit_histograms: bool = False
    low: float = -VALUE_LIMIT  # the values kept lie strictly between low and high
    high: float = VALUE_LIMIT

    def reads_as_level(self, is_sum: bool, monotonic: bool, cumulative: bool) -> bool:
        """Whether a sum is a level: a cumulative sum that is not monotonic is an up-down counter (connections
        open), whose value is what is measured, not an increase."""
        return is_sum and cumulative and not monotonic and not self.counter

    def resource_part(self, resource_attrs: dict) -> dict:
        return {k: v for k in self.resource_attributes if isinstance(v := resource_attrs.get(k), str) and v}


def _catalog_rule(s: catalog.Signal) -> MetricRule:
    low, high = UNIT_RANGES.get(s.unit, (-VALUE_LIMIT, VALUE_LIMIT))
    return MetricRule(s.instrument is catalog.Instrument.COUNTER, s.resource_attributes, s.node_attribute,
                      s.blank_from, frozenset(s.dropped_attributes), s.explicit_buckets, low, high)


_CATALOG_RULES = {s.name: _catalog_rule(s) for s in catalog.SIGNALS if not s.derived}
# The family of metrics named by a prefix whose every member a spec may declare, read by one rule:
# dcgm-exporter's fields, placed, filtered and keyed as the catalog's DCGM fields are.
FAMILY_PREFIX = catalog.DCGM_PREFIX
FAMILY_RULE = MetricRule(node_attribute=catalog.DCGM_NODE_LABEL, blank_from=catalog.DCGM_BLANK_FROM,
                         dropped_attributes=frozenset(catalog.DCGM_TENANT_LABELS), explicit_histograms=True)


def kept_metrics(declared: Iterable[str] = ()) -> dict[str, MetricRule]:
    """What the decoders keep, by metric name: the catalog's signals and the `declared` ones (the metrics an SLO
    spec declares as evidence); every other metric is skipped (points_not_in_catalog)."""
    rules = dict(_CATALOG_RULES)
    for name in declared:
        rules.setdefault(name, FAMILY_RULE if name.startswith(FAMILY_PREFIX) else MetricRule(explicit_histograms=True))
    return rules
