"""Prometheus rules: generated from the spec, valid for promtool, firing and not firing as intended."""

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sloscope import metric_names
from sloscope.alerts.actions import ACTIONS
from sloscope.alerts.burn import UnsupportedWindow, burn_windows, sli_windows
from sloscope.alerts.node_rules import CAUSE_ACTIONS, cause_alert_name
from sloscope.alerts.rule_text import DEFAULT_RUNBOOK_BASE_URL, UNATTRIBUTED
from sloscope.alerts.rules import ALERT_ALPHA, RuleOptions, alert_names, render_rules, rules_dict
from sloscope.analytics.significance import poisson_tail
from sloscope import taxonomy
from sloscope.commands.cli import main
from sloscope.slo_spec import DEFAULT_SPEC_YAML, load_spec, parse_spec
from tests.conftest import need

PROMTOOL_TESTS = Path(__file__).parents[1] / "promtool"
RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
DAY = 86_400


def built_in_with_window(window: str):
    return parse_spec(DEFAULT_SPEC_YAML.replace("window: 30d", f"window: {window}"))

CUSTOM_SPEC = """\
default_tier: batch
tiers:
  interactive:
    latency: {percentile: 99.9, threshold_ms: 333}
    availability: 99.95
  p99-latency-critical:
    latency: {percentile: 99, threshold_ms: 800}
    availability: 99.9
  batch:
    latency: {percentile: 50, threshold_ms: 12000}
    availability: 99
"""
# CUSTOM_SPEC with token objectives (docs/slo-spec.md) on one tier: every alert the rules may define.
TOKEN_SPEC = CUSTOM_SPEC.replace("""    availability: 99.95
""", """    availability: 99.95
    ttft: {percentile: 99, threshold_ms: 400}
    tpot: {percentile: 95, threshold_ms: 40}
    queue: {percentile: 99, threshold_ms: 300}
""")


def promtool(*args, cwd=None):
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_rules(directory: Path, spec) -> Path:
    path = directory / "rules.yml"
    path.write_text(render_rules(spec))
    return path


def alerts_of(doc):
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.privileged
@pytest.mark.parametrize("spec", [load_spec(None), parse_spec(CUSTOM_SPEC), built_in_with_window("7d"),
                                  built_in_with_window("28d"), built_in_with_window("90d")],
                         ids=["built-in", "custom", "7d", "28d", "90d"])
def test_generated_rules_pass_promtool_check(tmp_path, spec):
    done = promtool("check", "rules", str(write_rules(tmp_path, spec)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.privileged
@pytest.mark.parametrize("name, window", [("slo_burn.yml", "30d"), ("physical.yml", "30d"),
                                          ("slo_burn_7d.yml", "7d"), ("slo_burn_28d.yml", "28d")])
def test_promtool_unit_tests(tmp_path, name, window):
    write_rules(tmp_path, built_in_with_window(window))
    shutil.copy(PROMTOOL_TESTS / name, tmp_path / name)
    done = promtool("test", "rules", name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _render(template: str, labels: dict, value: str) -> str:
    """The few template forms the cause alerts use: {{ $labels.NAME }} and {{ $value | printf "%.2f" }}."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    text = text.replace('{{ $value | printf "%.2f" }}', value)
    assert "{{" not in text, text
    return text


@pytest.mark.privileged
def test_each_cause_alert_fires_only_for_the_top_cause_of_an_incident(tmp_path):
    """Generated promtool test: on node n<i> cause i scores 0.9 and cause i+1 scores 0.6 (ranked second), so
    each cause alert fires exactly for the node where its cause ranks first; a top cause scoring 0.3 does not
    fire, nor does a top cause that has been there for less than the alert's `for`."""
    write_rules(tmp_path, load_spec(None))
    causes = list(taxonomy.CAUSE_IDS)
    series, expected = [], {c: [] for c in causes}
    for i, cause in enumerate(causes):
        labels = {"tier": "p99-latency-critical", "service": "gw", "node": f"n{i}"}
        second = causes[(i + 1) % len(causes)]
        series.append({"series": metric_names.INCIDENT_CAUSE_SCORE + "{" + ",".join(
            f'{k}="{v}"' for k, v in {**labels, "cause": cause}.items()) + "}", "values": "0.9x5"})
        series.append({"series": metric_names.INCIDENT_CAUSE_SCORE + "{" + ",".join(
            f'{k}="{v}"' for k, v in {**labels, "cause": second}.items()) + "}", "values": "0.6x5"})
        expected[cause].append(labels)
    series.append({"series": f'{metric_names.INCIDENT_CAUSE_SCORE}{{tier="standard",service="gw",node="low",'
                             f'cause="{causes[0]}"}}', "values": "0.3x5"})
    series.append({"series": f'{metric_names.INCIDENT_CAUSE_SCORE}{{tier="standard",service="gw",node="late",'
                             f'cause="{causes[1]}"}}', "values": "_ _ _ 0.9 0.9 0.9"})
    rules = {r["alert"]: r for r in alerts_of(rules_dict(load_spec(None)))}
    tests = []
    for cause in causes:
        rule = rules[cause_alert_name(cause)]
        exp = []
        for labels in expected[cause]:
            all_labels = {**labels, "cause": cause}
            exp.append({"exp_labels": {**rule["labels"], **all_labels},
                        "exp_annotations": {k: _render(v, all_labels, "0.90") for k, v in rule["annotations"].items()}})
        tests.append({"alertname": rule["alert"], "eval_time": "3m", "exp_alerts": exp})
        tests.append({"alertname": rule["alert"], "eval_time": "0m", "exp_alerts": []})  # `for: 1m` not yet met
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
           "tests": [{"name": "cause alerts", "interval": "1m", "input_series": series, "alert_rule_test": tests}]}
    (tmp_path / "causes.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = promtool("test", "rules", "causes.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --- without promtool ----------------------------------------------------------------------------------------------

PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "rate", "increase", "histogram_quantile", "and", "or", "unless",
                "offset", "bool", "round", "abs", "sqrt", "clamp_min", "clamp_max", "absent", "deriv", "time", "vector"}


def series_names(expr: str) -> set[str]:
    """Metric names an expression selects (strings, matchers, ranges, grouping clauses, durations and numbers
    removed first)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|s|m|h|d|w|y)?\b", "", text)
    return {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text) if w not in PROMQL_WORDS}


@pytest.mark.parametrize("spec_text", [None, CUSTOM_SPEC, TOKEN_SPEC], ids=["built-in", "custom", "tokens"])
def test_rules_name_only_exported_or_recorded_series(spec_text):
    spec = load_spec(None) if spec_text is None else parse_spec(spec_text)
    doc = rules_dict(spec)
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    exported = metric_names.exported_series()
    named = set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            named |= series_names(rule["expr"])
    assert named, "no series found: the extraction is broken"
    unknown = named - exported - recorded
    assert not unknown, f"rules name series that are neither exported nor recorded: {sorted(unknown)}"
    assert metric_names.GPU_UTILIZATION in named and metric_names.REQUEST_DURATION + "_bucket" in named


def test_series_name_extraction_sees_through_promql_syntax():
    expr = ('histogram_quantile(0.99, sum by (tier, le) (rate(a_bucket{tier="x", le="0.8"}[1m]))) > 0.8\n'
            'and on (tier) b offset 5m * 60 >= 1e+06 or max without (direction) (c:d:e)')
    assert series_names(expr) == {"a_bucket", "b", "c:d:e"}


def test_every_alert_says_what_it_means_and_what_it_maps_to():
    spec = parse_spec(CUSTOM_SPEC)
    alerts = alerts_of(rules_dict(spec))
    names = {a["alert"] for a in alerts}
    for cause in taxonomy.CAUSE_IDS:
        assert cause_alert_name(cause) in names
    for rule in alerts:
        labels, annotations = rule["labels"], rule["annotations"]
        assert labels["severity"] in ("page", "ticket", "warning"), rule["alert"]
        assert labels["cause"] in set(taxonomy.CAUSE_IDS) | {UNATTRIBUTED}, rule["alert"]
        assert labels["action"] in ACTIONS, rule["alert"]
        # the tier is a label of the rule, or the node one of the series it selects (kept by its `by` clause)
        families = [g for g in metric_names.GAUGES if g.name in rule["expr"]]
        assert ("tier" in labels or re.search(r"by \(node\b", rule["expr"])
                or rule["expr"].startswith("node_gpu:")
                or (metric_names.INCIDENT_CAUSE_SCORE in rule["expr"] and "node" in metric_names.INCIDENT_LABELS)
                or (families and all("node" in g.label_names for g in families))), rule["alert"]
        assert set(annotations) == {"summary", "description", "remediation", "runbook_url"}, rule["alert"]
        assert labels["action"] in annotations["remediation"], rule["alert"]
        assert annotations["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE_URL}#{rule['alert'].lower()}"
    for tier in spec.tiers:
        tier_alerts = [a for a in alerts if a["labels"].get("tier") == tier]
        assert {a["alert"] for a in tier_alerts} == {
            "SloscopeLatencyBudgetBurn", "SloscopeLatencyBudgetSlowBurn", "SloscopeErrorBudgetBurn",
            "SloscopeErrorBudgetSlowBurn", "SloscopeTierLatencyHigh"}
    assert set(CAUSE_ACTIONS) == set(taxonomy.CAUSE_IDS)


@pytest.mark.parametrize("requests_a_minute", [40, 100, 1000, 20_000])
def test_the_latency_alert_fires_where_the_analysis_test_does(requests_a_minute):
    """The alert's closed-form bar for slow requests in a minute, against the exact Poisson count at which the
    analysis would call the same minute improbable at the alert's level."""
    rule = next(a for a in alerts_of(rules_dict(load_spec(None)))
                if a["alert"] == "SloscopeTierLatencyHigh" and a["labels"]["tier"] == "standard")
    z, skew = map(float, re.findall(r"\+ ([0-9.]+)", rule["expr"]))
    expected = requests_a_minute * 0.05
    bar = expected + z * math.sqrt(expected) + skew
    exact = next(k for k in range(1, requests_a_minute) if poisson_tail(k, expected) < ALERT_ALPHA)
    assert exact <= math.ceil(bar) <= exact + 1


def test_rules_are_a_pure_function_of_the_spec():
    spec = parse_spec(CUSTOM_SPEC)
    assert render_rules(spec) == render_rules(parse_spec(CUSTOM_SPEC))
    text = render_rules(spec)
    # each tier selects the exact bucket of its threshold, as the exporter labels it, and its own budgets
    assert 'tier="interactive", le="0.333"' in text and 'tier="batch", le="12.0"' in text
    assert "(14.4 * 0.001)" in text  # interactive p99.9: 0.1 % may be slower
    assert "(14.4 * 0.0005)" in text  # interactive availability 99.95 %
    assert "(14.4 * 0.5)" in text  # batch p50: half may be slower
    assert 'increase(sloscope_request_duration_seconds_count{tier="interactive"}[1m])) * 0.001' in text
    for t in spec.tiers.values():
        bound = metric_names.le_label(metric_names.le_seconds(t.threshold_ms))
        assert bound in {metric_names.le_label(b) for b in metric_names.buckets_for(spec)}
    assert render_rules(load_spec(None)) != text


def test_cli_writes_the_rules_file(tmp_path, capsys):
    slo = tmp_path / "slo.yaml"
    slo.write_text(CUSTOM_SPEC)
    out = tmp_path / "out" / "rules.yml"
    assert main(["rules", "--slo", str(slo), "-o", str(out)]) == 0
    assert out.read_text() == render_rules(parse_spec(CUSTOM_SPEC, str(slo)))
    assert main(["rules"]) == 0
    assert capsys.readouterr().out.startswith("# Prometheus rules generated by `sloscope rules`")


def test_cli_rejects_a_bad_spec_and_explains_itself(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("default_tier: x\ntiers: {}\n")
    assert main(["rules", "--slo", str(bad)]) == 2
    assert "tiers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["rules", "--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    assert "14.4x over 1h and 5m" in help_text and "promtool check rules" in help_text
    assert "--format" in help_text and "--runbook-base-url" in help_text


# --- burn-rate windows per SLO window ------------------------------------------------------------------------------

def test_burn_windows_are_the_workbook_s_for_30_days_and_sloth_s_for_28():
    as_tuples = lambda window_s: [(b.kind, b.factor, b.long, b.short) for b in burn_windows(window_s)]  # noqa: E731
    assert as_tuples(30 * DAY) == [("page", 14.4, "1h", "5m"), ("page", 6, "6h", "30m"), ("ticket", 1, "3d", "6h")]
    # Sloth's 28-day set: the same windows and budget shares (2 %, 5 %, 10 %), so the factors shrink by 28/30
    assert as_tuples(28 * DAY) == [("page", 13.44, "1h", "5m"), ("page", 5.6, "6h", "30m"),
                                   ("ticket", 0.933333333, "3d", "6h")]
    assert sli_windows(30 * DAY) == ("5m", "30m", "1h", "6h", "3d")


@pytest.mark.parametrize("days", [7, 10, 90])
def test_other_windows_scale_the_windows_and_keep_the_budget_share(days):
    for b, workbook in zip(burn_windows(days * DAY), burn_windows(30 * DAY)):
        assert b.long_s == workbook.long_s * days / 30 and b.short_s == workbook.short_s * days / 30
        assert b.factor == workbook.factor
        # the alert still stands for the same share of the window's budget
        assert math.isclose(b.factor * b.long_s / (days * DAY), workbook.budget_share)
    assert [b.long for b in burn_windows(7 * DAY)] == ["14m", "1h24m", "16h48m"]
    assert [b.short for b in burn_windows(7 * DAY)] == ["1m10s", "7m", "1h24m"]


@pytest.mark.parametrize("window_s, reason", [(3 * DAY, "at least 6d"), (1 * DAY, "at least 6d"),
                                              (7 * DAY + 1, "whole number of seconds")])
def test_windows_the_method_cannot_serve_are_refused(window_s, reason):
    with pytest.raises(UnsupportedWindow, match=reason):
        burn_windows(window_s)


def test_cli_refuses_an_unsupported_window_and_says_why(tmp_path, capsys):
    slo = tmp_path / "slo.yaml"
    slo.write_text(DEFAULT_SPEC_YAML.replace("window: 30d", "window: 2d"))
    assert main(["rules", "--slo", str(slo)]) == 2
    err = capsys.readouterr().err
    assert "SLO window 2d" in err and "at least 6d" in err


def test_the_alert_text_says_the_window():
    text = render_rules(built_in_with_window("7d"))
    assert "a 7-day budget is spent in about 12 hours" in text and "the 7-day budget will run out" in text
    assert "30-day" not in text and "ratio_rate1h24m" in text
    assert "a 30-day budget is spent in about 2 days" in render_rules(load_spec(None))


# --- metadata, severities, runbooks, PrometheusRule ----------------------------------------------------------------

@pytest.mark.parametrize("hold, spoken", [(None, None), ("10s", "10 seconds"), ("1h", "an hour")])
def test_the_alert_text_says_how_long_the_condition_held(hold, spoken):
    defaults = {"1m": "a minute", "2m": "2 minutes", "5m": "5 minutes"}
    alerts = [r for g in rules_dict(load_spec(None), RuleOptions(hold=hold))["groups"] for r in g["rules"]
              if "alert" in r and re.search(r" for (a|an|\d+) \w+", r["annotations"]["description"])]
    assert len(alerts) == 6  # the physical alerts that say how long
    for rule in alerts:
        assert rule["for"] == (hold or rule["for"])
        assert f" for {spoken or defaults[rule['for']]} " in rule["annotations"]["description"], rule["alert"]


def test_metadata_rules_describe_each_tier_s_slos():
    spec = parse_spec(CUSTOM_SPEC)
    meta = {g["name"]: g["rules"] for g in rules_dict(spec)["groups"] if g["name"].startswith("sloscope-slo-meta-")}
    assert set(meta) == {f"sloscope-slo-meta-{t}" for t in spec.tiers}
    info = [r for r in meta["sloscope-slo-meta-interactive"] if r["record"] == "sloscope_slo_info"]
    assert [r["labels"] for r in info] == [
        {"tier": "interactive", "slo": "latency", "objective": "99.9", "window": "30d"},
        {"tier": "interactive", "slo": "availability", "objective": "99.95", "window": "30d"}]
    objectives = {r["labels"]["slo"]: r["expr"] for r in meta["sloscope-slo-meta-batch"]
                  if r["record"] == "tier:sloscope_slo_error_budget:ratio"}
    assert objectives == {"latency": "vector(0.5)\n", "availability": "vector(0.01)\n"}
    left = [r["expr"] for r in meta["sloscope-slo-meta-batch"]
            if r["record"] == "tier:sloscope_slo_error_budget_remaining:ratio"]
    assert len(left) == 2 and all("[30d]" in e for e in left)


def test_severities_and_runbook_base_are_configurable():
    opts = RuleOptions(page_severity="critical", ticket_severity="warning",
                       runbook_base_url="https://runbooks.example/x")
    alerts = alerts_of(rules_dict(load_spec(None), opts))
    severity = {a["alert"]: a["labels"]["severity"] for a in alerts}
    assert severity["SloscopeLatencyBudgetBurn"] == severity["SloscopeErrorBudgetBurn"] == "critical"
    assert severity["SloscopeLatencyBudgetSlowBurn"] == severity["SloscopeErrorBudgetSlowBurn"] == "warning"
    assert severity["SloscopeGpuSaturated"] == "warning" and severity["SloscopeTierLatencyHigh"] == "warning"
    assert {a["annotations"]["runbook_url"] for a in alerts if a["alert"] == "SloscopeNvmeHot"} == {
        "https://runbooks.example/x#sloscopenvmehot"}


def test_every_alert_has_a_section_in_the_runbooks_page():
    headings = {line[4:].strip() for line in RUNBOOKS.read_text().splitlines() if line.startswith("### ")}
    assert set(alert_names(parse_spec(TOKEN_SPEC))) == headings


def test_cli_writes_a_prometheus_rule(tmp_path, capsys):
    out = tmp_path / "rule.yaml"
    assert main(["rules", "--format", "prometheusrule", "--namespace", "monitoring", "--label", "release=kps",
                 "--name", "sloscope-slo", "--page-severity", "critical", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "sloscope-slo" and doc["metadata"]["namespace"] == "monitoring"
    assert doc["metadata"]["labels"]["release"] == "kps"
    assert doc["spec"] == rules_dict(load_spec(None), RuleOptions(page_severity="critical"))
    assert main(["rules"]) == 0
    assert "apiVersion" not in capsys.readouterr().out  # the plain rule file stays the default


@pytest.mark.parametrize("flags, complaint", [
    (["--label", "release"], "--label"), (["--label", "bad key=x"], "--label"), (["--label", "a=b c"], "--label"),
    (["--name", "Not_A_Name"], "--name"), (["--namespace", "x" * 64], "--namespace"),
    (["--page-severity", "crit ical"], "--page-severity"), (["--runbook-base-url", "ftp://x"], "--runbook-base-url")])
def test_cli_refuses_bad_prometheus_rule_flags(flags, complaint, capsys):
    assert main(["rules", "--format", "prometheusrule", *flags]) == 2
    assert complaint in capsys.readouterr().err


@pytest.mark.privileged
def test_the_prometheus_rule_s_groups_pass_promtool_check(tmp_path):
    doc = yaml.safe_load(subprocess.run(
        [sys.executable, "-m", "sloscope.commands.cli", "rules", "--format", "prometheusrule", "--label", "release=kps"],
        capture_output=True, text=True, check=True).stdout)
    path = tmp_path / "from-prometheusrule.yml"
    path.write_text(yaml.safe_dump(doc["spec"]))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
