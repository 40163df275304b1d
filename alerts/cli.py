"""`sloscope rules` and `sloscope webhook`."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from pathlib import Path

from sloscope.addresses import address_text, parse_address
from sloscope.durations import parse_duration
from sloscope.sizes import size_argument
from sloscope.slo_spec import SpecError, load_spec

from sloscope.edge.http_conn import add_caps_arguments, caps_of

from sloscope.analytics.errors import StoreError
from sloscope.analytics.stores import DEFAULT_DB, recorded_spec, refuse_other_files

from sloscope.alerts.actions import ConfigError
from sloscope.alerts.audit import AuditStore
from sloscope.alerts.remediation import Engine
from sloscope.alerts.remediation_config import load_config
from sloscope.alerts.rules import DEFAULT_RUNBOOK_BASE_URL, RuleOptions, prometheus_rule, render_rules, render_yaml
from sloscope.alerts.webhook import CAPS, TokenError, WebhookApp, WebhookServer, load_token

log = logging.getLogger("sloscope.alerts")

EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers) -> None:
    rules = subparsers.add_parser(
        "rules", help="write Prometheus recording and alerting rules for an SLO spec",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write Prometheus rules generated from the SLO spec, over the metrics sloscope exports at "
        "/metrics:\n"
        "  - per tier: SLI recording rules (share of requests slower than the tier's threshold, error ratio) over\n"
        "    the burn-rate windows; multiwindow, multi-burn-rate alerts for latency and availability (for a 30d\n"
        "    window, page: 14.4x over 1h and 5m, or 6x over 6h and 30m; ticket: 1x over 3d and 6h; for 28d\n"
        "    Sloth's factors on the same windows; other windows of 6d and more scale the windows with the\n"
        "    window, as Pyrra does); the tier's percentile above its threshold over 1m (raise trace sampling);\n"
        "    the SLO as series (sloscope_slo_info, tier:sloscope_slo_objective:ratio, ..._error_budget:ratio,\n"
        "    ..._window:days, ..._error_budget_remaining:ratio);\n"
        "  - physical layer: GPU utilization > 80%, GPU memory growing > 5%/min three minutes in a row, NVMe\n"
        "    > 65 C, SPDK bdev wait > 5 ms, SPDK reactor busy > 70%, a node's error ratio > 5% over 1m (the\n"
        "    defaults: the spec's physical_limits sets each of these thresholds but the memory growth's);\n"
        "  - one alert per taxonomy cause, while it is the top cause of an open incident.\n"
        "Every alert carries the labels severity, cause, action (its remediation) and tier and/or node, and the\n"
        "annotations summary, description, remediation and runbook_url. Check the output with\n"
        "`promtool check rules FILE`; --format prometheusrule writes a prometheus-operator PrometheusRule.")
    rules.add_argument("--slo", type=Path, metavar="SLO.yaml", help="SLO spec (default: the built-in spec)")
    rules.add_argument("--hold", metavar="DURATION",
                       help="`for:` of the physical, node and cause alerts instead of their 1-2 minute defaults "
                       "(e.g. 15s for faster remediation, at the price of acting on shorter spikes; 90 or 1h30m "
                       "are written as Prometheus durations)")
    rules.add_argument("--format", choices=("rules", "prometheusrule"), default="rules",
                       help="a Prometheus rule file (default), or a monitoring.coreos.com/v1 PrometheusRule")
    rules.add_argument("--name", default="sloscope", help="PrometheusRule metadata.name (default: %(default)s)")
    rules.add_argument("--namespace", help="PrometheusRule metadata.namespace (default: none, kubectl's)")
    rules.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="PrometheusRule label, for the Prometheus' ruleSelector (kube-prometheus-stack: "
                       "release=RELEASE); repeatable")
    rules.add_argument("--page-severity", default="page", metavar="VALUE",
                       help="severity label of the fast-burn alerts (default: %(default)s; Sloth: critical)")
    rules.add_argument("--ticket-severity", default="ticket", metavar="VALUE",
                       help="severity label of the slow-burn alerts (default: %(default)s; Sloth: warning)")
    rules.add_argument("--runbook-base-url", metavar="URL",
                       help="page whose #alertname sections the runbook_url annotations point to (default: "
                       "docs/runbooks.md of the project's repository)")
    rules.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout)")
    rules.set_defaults(func=run_rules)

    hook = subparsers.add_parser(
        "webhook", help="receive Alertmanager webhooks and run allow-listed remediation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Receive Alertmanager webhook notifications (payload version 4) on POST /alerts and hand each\n"
        "alert to the remediation engine. Its config (--config) is the allow-list of alert name -> action:\n"
        "nft_drain_backend, spdk_qos_limit, restart_workload, raise_sampling, notify_only. Nothing is executed\n"
        "unless the config says `execute: true`; every decision (executed, dry_run, refused, failed, deferred, and\n"
        "why, with the client's address and whether the config was a dry run) is recorded in the\n"
        "remediation_audit table of --db. Labels are validated before any use; cooldown per target, a budget of\n"
        "actions per hour and one action per target at a time apply; a resolved alert undoes what its firing did,\n"
        "once no other alert about the same target still fires, whether its own action was taken or refused; a\n"
        "re-sent notification acts once.\n\n"
        "Requests need `Authorization: Bearer TOKEN`; the token is read from --token-file or\n"
        "$SLOSCOPE_WEBHOOK_TOKEN, never from the command line. Answers: 200 handled (one result per alert),\n"
        "400 invalid payload (with the reason; a group of more than 1000 alerts is refused whole, and audited),\n"
        "401 no or wrong token (body not read; audited in batches), 411/413/415 no length, too large, not JSON;\n"
        "503 when the audit database is busy (locked by another process), so that Alertmanager retries. --db\n"
        "must not be a file another process keeps open for writing.")
    hook.add_argument("--config", type=Path, required=True, metavar="REMEDIATION.yaml",
                      help="allow-list of alert name -> action (see alerts/remediation.example.yaml)")
    hook.add_argument("--db", type=Path, default=DEFAULT_DB,
                      help=f"DuckDB file for the audit and sampling overrides (default: {DEFAULT_DB})")
    hook.add_argument("--slo", type=Path, metavar="SLO.yaml",
                      help="SLO spec whose tiers raise_sampling accepts (default: the spec recorded with --db, else "
                      "the built-in one)")
    hook.add_argument("--listen", default="127.0.0.1:9095", metavar="HOST:PORT",
                      help="address to listen on (default: %(default)s)")
    hook.add_argument("--token-file", type=Path, metavar="FILE",
                      help="file whose first line is the bearer token, 16 characters or more (default: "
                      "$SLOSCOPE_WEBHOOK_TOKEN)")
    hook.add_argument("--path", default="/alerts", help="URL path of the webhook (default: %(default)s)")
    hook.add_argument("--max-body", type=size_argument, default="1MiB", metavar="SIZE",
                      help="largest accepted body, a size as serve's are (1MiB, 1Mi or 1MB); larger is a 413 "
                      "(default: %(default)s)")
    add_caps_arguments(hook, CAPS, "webhook", "Alertmanager's notifiers")
    hook.set_defaults(func=run_webhook)


_K8S_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_K8S_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_K8S_LABEL_KEY = rf"({_K8S_NAME}(\.{_K8S_NAME})*/)?{_K8S_LABEL_NAME}"
_K8S_LABEL_VALUE = rf"({_K8S_LABEL_NAME})?"
_SEVERITY = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"


def _rule_labels(pairs: list[str]) -> dict[str, str]:
    """--label KEY=VALUE pairs, held to Kubernetes' label syntax (ValueError says which one is wrong)."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(_K8S_LABEL_KEY, key) or len(key) > 316 or not re.fullmatch(
                _K8S_LABEL_VALUE, value):
            raise ValueError(f"--label: expected KEY=VALUE with a Kubernetes label key and value; got {pair!r}")
        labels[key] = value
    return labels


PROMETHEUS_UNITS = ((3_600_000, "h"), (60_000, "m"), (1000, "s"), (1, "ms"))  # in milliseconds, largest first


def _prometheus_duration(text: str) -> str:
    """A duration of the one grammar (sloscope/durations.py) as one Prometheus number and unit, the largest that
    holds it exactly: 90 -> 90s, 1h30m -> 90m. One already written so (0s too) is kept as it is."""
    if re.fullmatch(r"\d+(ms|s|m|h)", text):
        return text
    ms = round(parse_duration(text, "--hold") * 1000)
    unit_ms, unit = next((u, name) for u, name in PROMETHEUS_UNITS if ms % u == 0)
    return f"{ms // unit_ms}{unit}"


def _rules_usage_error(args) -> str | None:
    if args.hold is not None:
        try:
            args.hold = _prometheus_duration(args.hold)
        except ValueError as exc:  # parse_duration's ConfigError
            return str(exc)
    for flag, value in (("--page-severity", args.page_severity), ("--ticket-severity", args.ticket_severity)):
        if not re.fullmatch(_SEVERITY, value):
            return f"{flag}: expected a word of letters, digits, '_', '.' or '-'; got {value!r}"
    if args.runbook_base_url is not None and not re.fullmatch(r"https?://[^\s#\"]+", args.runbook_base_url):
        return f"--runbook-base-url: expected an http(s) URL without a fragment; got {args.runbook_base_url!r}"
    if not (len(args.name) <= 253 and re.fullmatch(rf"{_K8S_NAME}(\.{_K8S_NAME})*", args.name)):
        return f"--name: expected a Kubernetes object name (lower case, digits, '-', '.'); got {args.name!r}"
    if args.namespace is not None and not (len(args.namespace) <= 63 and re.fullmatch(_K8S_NAME, args.namespace)):
        return f"--namespace: expected a Kubernetes namespace name; got {args.namespace!r}"
    if args.label and args.format != "prometheusrule":
        return "--label goes with --format prometheusrule (a rule file has no object to label)"
    return None


def _rules_text(args, spec) -> str:
    """The document asked for; raises ValueError (a bad --label, an unsupported SLO window) with the reason."""
    opts = RuleOptions(args.hold, args.page_severity, args.ticket_severity,
                       args.runbook_base_url or DEFAULT_RUNBOOK_BASE_URL)
    if args.format == "rules":
        return render_rules(spec, opts)
    labels = _rule_labels(args.label)
    return render_yaml(spec, prometheus_rule(spec, args.name, args.namespace, labels, opts))


def run_rules(args) -> int:
    try:
        spec = load_spec(args.slo)
    except SpecError as exc:
        print(f"sloscope rules: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problem = _rules_usage_error(args)
    if problem is not None:
        print(f"sloscope rules: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        text = _rules_text(args, spec)
    except ValueError as exc:  # alerts.burn.UnsupportedWindow among them
        print(f"sloscope rules: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.output.with_name(args.output.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.output)
    except OSError as exc:
        print(f"sloscope rules: {args.output}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {args.output} for tiers {', '.join(spec.tiers)}", file=sys.stderr)
    return EXIT_OK


def run_webhook(args) -> int:
    try:
        refuse_other_files(args.db)  # the audit goes there: a file DuckDB would open in memory would lose it
        config = load_config(args.config)
        spec = load_spec(args.slo) if args.slo is not None else recorded_spec(args.db)
        token = load_token(args.token_file)
        address = parse_address(args.listen, "--listen")
    except (ConfigError, SpecError, TokenError, StoreError, ValueError) as exc:
        print(f"sloscope webhook: {exc}", file=sys.stderr)
        return EXIT_USAGE
    engine = Engine(config, AuditStore.at(args.db), spec.tiers)
    try:
        server = WebhookServer(address, WebhookApp(engine, token, args.path, args.max_body), caps_of(args))
    except OSError as exc:
        print(f"sloscope webhook: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    url = f"http://{address_text(server.server_address[:2])}{args.path}"
    mode = "EXECUTING actions" if config.execute else "dry-run (execute: false)"
    log.info("webhook on %s, %d alert(s) allow-listed, %s; audit in %s", url, len(config.actions), mode, args.db)
    print(f"listening on {url}", flush=True)

    def on_signal(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.drain()  # an alert being handled is acted on and audited before the store closes
    return EXIT_OK
