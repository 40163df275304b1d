"""The HTML report draws each incident's path from the entry to its culprit."""

from sloscope.dashboards.report import render
from sloscope.slo_spec import parse_spec
from tests.analytics.test_graph import _store
from tests.analytics.test_judged import SPEC


def test_the_report_draws_the_path_from_the_entry_to_the_culprit(tmp_path):
    """frontend (tier gold) is judged; cart, a call deeper, slowed: the report's episode draws frontend -> cart,
    cart in red with its pod, node and change."""
    with _store(tmp_path, cart_ms=300.0) as store:
        html = render(store, parse_spec(SPEC % ""))
    assert "Culprit, from the entry:" in html
    assert "aria-label='frontend to cart'" in html and "cart-1 on node-b" in html
    assert "of the entry&#x27;s change" in html or "of the entry's change" in html
