"""Policy names of the tail_sampling config: unique (the processor refuses a duplicate name at start), readable,
the same run after run, whatever tier and service names the spec and the telemetry bring."""

import http.server
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
from collections import Counter

import yaml

from sloscope.sampling.observations import Observations, Sli
from sloscope.sampling.config import SamplingConfig
from sloscope.sampling.policy import SamplingPolicy
from sloscope.sampling.tail_sampling import render, to_yaml
from sloscope.catalog import TIER_ATTRIBUTES
from sloscope.slo_spec import parse_spec
from tests.sampling.test_sampling import T0, _walk
from tests.sampling.test_tail_sampling import _JsonAnswer, as_the_collector_reads, validate_tail_config

# The readable part (what `sloscope.sampling.tail_sampling` reduces names to), then a digest only where names would be equal.
POLICY_NAME = re.compile(r"(?P<readable>[A-Za-z0-9._-]{1,120})(#[0-9a-f]{8,64})?")
REST = "(services not listed)"  # what a tier's catch-all rate policy matches


def spec_of(tiers, default):
    body = {t: {"latency": {"percentile": 99, "threshold_ms": 100.0 + 50 * i}, "availability": 99.0}
            for i, t in enumerate(tiers)}
    return parse_spec(yaml.safe_dump({"default_tier": default, "tiers": body}))


def policy_doc(tiers, default, services, hot_tiers=(), hot_nodes=()):
    spec = spec_of(tiers, default)
    traffic = {(t, svc, "/r"): 600 * (len(services) - k)  # the first service is the busiest: rank 0
               for t in tiers for k, svc in enumerate(services)}
    slis = {t: Sli(100, 50 if t in hot_tiers else 0, 10.0) for t in tiers}
    return SamplingPolicy(spec, SamplingConfig(budget_spans_per_s=50)).evaluate(
        Observations(T0, 60, traffic, slis, {node: Sli(100, 60) for node in hot_nodes}))


def tail_config(doc):
    text = to_yaml(render(doc), doc)
    return text, validate_tail_config(text)


def assert_names_unique_and_readable(policies):
    """Unique among siblings, top level and inside each `and`; a digest only on names that would be equal."""
    for scope in [policies] + [p["and"]["and_sub_policy"] for p in policies if p["type"] == "and"]:
        names = [p["name"] for p in scope]
        assert len(names) == len(set(names)), [n for n, c in Counter(names).items() if c > 1]
        readable = Counter(POLICY_NAME.fullmatch(n)["readable"] for n in names)
        for name in names:
            assert POLICY_NAME.fullmatch(name), name
            assert ("#" in name) == (readable[POLICY_NAME.fullmatch(name)["readable"]] > 1), name


def what_it_samples(policy, doc):
    """(kind, tier matches, service, threshold or percentage) of a slow- or rate- policy, from its sub-policies
    alone: names play no part."""
    tiers, service, value = [], None, None
    for sub in _walk([policy]):
        block = sub.get(sub["type"], {})
        values = [as_the_collector_reads(v) for v in block.get("values", [])]
        if sub["type"] == "string_attribute" and block["key"] in TIER_ATTRIBUTES:
            inverted = block.get("invert_match", False)
            assert not inverted or set(values) == set(doc["tiers"]) - {doc["default_tier"]}
            tiers.append((block["key"], doc["default_tier"] if inverted else values[0]))
        elif sub["type"] == "string_attribute":
            service = REST if block.get("invert_match") else values[0]
        elif sub["type"] in ("latency", "probabilistic"):
            value = block.get("threshold_ms", block.get("sampling_percentage"))
    return "slow" if service is None else "rate", tuple(sorted(tiers)), service, value


def tier_matches(doc, tier):
    if tier != doc["default_tier"]:
        return [((key, tier),) for key in TIER_ATTRIBUTES]
    return [tuple(sorted((key, tier) for key in TIER_ATTRIBUTES))] if len(doc["tiers"]) > 1 else [()]


def expected_meanings(doc):
    """What the slow- and rate- policies must sample: every tier's threshold, every listed (tier, service) at its
    probability, every tier's catch-all at the tier's."""
    want = Counter()
    for tier, tdoc in doc["tiers"].items():
        for match in tier_matches(doc, tier):
            want["slow", match, None, math.floor(tdoc["latency_threshold_ms"])] += 1
            if tdoc["hot"]:
                continue
            for service, sdoc in tdoc["services"].items():
                want["rate", match, service, round(sdoc["probability"] * 100, 6)] += 1
            want["rate", match, REST, round(tdoc["probability"] * 100, 6)] += 1
    return want


def assert_same_meaning(policies, doc):
    got = Counter(what_it_samples(p, doc) for p in policies if p["name"].startswith(("slow-", "rate-")))
    assert got == expected_meanings(doc)


COLLIDING = dict(tiers=["standard", "gold", "gold-1"], default="standard", services=["other", "0-other", "embedder"])


def test_tiers_gold_and_gold_1_beside_a_service_named_other_get_distinct_names():
    doc = policy_doc(**COLLIDING)
    text, ts = tail_config(doc)
    assert_names_unique_and_readable(ts["policies"])
    assert_same_meaning(ts["policies"], doc)
    names = [p["name"] for p in ts["policies"]]
    # gold's policy for its second tier attribute and service rank 0 ("other") reads as gold-1's catch-all for its
    # first; gold's for rank 1 ("0-other") as gold-1's for its second attribute and "other"
    for readable in ("rate-gold-1-0-other", "rate-gold-1-1-0-other"):
        twins = [n for n in names if POLICY_NAME.fullmatch(n)["readable"] == readable]
        assert len(twins) == 2 and all("#" in n for n in twins), names
    assert "rate-gold-1-other" in names and "errors" in names, "names that collide with nothing stay as they were"
    assert f'- name: "{twins[0]}"' in text
    assert to_yaml(render(doc), doc) == text


def test_the_cli_writes_the_same_bytes_run_after_run():
    """Two processes with different string hash seeds: no name depends on set or dict order of one run."""
    doc = policy_doc(**COLLIDING)
    handler = type("Answer", (_JsonAnswer,), {"body": json.dumps(doc).encode()})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sampling"
        runs = [subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "sampling", "tail-config", "--url", url],
                               capture_output=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
                for seed in ("1", "2")]
    finally:
        server.shutdown()
        server.server_close()
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    ts = validate_tail_config(runs[0].stdout.decode())
    assert_names_unique_and_readable(ts["policies"])
    assert_same_meaning(ts["policies"], doc)


SERVICE_PIECES = ["other", "0", "1", "gold", " ", "\t", "\n", "é", "名", "\u2028", "$", "${env:HOME}", "$$", '"', "'",
                  "#", "#0a1b2c3d", "1e3", ".", "_", "x" * 70]


def random_tiers(rng):
    """Legal tier names, some of them another's name and a dash and a digit (as `gold` and `gold-1`)."""
    bases = {rng.choice(["gold", "0", "a.b", "x_1"]) + rng.choice(["", "-0", "-1"]) for _ in range(rng.randint(1, 3))}
    return sorted(bases | {f"{b}-{rng.randint(0, 1)}" for b in bases if rng.random() < 0.7})


def random_services(rng):
    """Odd service names, busiest first. A tier's policy for attribute d, rank j and service S reads as tier
    `T-d`'s policy for attribute d', rank j' and service S' when j is d' and S is `j'-S'`, or as its catch-all when
    j is d' and S is `other`: one such name goes in at rank 0 or 1."""
    services = sorted({"".join(rng.choice(SERVICE_PIECES) for _ in range(rng.randint(1, 3)))
                       for _ in range(rng.randint(1, 6))})
    rng.shuffle(services)
    at, rank = rng.randint(0, 1), rng.randrange(len(services))
    twin = rng.choice(["other", f"{rank + (rank >= at)}-{services[rank]}"])
    return services if twin in services else services[:at] + [twin] + services[at:]


def test_random_tier_and_service_names_always_give_unique_stable_names():
    rng = random.Random(20251129)
    disambiguated = 0
    for _ in range(30):
        tiers = random_tiers(rng)
        default = rng.choice(tiers)
        hot = [t for t in tiers if rng.random() < 0.2]
        doc = policy_doc(tiers, default, random_services(rng), hot_tiers=hot,
                         hot_nodes=["gpu-1", "gpu 1"] if rng.random() < 0.3 else [])
        text, ts = tail_config(doc)
        assert_names_unique_and_readable(ts["policies"])
        assert_same_meaning(ts["policies"], doc)
        assert to_yaml(render(doc), doc) == text
        disambiguated += sum("#" in p["name"] for p in ts["policies"])
    assert disambiguated, "the names drawn never collided: the loop tested nothing"
