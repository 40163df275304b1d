"""`sloscope sampling`: the policy as JSON, and an OpenTelemetry Collector tail_sampling config."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta, timezone
from pathlib import Path

from sloscope.durations import parse_duration
from sloscope.times import parse_rfc3339, rfc3339_or_none

from sloscope.analytics.errors import StoreError
from sloscope.analytics.rca import newest_request
from sloscope.analytics.stores import DEFAULT_DB, open_from_args

from sloscope.sampling.config import load_config
from sloscope.sampling.policy import SCHEMA, evaluate_once
from sloscope.sampling.tail_sampling import render, to_yaml, write_atomic

EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers) -> None:
    sampling = subparsers.add_parser(
        "sampling", help="adaptive trace sampling: the policy, and an OpenTelemetry Collector tail_sampling config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Adaptive trace sampling (sampling/policy.py). Hot tiers (latency percentile above the\n"
        "objective or more than 5% errors over a minute, an open incident, a raise_sampling override) and hot nodes\n"
        "are kept at 100% until they have been quiet for the dwell time; every other (tier, service, route) shares\n"
        "a budget of kept request spans per second. `sloscope serve --sampling CONFIG` serves the policy at\n"
        "GET /sampling (for sampling/head_sampler.py).\n\n"
        "  policy       print the policy JSON evaluated now from --db (or fetched from --url)\n"
        "  tail-config  write it as a tail_sampling processor config (atomically; --every to keep it current)")
    sub = sampling.add_subparsers(dest="sampling_command", metavar="SUBCOMMAND", required=True)
    for name, help_text in (("policy", "print the sampling policy as JSON"),
                            ("tail-config", "write an OpenTelemetry Collector tail_sampling processor config")):
        p = sub.add_parser(name, help=help_text)
        source = p.add_mutually_exclusive_group()
        source.add_argument("--db", type=Path, default=None,
                            help=f"evaluate from this DuckDB file (default: {DEFAULT_DB}); it must not be open for "
                            "writing by another process: use --url while `sloscope serve` runs")
        source.add_argument("--url", help="fetch the policy from `sloscope serve` instead, e.g. "
                            "http://127.0.0.1:4318/sampling")
        p.add_argument("--slo", type=Path, metavar="SLO.yaml",
                       help="SLO spec (with --db; default: the spec recorded with --db, else the built-in one)")
        p.add_argument("--config", type=Path, metavar="SAMPLING.yaml",
                       help="sampling config, with --db (a served policy uses serve's --sampling): "
                       "budget_spans_per_s, min_probability, dwell, window, ... (default: 100 spans/s, 0.001, 2m, 1m)")
        p.add_argument("--at", metavar="TIME",
                       help="evaluate at this RFC 3339 time, or 'latest' (the newest stored request) "
                       "(default: now; --db only)")
        if name == "tail-config":
            p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout)")
            p.add_argument("--decision-wait", default="30s", metavar="DURATION",
                           help="the processor's decision_wait (default: %(default)s)")
            p.add_argument("--every", metavar="DURATION",
                           help="keep going: re-evaluate this often and rewrite FILE when the config changes")
        p.set_defaults(func=run_sampling)


def _sampling_policy(args, config, spec_path) -> dict:
    if args.url:
        return _served_policy(args.url)
    with open_from_args(args, read_only=True) as store:  # --db, else the default file
        spec = store.spec(spec_path)
        now = time.time()
        if args.at == "latest":
            newest = newest_request(store)
            if newest is None:
                raise ValueError("--at latest: the database holds no requests")
            now = (newest + timedelta(seconds=1)).replace(tzinfo=timezone.utc).timestamp()
        elif args.at:
            now = parse_rfc3339(args.at, "--at").replace(tzinfo=timezone.utc).timestamp()
        return evaluate_once(store, spec, config, now)


def _served_policy(url: str) -> dict:
    """The policy `sloscope serve` answers at url; ValueError naming the URL where none comes."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            doc = json.loads(response.read())
        if not (isinstance(doc, dict) and doc.get("schema") == SCHEMA):  # another JSON endpoint, say /rca
            raise ValueError(f"not a sampling policy (no \"schema\": \"{SCHEMA}\"); the policy is GET /sampling "
                             f"of `sloscope serve`")
        return doc
    except urllib.error.HTTPError as exc:
        raise ValueError(f"--url {url}: answered {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:  # the reason is the socket's error: its words, without the errno
        raise ValueError(f"--url {url}: {getattr(exc.reason, 'strerror', None) or exc.reason}") from None
    except (OSError, ValueError) as exc:  # a timeout, a connection cut, or an answer that is not JSON
        raise ValueError(f"--url {url}: no policy read: {exc}") from None


def _check_at(text: str | None) -> None:
    """--at is an RFC 3339 time or `latest`: a duration, as rca takes, has no newest request here to count back
    from (and a served policy is always the current one)."""
    if text and text != "latest" and rfc3339_or_none(text) is None:
        raise ValueError(f"--at: expected an RFC 3339 time or 'latest'; got {text!r}")


def run_sampling(args) -> int:
    prog = f"sloscope sampling {args.sampling_command}"
    try:
        config = load_config(args.config)
        every = wait = None
        if args.sampling_command == "tail-config":
            wait = parse_duration(args.decision_wait, "--decision-wait")
            every = parse_duration(args.every, "--every") if args.every else None
            if every is not None and args.output is None:
                raise ValueError("--every needs -o FILE")
        if args.url and args.at:
            raise ValueError("--at evaluates from --db; a served policy is always the current one")
        _check_at(args.at)
    except ValueError as exc:  # a ConfigError, a SpecError among them
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    while True:
        try:
            policy = _sampling_policy(args, config, args.slo)
        except (StoreError, ValueError, OSError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            if every is None:
                return EXIT_USAGE
            time.sleep(every)
            continue
        if args.sampling_command == "policy":
            print(json.dumps(policy, indent=2))
            return EXIT_OK
        text = to_yaml(render(policy, decision_wait_s=max(int(wait), 1)), policy)
        if args.output is None:
            sys.stdout.write(text)
            return EXIT_OK
        try:
            changed = write_atomic(args.output, text)
        except OSError as exc:
            print(f"{prog}: {args.output}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
        if changed:
            hot = [t for t, d in policy["tiers"].items() if d.get("hot")]
            print(f"wrote {args.output}: hot tiers {', '.join(hot) or 'none'}", file=sys.stderr)
        if every is None:
            return EXIT_OK
        time.sleep(every)
