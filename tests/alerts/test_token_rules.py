"""A tier's token objectives (TTFT, TPOT, queue time) in the rules: recording rules, burn-rate alerts and metadata
over the token histograms of /metrics, valid for promtool and firing as intended; a tier without them keeps the
rules it had."""

import pytest
import yaml

from sloscope import metric_names
from sloscope.alerts.rules import alert_names, rules_dict
from sloscope.slo_spec import TOKEN_SLIS, parse_spec
from tests.alerts.test_rules import CUSTOM_SPEC, TOKEN_SPEC, alerts_of, promtool, write_rules

TIER = "interactive"  # TOKEN_SPEC's tier with token objectives


def _groups(spec_text: str) -> dict[str, list]:
    return {g["name"]: g["rules"] for g in rules_dict(parse_spec(spec_text))["groups"]}


def _is_token_rule(rule: dict) -> bool:
    return rule.get("labels", {}).get("slo") in TOKEN_SLIS or (
        "record" in rule and any(f"_{sli}_slow:" in rule["record"] for sli in TOKEN_SLIS))


def test_tiers_without_token_objectives_keep_their_rules_byte_for_byte():
    """TOKEN_SPEC is CUSTOM_SPEC with token objectives for one tier (tests/data/rules/built-in.yml holds the
    built-in spec's rules, which give none)."""
    before, after = _groups(CUSTOM_SPEC), _groups(TOKEN_SPEC)
    assert list(before) == list(after)
    for name, rules in after.items():
        if TIER in name:  # the token tier: its rules are the ones it had, and its token rules besides
            assert [r for r in rules if not _is_token_rule(r)] == before[name], name
            assert any(_is_token_rule(r) for r in rules), name
        else:
            assert rules == before[name], name


def test_each_token_objective_has_its_sli_records_burn_alerts_and_metadata():
    spec = parse_spec(TOKEN_SPEC)
    groups = _groups(TOKEN_SPEC)
    tier = groups[f"sloscope-slo-{TIER}"]
    for token in spec.tiers[TIER].tokens:
        family = metric_names.TOKEN_FAMILY[token.sli]
        le = metric_names.le_label(metric_names.le_seconds(token.threshold_ms))
        records = [r for r in tier if r.get("record", "").startswith(f"tier:sloscope_request_{token.sli}_slow:")]
        assert [r["record"].rsplit("rate", 1)[1] for r in records] == ["5m", "30m", "1h", "6h", "3d"]
        # the exact bucket of the threshold, as /metrics labels it for this measure
        assert all(f'{family.name}_bucket{{tier="{TIER}", le="{le}"}}' in r["expr"] for r in records)
        assert le in {metric_names.le_label(b) for b in metric_names.buckets_for(spec, token.sli)}
        alerts = {r["alert"]: r for r in tier if r.get("labels", {}).get("slo") == token.sli and "alert" in r}
        assert set(alerts) == {"SloscopeTokenBudgetBurn", "SloscopeTokenBudgetSlowBurn"}
        page, ticket = alerts["SloscopeTokenBudgetBurn"], alerts["SloscopeTokenBudgetSlowBurn"]
        assert (page["labels"]["severity"], page["labels"]["action"]) == ("page", "raise_sampling")
        assert (ticket["labels"]["severity"], ticket["labels"]["action"]) == ("ticket", "notify_only")
        allowance = format(token.allowance, ".12g")
        assert f"(14.4 * {allowance})" in page["expr"] and f"(1 * {allowance})" in ticket["expr"]
        assert f"increase({family.name}_count{{tier=\"{TIER}\"}}[1h])" in page["expr"]  # the page's guard
        assert family.what in page["annotations"]["description"]
        info = [r["labels"] for r in groups[f"sloscope-slo-meta-{TIER}"]
                if r["record"] == "sloscope_slo_info" and r["labels"]["slo"] == token.sli]
        assert info == [{"tier": TIER, "slo": token.sli, "objective": format(token.percentile, ".12g"),
                         "window": "30d"}]
    # the other tiers, without token objectives, have no token rule
    assert not any(_is_token_rule(r) for name, rules in groups.items() if TIER not in name for r in rules)
    assert {"SloscopeTokenBudgetBurn", "SloscopeTokenBudgetSlowBurn"} <= set(alert_names(spec))
    assert "SloscopeTokenBudgetBurn" not in alert_names(parse_spec(CUSTOM_SPEC))


@pytest.mark.privileged
@pytest.mark.parametrize("window", ["30d", "7d", "28d"])
def test_token_rules_pass_promtool_check(tmp_path, window):
    done = promtool("check", "rules", str(write_rules(tmp_path, parse_spec(TOKEN_SPEC + f"window: {window}\n"))))
    assert done.returncode == 0, done.stdout + done.stderr


def _series(name: str, values: str, **labels) -> dict:
    labels = {"tier": TIER, "service": "vllm", "node": "n1", **labels}
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def _histogram(sli: str, under_threshold_a_minute: int, a_minute: int, minutes: int = 90) -> list[dict]:
    """A token family's series for TIER: `a_minute` requests a minute, `under_threshold_a_minute` of them at or
    under its threshold (the bucket whose le is the threshold, and the count)."""
    family = metric_names.TOKEN_FAMILY[sli]
    token = parse_spec(TOKEN_SPEC).tiers[TIER].token(sli)
    le = metric_names.le_label(metric_names.le_seconds(token.threshold_ms))
    return [_series(f"{family.name}_bucket", f"0+{under_threshold_a_minute}x{minutes}", le=le),
            _series(f"{family.name}_bucket", f"0+{a_minute}x{minutes}", le="+Inf"),
            _series(f"{family.name}_count", f"0+{a_minute}x{minutes}")]


def _expected(rules: dict, alert: str, sli: str) -> list[dict]:
    rule = rules[alert, sli]
    return [{"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}]


@pytest.mark.privileged
def test_the_ttft_page_fires_under_a_fast_burn_and_stays_quiet_on_a_healthy_tier(tmp_path):
    """Generated promtool test. Burning: 20 % of the tier's requests take longer than 400 ms to their first token,
    20 times the 1 % its p99 TTFT objective allows (above 14.4x): the ttft page and ticket fire, and nothing for
    its TPOT, 1 % above 40 ms against a 5 % allowance. Healthy: 0.5 % above 400 ms, half the allowance: silent,
    whether an hour or the whole test has passed."""
    write_rules(tmp_path, parse_spec(TOKEN_SPEC))
    rules = {(r["alert"], r["labels"]["slo"]): r for r in alerts_of(rules_dict(parse_spec(TOKEN_SPEC)))
             if r["labels"].get("tier") == TIER}
    burning = _histogram("ttft", 80, 100) + _histogram("tpot", 99, 100)
    healthy = _histogram("ttft", 995, 1000) + _histogram("tpot", 99, 100)
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [
        {"name": "ttft fast burn", "interval": "1m", "input_series": burning,
         "promql_expr_test": [{"expr": "round(tier:sloscope_request_ttft_slow:ratio_rate5m, 0.001)", "eval_time": "30m",
                               "exp_samples": [{"labels": f'{{tier="{TIER}"}}', "value": 0.2}]}],
         "alert_rule_test": [
             {"alertname": "SloscopeTokenBudgetBurn", "eval_time": "30m",
              "exp_alerts": _expected(rules, "SloscopeTokenBudgetBurn", "ttft")},
             {"alertname": "SloscopeTokenBudgetSlowBurn", "eval_time": "30m",
              "exp_alerts": _expected(rules, "SloscopeTokenBudgetSlowBurn", "ttft")},
             {"alertname": "SloscopeLatencyBudgetBurn", "eval_time": "30m", "exp_alerts": []}]},
        {"name": "healthy ttft", "interval": "1m", "input_series": healthy,
         "alert_rule_test": [{"alertname": alert, "eval_time": at, "exp_alerts": []}
                             for alert in ("SloscopeTokenBudgetBurn", "SloscopeTokenBudgetSlowBurn")
                             for at in ("30m", "90m")]}]}
    (tmp_path / "tokens.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = promtool("test", "rules", "tokens.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
