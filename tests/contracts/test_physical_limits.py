"""The SLO spec's `physical_limits` (docs/slo-spec.md): parsed and refused as the rest of the spec, recorded with
the database, and the one source of the physical alerts' thresholds and of the node dashboard's lines for them."""

import shutil
from pathlib import Path

import pytest

from sloscope.alerts.rules import RuleOptions, prometheus_rule, render_rules, rules_dict
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.dashboards import grafana
from sloscope.slo_spec import DEFAULT_SPEC_YAML, PHYSICAL_LIMIT_KEYS, PhysicalLimits, SpecError, load_spec, parse_spec
from tests.alerts.test_rules import PROMTOOL_TESTS, alerts_of, promtool, write_rules

# Regenerate with `sloscope rules > tests/data/rules/built-in.yml` only when a change of the rules is meant.
BUILT_IN_RULES = Path(__file__).parents[1] / "data" / "rules" / "built-in.yml"
SPEC_PAGE = Path(__file__).resolve().parents[2] / "docs" / "slo-spec.md"

# tests/promtool/physical_limits.yml tests the rules of this spec
LIMITS_SPEC = DEFAULT_SPEC_YAML + """\
physical_limits:
  gpu_utilization_percent: 95
  nvme_temperature_c: 70
  spdk_bdev_wait: 7.5ms
  spdk_reactor_busy_percent: 85
  node_error_percent: 2
"""
MOVED_LIMITS = PhysicalLimits(gpu_utilization=0.95, nvme_temperature_c=70, spdk_bdev_wait_s=0.0075,
                       spdk_reactor_busy=0.85, node_error_ratio=0.02)


def with_limits(*lines: str) -> str:
    return DEFAULT_SPEC_YAML + "physical_limits:\n" + "".join(f"  {line}\n" for line in lines)


def physical_alerts(spec) -> dict:
    group = next(grp for grp in rules_dict(spec)["groups"] if grp["name"] == "sloscope-physical")
    return {rule["alert"]: rule for rule in alerts_of({"groups": [group]})}


# --- the spec ------------------------------------------------------------------------------------------------------

def test_without_the_section_the_limits_are_the_field_s():
    assert load_spec(None).physical_limits == PhysicalLimits(0.8, 65, 0.005, 0.7, 0.05)


def test_percentages_are_read_as_ratios_and_the_wait_as_a_duration():
    assert parse_spec(LIMITS_SPEC).physical_limits == MOVED_LIMITS


def test_a_key_left_out_keeps_its_default():
    limits = parse_spec(with_limits("nvme_temperature_c: 70")).physical_limits
    assert limits == PhysicalLimits(nvme_temperature_c=70)


@pytest.mark.parametrize("wait", ["5ms", "0.005", "5 ms", "0.005s"])
def test_the_bdev_wait_is_any_duration_of_the_one_grammar(wait):
    assert parse_spec(with_limits(f"spdk_bdev_wait: {wait}")).physical_limits.spdk_bdev_wait_s == pytest.approx(0.005)


@pytest.mark.parametrize("line, message", [
    ("gpu_utilisation_percent: 90", "physical_limits: unknown key 'gpu_utilisation_percent' (expected "
                                    "gpu_utilization_percent, nvme_temperature_c, spdk_bdev_wait, "
                                    "spdk_reactor_busy_percent, node_error_percent)"),
    ("gpu_utilization_percent: 120", "physical_limits.gpu_utilization_percent: expected a number in [10, 100]; "
                                     "got 120"),
    ("gpu_utilization_percent: 0.95", "expected a number in [10, 100]; got 0.95 (a percent, as availability is "
                                      "written: 95 for 95 %)"),
    ("spdk_reactor_busy_percent: 5", "physical_limits.spdk_reactor_busy_percent: expected a number in [10, 100]"),
    ("node_error_percent: 0", "physical_limits.node_error_percent: expected a number in (0, 100]; got 0"),
    ("spdk_reactor_busy_percent: 70%", "physical_limits.spdk_reactor_busy_percent: expected a number; got '70%'"),
    ("node_error_percent: .nan", "physical_limits.node_error_percent: expected a number; got nan"),
    ("node_error_percent: true", "physical_limits.node_error_percent: expected a number; got True"),
    ("nvme_temperature_c: 338", "physical_limits.nvme_temperature_c: expected a number in (0, 150]; got 338"),
    ("spdk_bdev_wait: fast", "physical_limits.spdk_bdev_wait: expected a duration like"),
    ("spdk_bdev_wait: 1m", "physical_limits.spdk_bdev_wait: expected a duration of at most 30s"),
])
def test_bad_limits_name_file_line_key_and_expectation(tmp_path, line, message):
    path = tmp_path / "slo.yaml"
    path.write_text(with_limits(line))
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    line_number = 11 if "unknown key" in message else 12  # an unknown key: the section's line, as evidence[n]'s
    assert str(exc.value).startswith(f"{path}:{line_number}: ") and message in str(exc.value)


def test_a_section_that_is_not_a_mapping_says_which_keys_it_takes():
    with pytest.raises(SpecError, match=r"physical_limits: expected a mapping with keys gpu_utilization_percent, "):
        parse_spec(DEFAULT_SPEC_YAML + "physical_limits: [95]\n")


def test_limits_recorded_with_the_database_are_read_back(tmp_path):
    slo, db = tmp_path / "slo.yaml", tmp_path / "s.duckdb"
    slo.write_text(LIMITS_SPEC)
    with Store(db) as store:
        assert store.spec(slo).physical_limits == MOVED_LIMITS
    slo.unlink()
    with Store(db, read_only=True) as store:
        assert store.spec().physical_limits == MOVED_LIMITS


def test_the_spec_page_lists_every_limit_with_its_true_default():
    rows = [line.split("|") for line in SPEC_PAGE.read_text().splitlines() if line.startswith("| `physical_limits.")]
    keys = [row[1].strip(" `").removeprefix("physical_limits.") for row in rows]
    assert keys == list(PHYSICAL_LIMIT_KEYS)
    defaults = [f"{key}: {row[3].strip(' `')}" for key, row in zip(keys, rows)]
    assert parse_spec(with_limits(*defaults)).physical_limits == PhysicalLimits()


# --- the rules -----------------------------------------------------------------------------------------------------

def test_without_the_section_the_rule_file_is_byte_for_byte_the_one_before_it_existed():
    assert render_rules(load_spec(None)) == BUILT_IN_RULES.read_text()
    assert render_rules(parse_spec(DEFAULT_SPEC_YAML + "physical_limits: {}\n", "<built-in>")) == \
        BUILT_IN_RULES.read_text()


def test_each_physical_alert_compares_and_states_the_spec_s_threshold():
    alerts = physical_alerts(parse_spec(LIMITS_SPEC))
    for name, compared, stated in [("SloscopeGpuSaturated", "> 0.95\n", "above 95% for"),
                                   ("SloscopeNvmeHot", "> 70\n", "above 70 C for"),
                                   ("SloscopeSpdkBdevWaitHigh", "> 0.0075\n", "above 7.5 ms for"),
                                   ("SloscopeSpdkReactorBusy", "> 0.85\n", "busier than 85% for"),
                                   ("SloscopeNodeErrorRatioHigh", "> 0.02\n", "More than 2% of the requests")]:
        assert compared in alerts[name]["expr"] and stated in alerts[name]["annotations"]["description"], name


def test_the_node_error_alert_s_chance_bar_is_that_of_a_node_at_the_spec_s_ratio():
    rule = physical_alerts(parse_spec(LIMITS_SPEC))["SloscopeNodeErrorRatioHigh"]
    assert "(increase(sloscope_requests_total[1m])) * 0.02 + " in rule["expr"] and "0.05" not in rule["expr"]
    assert "than a node at 2% would have" in rule["annotations"]["description"]


def test_the_prometheus_rule_carries_the_spec_s_thresholds():
    doc = prometheus_rule(parse_spec(LIMITS_SPEC), "sloscope", None, {}, RuleOptions(hold="15s"))
    gpu = next(r for r in alerts_of(doc["spec"]) if r["alert"] == "SloscopeGpuSaturated")
    assert gpu["expr"] == "sloscope_gpu_utilization_ratio > 0.95\n" and gpu["for"] == "15s"


def test_cli_writes_rules_from_the_spec_s_limits_and_refuses_bad_ones(tmp_path, capsys):
    slo = tmp_path / "slo.yaml"
    slo.write_text(LIMITS_SPEC)
    assert main(["rules", "--slo", str(slo)]) == 0
    assert "sloscope_nvme_temperature_celsius > 70\n" in capsys.readouterr().out
    slo.write_text(with_limits("nvme_temperature_c: hot"))
    assert main(["rules", "--slo", str(slo)]) == 2
    assert f"{slo}:12: physical_limits.nvme_temperature_c: expected a number" in capsys.readouterr().err


@pytest.mark.privileged
def test_promtool_fires_past_the_spec_s_thresholds_and_not_between_them_and_the_defaults(tmp_path):
    shutil.copy(PROMTOOL_TESTS / "physical_limits.yml", tmp_path / "physical_limits.yml")
    write_rules(tmp_path, parse_spec(LIMITS_SPEC))
    done = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # each test lists only the series past the spec's threshold: one between it and the default firing fails it
    done = promtool("test", "rules", "physical_limits.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the node dashboard --------------------------------------------------------------------------------------------

def node_panels(spec) -> dict:
    board = grafana.to_json(grafana.node_dashboard(spec))
    return {p["title"]: p for p in board["panels"] if p["type"] != "row"}


def threshold_line(panel: dict) -> float:
    return panel["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"]


def test_the_node_dashboard_draws_the_spec_s_thresholds():
    panels = node_panels(parse_spec(LIMITS_SPEC))
    assert threshold_line(panels["SPDK bdev I/O wait"]) == pytest.approx(0.0075)
    assert "above the dashed line (7.5 ms)" in panels["SPDK bdev I/O wait"]["description"]
    assert threshold_line(panels["SPDK reactor busy"]) == pytest.approx(0.85)
    assert threshold_line(panels["NVMe temperature"]) == 70
    assert "above 70 C drives throttle" in panels["NVMe temperature"]["description"]


def test_a_limit_the_spec_leaves_out_keeps_its_default_line():
    panels = node_panels(parse_spec(with_limits("nvme_temperature_c: 72")))
    assert [threshold_line(panels[t]) for t in ("SPDK bdev I/O wait", "SPDK reactor busy", "NVMe temperature")] == \
        [0.005, 0.7, 72]
    assert "above the dashed line (5 ms)" in panels["SPDK bdev I/O wait"]["description"]


def test_the_limits_that_are_seed_thresholds_are_the_analysis_seeds_too():
    """What the alerts call harmful by itself, the analysis does too: a spec's NVMe, SPDK wait and reactor limits
    move the taxonomy's seed thresholds on those signals, and nothing else."""
    spec = parse_spec(DEFAULT_SPEC_YAML + "physical_limits: {nvme_temperature_c: 70, spdk_bdev_wait: 8ms, "
                             "spdk_reactor_busy_percent: 85, gpu_utilization_percent: 95}\n")
    seeds = {cause.id: cause.seed_threshold for cause in spec.taxonomy.causes}
    assert seeds["storage_thermal"] == {"sloscope.nvme.temperature": 70.0}
    assert seeds["storage_queue"] == {"spdk.bdev.io.wait": 0.008, "spdk.reactor.busy": 0.85}
    built_in = {cause.id: cause.seed_threshold for cause in load_spec(None).taxonomy.causes}
    assert {k: v for k, v in seeds.items() if k not in ("storage_thermal", "storage_queue")} == \
        {k: v for k, v in built_in.items() if k not in ("storage_thermal", "storage_queue")}
    assert built_in["storage_thermal"] == {"sloscope.nvme.temperature": 65.0}
