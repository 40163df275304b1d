"""The adaptive sampling policy as an OpenTelemetry Collector `tail_sampling` processor configuration.

The output is a configuration file of its own (`processors: tail_sampling: ...`), for the Collector to merge with
its main one (`otelcol-contrib --config main.yaml --config sampling.yaml`); the main file puts `tail_sampling`
in the traces pipeline that feeds the trace backend. Not in the pipeline that feeds `sloscope serve`: the SLIs
need every request span.

Policies (the processor keeps a trace when any policy samples it):
- `errors`: status_code ERROR;
- per tier and tier attribute: `and` of the tier match and `latency` above the tier's threshold (the trace's
  duration: earliest start to latest end);
- hot tiers: `string_attribute` on each tier attribute with the hot tiers as exact values; hot nodes: on
  `k8s.node.name` and `host.name`;
- the rest: per (tier, service) `and` of the tier match, `service.name` and `probabilistic` at the policy's
  probability, and per tier a catch-all for services the policy does not list (the tier's probability). All
  probabilistic policies share one `hash_salt`, so a trace kept at a lower percentage is kept at every higher one.

Service and node names come from telemetry, so the file is written for the Collector's reading of it: a YAML 1.2
parser (`1e3` or `0o17` unquoted would be numbers), then `${...}` expanded in every string (`${env:X}` would be
replaced, `${http://...}` fetched, an unknown scheme refuse the whole configuration). Every string but a plain
word is therefore double-quoted, every `$` doubled (the Collector's escape for a literal `$`), and a name in the
header comment has its line breaks escaped (a raw one would end the comment and write configuration).

Policy names are made of their parts (prefix, tier, attribute index, service rank, service), each reduced to
`[A-Za-z0-9._-]` and joined with `-`, so contrived names can give two policies the same name (tiers `gold` and
`gold-1` beside a service `other`), and the processor refuses to start with a duplicate policy name. Where names
would be the same, each of them gets `#` and a digest of its parts: `#` is not in the readable alphabet, so such a
name never equals another one, and the digest depends on the policy's own parts, not on the order or number of
the others. Sub-policies of an `and` follow the same rule among themselves.

The tier attributes (`sloscope.catalog.TIER_ATTRIBUTES`) are `http.request.header.x-slo-tier` (Envoy custom tags
send a plain string; the semantic-convention `string[]` form is not matched by string_attribute, which compares
string values only) and `slo.tier` (the Istio custom tag of deploy/istio-telemetry.yaml, a plain string). Only the tiers of the SLO spec are ever
listed as values, and exactly (no regular expressions): a forged header value matches no tier policy, so it is
sampled as the default tier, whose match is "no other tier" (`invert_match` on the other tiers).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import yaml

from sloscope.catalog import NODE_ATTRIBUTES, TIER_ATTRIBUTES

SERVICE_ATTRIBUTE = "service.name"
HASH_SALT = "sloscope-adaptive-sampling"
DEFAULT_DECISION_WAIT_S = 30
MIN_NUM_TRACES = 50_000
NAME_MAX = 120
DISAMBIGUATOR = "#"  # outside the readable alphabet: a disambiguated name never equals a readable one


def _name(*parts: str) -> tuple[str, ...]:
    """A policy's identity while the configuration is built; `_named` makes it the readable, unique name."""
    return parts


def _readable(parts: tuple[str, ...]) -> str:
    text = "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", p) for p in parts if p)
    return text[:NAME_MAX]


def _digests(identities: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Short digests of distinct identities: 8 hex digits, longer only where two of them share those (the full
    SHA-256 of distinct identities is taken to differ)."""
    full = {parts: hashlib.sha256(json.dumps(parts).encode()).hexdigest() for parts in identities}
    size = 8
    while size < 64 and len({digest[:size] for digest in full.values()}) < len(full):
        size *= 2
    return {parts: digest[:size] for parts, digest in full.items()}


def _named(policies: list[dict]) -> list[dict]:
    """Copies of `policies` (and of their `and` sub-policies) with readable names, unique among siblings: a name
    that two or more would share gets `#` and the digest of each one's identity."""
    readable = [_readable(p["name"]) for p in policies]
    shared = {text for text, count in Counter(readable).items() if count > 1}
    digests = _digests([p["name"] for p, text in zip(policies, readable) if text in shared])
    named = []
    for policy, text in zip(policies, readable):
        name = f"{text}{DISAMBIGUATOR}{digests[policy['name']]}" if text in shared else text
        named.append({**policy, "name": name})
        if policy["type"] == "and":  # sub-policy dicts are shared between policies: copied, never renamed in place
            named[-1]["and"] = {"and_sub_policy": _named(policy["and"]["and_sub_policy"])}
    return named


def _string(name: tuple[str, ...], key: str, values: list[str], invert: bool = False) -> dict:
    body = {"key": key, "values": list(values)}
    if invert:
        body["invert_match"] = True
    return {"name": name, "type": "string_attribute", "string_attribute": body}


def _percentage(probability: float) -> float:
    return round(min(max(probability, 0.0), 1.0) * 100.0, 6)


def tier_matchers(policy: dict, tier: str) -> list[list[dict]]:
    """Alternatives (OR) of sub-policy lists (AND) that match traces of `tier`."""
    tiers = list(policy["tiers"])
    if tier != policy["default_tier"]:
        return [[_string(_name("tier", key), key, [tier])] for key in TIER_ATTRIBUTES]
    others = [t for t in tiers if t != tier]
    if not others:
        return [[]]
    return [[_string(_name("not-other-tier", key), key, others, invert=True) for key in TIER_ATTRIBUTES]]


def _and(name: tuple[str, ...], subs: list[dict]) -> dict:
    if len(subs) == 1:
        return {**subs[0], "name": name}
    return {"name": name, "type": "and", "and": {"and_sub_policy": subs}}


def render(policy: dict, *, decision_wait_s: int = DEFAULT_DECISION_WAIT_S, hash_salt: str = HASH_SALT,
           max_services: int = 200) -> dict:
    """The `processors:` configuration for a GET /sampling document."""
    policies: list[dict] = [{"name": _name("errors"), "type": "status_code",
                             "status_code": {"status_codes": ["ERROR"]}}]
    for tier, doc in policy["tiers"].items():
        threshold_ms = max(int(math.floor(float(doc["latency_threshold_ms"]))), 0)
        for i, match in enumerate(tier_matchers(policy, tier)):
            latency = {"name": _name("latency"), "type": "latency", "latency": {"threshold_ms": threshold_ms}}
            policies.append(_and(_name("slow", tier, str(i)), [*match, latency]))
    hot = [t for t, doc in policy["tiers"].items() if doc.get("hot")]
    for key in TIER_ATTRIBUTES:
        named = [t for t in hot if t != policy["default_tier"]]
        if named:
            policies.append(_string(_name("hot-tiers", key), key, named))
    if policy["default_tier"] in hot:
        for i, match in enumerate(tier_matchers(policy, policy["default_tier"])):
            policies.append(_and(_name("hot-default-tier", str(i)), match) if match else
                            {"name": _name("hot-default-tier", str(i)), "type": "always_sample"})
    hot_nodes = sorted(policy.get("hot_nodes") or {})
    if hot_nodes:
        for key in NODE_ATTRIBUTES:
            policies.append(_string(_name("hot-nodes", key), key, hot_nodes))
    for tier, doc in policy["tiers"].items():
        if doc.get("hot"):
            continue
        services = sorted(doc.get("services", {}).items(), key=lambda kv: (-kv[1]["observed_spans_per_s"], kv[0]))
        services = services[:max_services]
        for i, match in enumerate(tier_matchers(policy, tier)):
            for j, (service, sdoc) in enumerate(services):
                prob = {"name": _name("probabilistic"), "type": "probabilistic",
                        "probabilistic": {"hash_salt": hash_salt, "sampling_percentage": _percentage(sdoc["probability"])}}
                policies.append(_and(_name("rate", tier, str(i), str(j), service),
                                     [*match, _string(_name("service"), SERVICE_ATTRIBUTE, [service]), prob]))
            rest = [_string(_name("other-services"), SERVICE_ATTRIBUTE, [s for s, _ in services], invert=True)] \
                if services else []
            prob = {"name": _name("probabilistic"), "type": "probabilistic",
                    "probabilistic": {"hash_salt": hash_salt, "sampling_percentage": _percentage(doc["probability"])}}
            policies.append(_and(_name("rate", tier, str(i), "other"), [*match, *rest, prob]))
    rate = float(policy.get("observed_spans_per_s") or 0.0)
    expected = max(int(math.ceil(rate)), 1)
    return {"processors": {"tail_sampling": {
        "decision_wait": f"{decision_wait_s}s",
        "num_traces": max(MIN_NUM_TRACES, 2 * expected * decision_wait_s),
        "expected_new_traces_per_sec": expected,
        "policies": _named(policies),
    }}}


PLAIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
STR_TAG = "tag:yaml.org,2002:str"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # repeated sub-policies are written out, not as YAML anchors
        return True


def _represent_str(dumper: _Dumper, text: str) -> yaml.ScalarNode:
    """A string as the Collector reads it back unchanged: `$` doubled, double-quoted unless a plain word that no
    YAML version reads as anything but a string."""
    text = text.replace("$", "$$")
    plain = PLAIN_WORD.fullmatch(text) and dumper.resolve(yaml.ScalarNode, text, (True, False)) == STR_TAG
    return dumper.represent_scalar(STR_TAG, text, style=None if plain else '"')


_Dumper.add_representer(str, _represent_str)


def _comment_text(names) -> str:
    """Names for the header comment, on its line: what Python cannot print (line breaks among them) escaped."""
    return ", ".join("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)
                     for name in names) or "none"


def to_yaml(config: dict, policy: dict) -> str:
    hot = [t for t, d in policy["tiers"].items() if d.get("hot")]
    header = (
        "# OpenTelemetry Collector tail_sampling processor, generated by `sloscope sampling tail-config` from the\n"
        "# adaptive sampling policy (GET /sampling of sloscope serve). Merge it with the main configuration:\n"
        "#   otelcol-contrib --config main.yaml --config THIS_FILE\n"
        "# and put tail_sampling in the traces pipeline that feeds the trace backend.\n"
        f"# Budget: {policy['budget_spans_per_s']:g} request spans/s; hot tiers: {_comment_text(hot)}; "
        f"hot nodes: {_comment_text(sorted(policy.get('hot_nodes') or {}))}.\n")
    return header + yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def write_atomic(path: str | Path, text: str) -> bool:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a part: a temporary file
    in the same directory, fsynced, renamed over the target, then the directory fsynced. Returns False (and
    writes nothing) when the file already holds exactly `text`."""
    path = Path(path)
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True
