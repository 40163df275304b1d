"""A head sampler for Python services: the adaptive policy of `sloscope serve` (GET /sampling), applied with
OpenTelemetry's consistent probability sampling, so that every service of a trace agrees.

    from opentelemetry.sdk.trace import TracerProvider
    from sloscope.sampling.head_sampler import AdaptiveSampler
    provider = TracerProvider(sampler=AdaptiveSampler("http://sloscope-serve:4318/sampling", service="llm-gateway"))

Threshold math (OpenTelemetry "TraceState: Probability Sampling"):
- randomness R: the trace id's last 7 bytes (56 bits), or the `rv` sub-key of the `ot` tracestate entry when the
  parent carries one;
- rejection threshold T = round((1 - p) * 2**56), in [0, 2**56 - 1]; a span is kept iff R >= T, so a lower
  probability keeps a subset of the traces a higher one keeps, and two samplers with the same T keep exactly the
  same trace ids;
- T travels as `ot=th:HEX` (the 14 hex digits of T with trailing zeros removed; `th:0` is 100 %).

Per span: a local parent decides for its children (the decision is per service entry, not per span). For a span
that starts a trace or continues a remote one, the sampler looks up its own threshold for (tier, service, route),
where the tier comes from the span's `http.request.header.x-slo-tier` or `slo.tier` attribute, resolved through the
policy's allow-list (an unknown, forged, empty or oversized value is the default tier: a client cannot buy 100 %).
A remote parent that was not sampled stays unsampled; a sampled one with `th` decides for the trace: its
threshold T_parent is kept, whatever this service's own (without `th`, e.g. from a sampler that does not write it,
T_own alone). A trace's tier is its entry's (docs/traces.md): deeper services see no header and would otherwise
sample at the default tier's rate, keeping half of what the entry kept. So a kept trace is kept whole, from the
root down. A dropped span passes the caller's tracestate on without `th`.

The policy is fetched by a daemon thread every `refresh_s`; decisions only read a precomputed table (one dict
lookup per level, prebuilt SamplingResult objects), never the network. When the policy is unreachable the last
one fetched stays in force for `stale_after_s` (default 5 minutes); before the first fetch and after that, every
tier is sampled at the fixed `fallback_probability` (default 10 %), as a consistent threshold.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from sloscope.enrich.tiers import TierResolver
from sloscope.catalog import TIER_HEADER_ATTRIBUTE, TIER_ISTIO_TAG

log = logging.getLogger("sloscope.head_sampler")

MAX_THRESHOLD = 1 << 56  # 2**56: thresholds and randomness are 56-bit
RANDOM_MASK = MAX_THRESHOLD - 1
TH_DIGITS = 14
_TH = re.compile(r"^[0-9a-f]{1,14}$")
DEFAULT_URL = "http://127.0.0.1:4318/sampling"
FALLBACK_PROBABILITY = 0.1
ROUTE_ATTRIBUTE = "http.route"
OT_CACHE_SIZE = 4096  # distinct `ot` tracestate values remembered (parsed, and the results built from them)


# --- threshold math ----------------------------------------------------------------------------------------

def threshold_for(probability: float) -> int:
    """The rejection threshold of a sampling probability: keep iff R >= T. Probabilities below 2**-56 (including
    0) are raised to 2**-56, the smallest the encoding can express."""
    if not probability == probability:  # NaN
        raise ValueError("probability is NaN")
    if probability >= 1.0:
        return 0
    kept = round(probability * MAX_THRESHOLD)
    return MAX_THRESHOLD - max(kept, 1)


def probability_of(threshold: int) -> float:
    return (MAX_THRESHOLD - threshold) / MAX_THRESHOLD


def encode_th(threshold: int) -> str:
    """The `th` value: 14 hex digits, trailing zeros removed ("0" for 100 %)."""
    if not 0 <= threshold < MAX_THRESHOLD:
        raise ValueError(f"threshold out of range: {threshold}")
    return f"{threshold:014x}".rstrip("0") or "0"


def decode_th(text: str) -> int:
    """A `th` value back to its threshold; ValueError for anything but 1-14 lower-case hex digits."""
    if not isinstance(text, str) or not _TH.match(text):
        raise ValueError(f"not a th value: {text!r}")
    return int(text, 16) << (4 * (TH_DIGITS - len(text)))


def parse_ot(value: str) -> tuple[int | None, int | None]:
    """(threshold, randomness) from the value of an `ot` tracestate entry (e.g. "th:c;rv:9b8233f7e3a151");
    either is None when absent or malformed."""
    th = rv = None
    for member in value.split(";"):
        key, _, val = member.partition(":")
        if key == "th":
            try:
                th = decode_th(val)
            except ValueError:
                th = None
        elif key == "rv" and len(val) == TH_DIGITS:
            try:
                rv = int(val, 16)
            except ValueError:
                rv = None
    return th, rv


def with_th(value: str | None, th: str) -> str:
    """The `ot` entry's value with its th sub-key set to `th`, the other sub-keys kept."""
    if not value:
        return f"th:{th}"
    members = [m for m in value.split(";") if m and not m.startswith("th:")]
    return ";".join([f"th:{th}", *members])


# --- the decision table ------------------------------------------------------------------------------------

_DROP = SamplingResult(Decision.DROP)
_EMPTY = TraceState()


class _Entry:
    """One key's threshold with its prebuilt results."""

    __slots__ = ("threshold", "th", "keep")

    def __init__(self, threshold: int):
        self.threshold = threshold
        self.th = encode_th(threshold)
        self.keep = SamplingResult(Decision.RECORD_AND_SAMPLE, None, TraceState([("ot", f"th:{self.th}")]))


class _Table:
    """Everything should_sample needs for one service, built once per fetched policy."""

    __slots__ = ("tiers", "resolver", "by_raw", "default", "source", "hot_node")

    def __init__(self, tiers: dict[str, tuple[_Entry, dict[str, _Entry]]], default_tier: str, source: str,
                 hot_node: bool = False):
        self.tiers = tiers
        self.default = tiers[default_tier]
        self.resolver = TierResolver(frozenset(tiers), default_tier)
        # exact allowed values resolve with one dict lookup; anything else goes through the resolver (counted)
        self.by_raw = {name: entry for name, entry in tiers.items()}
        self.source = source
        self.hot_node = hot_node

    @classmethod
    def fixed(cls, probability: float, source: str) -> "_Table":
        entry = _Entry(threshold_for(probability))
        return cls({"": (entry, {})}, "", source)

    @classmethod
    def from_policy(cls, policy: dict, service: str, node: str | None) -> "_Table":
        """Validate a GET /sampling document and take the thresholds of `service` (else the tier's)."""
        if not isinstance(policy, dict) or not isinstance(policy.get("tiers"), dict) or not policy["tiers"]:
            raise ValueError("policy without tiers")
        default_tier = policy.get("default_tier")
        if default_tier not in policy["tiers"]:
            raise ValueError(f"default_tier {default_tier!r} is not one of the policy's tiers")
        hot_nodes = policy.get("hot_nodes") or {}
        hot_node = node is not None and isinstance(hot_nodes, dict) and node in hot_nodes
        cache: dict[int, _Entry] = {}

        def entry(doc) -> _Entry:
            if not isinstance(doc, dict):
                raise ValueError("policy entry is not an object")
            threshold = 0 if hot_node else decode_th(doc.get("th"))
            if threshold not in cache:
                cache[threshold] = _Entry(threshold)
            return cache[threshold]

        tiers = {}
        for name, tier_doc in policy["tiers"].items():
            if not isinstance(name, str) or not isinstance(tier_doc, dict):
                raise ValueError("malformed tier in policy")
            services = tier_doc.get("services") or {}
            service_doc = services.get(service) if isinstance(services, dict) else None
            if isinstance(service_doc, dict):
                routes = service_doc.get("routes") or {}
                tiers[name] = (entry(service_doc), {str(r): entry(d) for r, d in routes.items()}
                               if isinstance(routes, dict) else {})
            else:
                tiers[name] = (entry(tier_doc), {})
        return cls(tiers, default_tier, "policy", hot_node)


def _decide(own: int, trace_id: int, state: TraceState, ot: str | None) -> SamplingResult:
    """The general case of a sampled remote parent with tracestate."""
    randomness, threshold = trace_id & RANDOM_MASK, own
    if ot:
        parent_th, rv = parse_ot(ot)
        if rv is not None:
            randomness = rv
        if parent_th is not None and randomness >= parent_th:  # an inconsistent th is ignored
            threshold = parent_th
    if randomness < threshold:
        return _dropped(state, ot)
    return SamplingResult(Decision.RECORD_AND_SAMPLE, None, state.update("ot", with_th(ot, encode_th(threshold))))


def _plan(ot: str, own: int) -> tuple:
    """(parent threshold, rv, combined threshold, keep result, drop result) for a tracestate of only `ot=...`."""
    parent_th, rv = parse_ot(ot)
    threshold = own if parent_th is None else parent_th
    keep = SamplingResult(Decision.RECORD_AND_SAMPLE, None, TraceState([("ot", with_th(ot, encode_th(threshold)))]))
    return parent_th, rv, threshold, keep, _dropped(TraceState([("ot", ot)]), ot)


def _dropped(state: TraceState, ot: str | None) -> SamplingResult:
    if not ot:
        return SamplingResult(Decision.DROP, None, state)
    rest = ";".join(m for m in ot.split(";") if m and not m.startswith("th:"))
    if rest:
        return SamplingResult(Decision.DROP, None, state.update("ot", rest))
    remaining = state.delete("ot")
    return SamplingResult(Decision.DROP, None, remaining) if len(remaining) else _DROP


class AdaptiveSampler(Sampler):
    """OpenTelemetry SDK sampler following the adaptive policy served at `url` (see the module doc)."""

    def __init__(self, url: str | None = None, *, service: str | None = None, node: str | None = None,
                 refresh_s: float = 10.0, timeout_s: float = 2.0, stale_after_s: float = 300.0,
                 fallback_probability: float = FALLBACK_PROBABILITY, start: bool = True,
                 clock=time.monotonic):
        self.url = url or os.environ.get("SLOSCOPE_SAMPLING_URL", DEFAULT_URL)
        self.service = service or os.environ.get("OTEL_SERVICE_NAME", "unknown_service")
        self.node = node or os.environ.get("K8S_NODE_NAME") or os.environ.get("NODE_NAME") or socket.gethostname()
        self.refresh_s, self.timeout_s, self.stale_after_s = refresh_s, timeout_s, stale_after_s
        self.fallback_probability = fallback_probability
        self.clock = clock
        self._fallback = _Table.fixed(fallback_probability, "fallback")
        self._table = self._fallback
        self._fetched_at: float | None = None
        self._policy: dict | None = None
        self._plans: dict[tuple[str, int], tuple] = {}
        self.fetch_errors = 0
        self._reachable = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="sloscope-sampling-policy", daemon=True)
            self._thread.start()

    # --- policy refresh ---------------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Fetch the policy once; True when it was fetched and is now in force. On failure the last policy stays
        until it is `stale_after_s` old, then the fixed fallback applies."""
        try:
            request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read(8 << 20)
            policy = json.loads(body)
            table = _Table.from_policy(policy, self.service, self.node)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self.fetch_errors += 1
            if self._reachable:
                log.warning("sampling policy at %s unavailable (%s); keeping the last one for %.0fs, then %.0f%%",
                            self.url, exc, self.stale_after_s, 100 * self.fallback_probability)
            self._reachable = False
            if self._fetched_at is None or self.clock() - self._fetched_at > self.stale_after_s:
                self._table = self._fallback
            return False
        if not self._reachable:
            log.info("sampling policy at %s is back", self.url)
        self._reachable = True
        self._policy = policy
        self._fetched_at = self.clock()
        self._table = table
        refresh = policy.get("refresh_s")
        if isinstance(refresh, (int, float)) and 1 <= refresh <= 600:
            self.refresh_s = float(refresh)
        return True

    def load(self, policy: dict) -> None:
        """Put a policy document in force directly (as if fetched); ValueError when it is malformed."""
        self._table = _Table.from_policy(policy, self.service, self.node)
        self._policy = policy
        self._fetched_at = self.clock()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)

    @property
    def source(self) -> str:
        """"policy" while a fetched policy is in force, else "fallback"."""
        return self._table.source

    @property
    def policy(self) -> dict | None:
        return self._policy

    def tier_counts(self) -> dict[str, int]:
        """Tier values that were missing or not allowed, as the resolver counted them (current policy)."""
        return dict(self._table.resolver.counts)

    # --- the decision -----------------------------------------------------------------------------------------

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        parent_state = None
        if parent.is_valid:
            if not parent.is_remote:  # in-process child: the service's entry span decided
                if parent.trace_flags.sampled:
                    return SamplingResult(Decision.RECORD_AND_SAMPLE, None, parent.trace_state)
                return SamplingResult(Decision.DROP, None, parent.trace_state) if parent.trace_state else _DROP
            if not parent.trace_flags.sampled:  # a caller that did not keep the trace: keep nothing of it
                return SamplingResult(Decision.DROP, None, parent.trace_state) if parent.trace_state else _DROP
            parent_state = parent.trace_state
        table = self._table
        tier = table.default
        if attributes:
            raw = attributes.get(TIER_HEADER_ATTRIBUTE)
            if raw is None:
                raw = attributes.get(TIER_ISTIO_TAG)
            if raw is not None:
                tier = table.by_raw.get(raw) if raw.__class__ is str else None
                if tier is None:
                    tier = table.tiers.get(table.resolver.resolve(raw), table.default)
            entry = tier[0]
            if tier[1]:
                route = attributes.get(ROUTE_ATTRIBUTE)
                if route.__class__ is str:
                    entry = tier[1].get(route, entry)
        else:
            entry = tier[0]
        if not parent_state:  # a root, or a remote parent without tracestate
            return entry.keep if (trace_id & RANDOM_MASK) >= entry.threshold else _DROP
        return self._continue(entry, trace_id, parent_state)

    def _continue(self, entry: _Entry, trace_id: int, state: TraceState) -> SamplingResult:
        """A sampled remote parent with tracestate: its th (if consistent with the randomness) and rv count. The
        common case, a tracestate holding only the `ot` entry, is planned once per (ot value, own threshold)."""
        ot = state.get("ot")
        if ot is not None and len(state) == 1:
            plan = self._plans.get((ot, entry.threshold))
            if plan is None:
                if len(self._plans) >= OT_CACHE_SIZE:
                    self._plans.clear()
                plan = self._plans[(ot, entry.threshold)] = _plan(ot, entry.threshold)
            parent_th, rv, threshold, keep, drop = plan
            randomness = (trace_id & RANDOM_MASK) if rv is None else rv
            if parent_th is None or randomness >= parent_th:
                return keep if randomness >= threshold else drop
        return _decide(entry.threshold, trace_id, state, ot)

    def get_description(self) -> str:
        return f"SloscopeAdaptiveSampler{{{self.url},service={self.service}}}"
