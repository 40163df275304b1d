"""The HTML report of a token incident charts the token time's percentile against its objective, and lists the
tiers' token objectives."""

from sloscope.analytics.store import Store
from sloscope.dashboards.report import render
from sloscope.slo_spec import parse_spec
from tests.analytics.test_token_slo import _ingest, _requests
from tests.inference_fleet import SPEC


def test_a_ttft_incident_is_charted_on_its_own_time(tmp_path):
    with Store(tmp_path / "vllm.duckdb") as store:
        _ingest(store, tmp_path, _requests(ttft_factor=4.0))
        html = render(store, parse_spec(SPEC))
    assert "ttft p95 ≤ 400 ms, tpot p95 ≤ 40 ms, queue p99 ≤ 300 ms" in html
    assert "p95 time to first token per 10 s" in html and "objective 400 ms" in html
    assert "time to first token p95" in html  # the incident's SLI in the summary
