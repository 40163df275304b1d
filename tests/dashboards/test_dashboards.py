"""Dashboards as code, and the self-contained HTML incident report (opened in headless Chromium where it is
installed). Their provisioning into Grafana: tests/dashboards/test_grafana_push.py."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from sloscope import metric_names
from sloscope.alerts.audit import schema as remediation_schema
from sloscope.alerts.rules import rules_dict
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.times import parse_time
from sloscope.analytics.store import Store
from sloscope.dashboards import grafana
from sloscope.dashboards.report import Episode, _grafana_link, episodes, render, signal_unit
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec, parse_spec
from tests.conftest import need

SPEC = load_spec(None)
OTHER_SPEC = parse_spec("""
default_tier: batch
tiers:
  interactive: {latency: {percentile: 90, threshold_ms: 250}, availability: 99.95}
  batch: {latency: {percentile: 50, threshold_ms: 5000}, availability: 99}
  premium: {latency: {percentile: 99.9, threshold_ms: 120}, availability: 99.99}
window: 7d
resolution: 15s
""")


# --- helpers -------------------------------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                   "unless", "inf", "nan"}


def series_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, keywords, labels, durations or numbers)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        before = e[m.start() - 1] if m.start() else " "
        if before.isdigit() or before in ".$":
            continue
        if e[m.end():].lstrip().startswith("(") or m.group(0).lower() in PROMQL_KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def queries(board: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every Prometheus panel target, query variable and annotation of a dashboard."""
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("type", "prometheus") == "prometheus":
                out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"])
            assert m, var["query"]
            out.append((f"variable {var['name']}", m.group(1)))
    for ann in board["annotations"]["list"]:
        out.append((f"annotation {ann['name']!r}", ann["expr"]))
    return out


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def decode_png(path: Path) -> tuple[int, int, int, list[bytes]]:
    """A minimal PNG reader (8-bit RGB/RGBA, not interlaced): (width, height, bytes per pixel, rows)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), w * bpp
    prev, rows, i = bytearray(stride), [], 0
    for _ in range(h):
        f, cur = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += stride + 1
        if f == 1:
            for k in range(bpp, stride):
                cur[k] = (cur[k] + cur[k - bpp]) & 255
        elif f == 2:
            cur = bytearray(map(lambda a, b: (a + b) & 255, cur, prev))
        elif f == 3:
            for k in range(stride):
                cur[k] = (cur[k] + (((cur[k - bpp] if k >= bpp else 0) + prev[k]) >> 1)) & 255
        elif f == 4:
            for k in range(stride):
                a, b, c = (cur[k - bpp] if k >= bpp else 0), prev[k], (prev[k - bpp] if k >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[k] = (cur[k] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(cur))
        prev = cur
    return w, h, bpp, rows


# --- fixtures ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def boards():
    return grafana.build_all(SPEC)


@pytest.fixture(scope="module")
def sim_db(tmp_path_factory):
    """A small simulated fleet with a storage-queue fault on one node, ingested."""
    out = tmp_path_factory.mktemp("sim")
    truth = simulate(SimulationConfig(out=out / "otlp", nodes=3, seed=3, fault="storage_queue", rate=4.0,
                                      duration_s=960, workers=1))
    db = out / "sloscope.duckdb"
    with Store(db) as store:
        Ingestor(store, TierResolver.from_spec(SPEC)).ingest_files(sorted((out / "otlp").glob("*.jsonl*")))
    with Store(db, read_only=True) as store:
        result = analyse(store, SPEC, top=3)
    assert result["incidents"], "the simulated fault must produce incidents"
    return db, truth, result


# --- dashboards ----------------------------------------------------------------------------------------------------

def test_promql_name_extraction():
    assert series_names('sum by (le) (rate(a_bucket{le="0.8", node=~"$node"}[$__rate_interval]))') == {"a_bucket"}
    assert series_names("(1 - sum(rate(b[5m])) / sum(rate(c[5m]))) / 0.01 or vector(0) * 1e3") == {"b", "c"}
    assert series_names("min_over_time(timestamp(d{x=\"y\"})[$__range:$__interval]) - 600") == {"d"}


def test_every_query_names_only_series_that_serve_exports(boards):
    allowed = metric_names.exported_series() | {grafana.ALERTS_SERIES}
    used = set()
    for board in boards.values():
        for where, expr in queries(board):
            names = series_names(expr)
            assert names, f"{board['uid']} {where}: no series in {expr!r}"
            assert names <= allowed, f"{board['uid']} {where}: not exported: {sorted(names - allowed)}"
            used |= names
    # The physical signals the exporter has are all on the node dashboard.
    node_used = {n for _, e in queries(boards[grafana.NODE_UID]) for n in series_names(e)}
    assert {f.name for f in metric_names.GAUGES} <= node_used
    # ALERTS (Prometheus's own series) is only used for alerts of the generated rules that carry an action label.
    alert_rules = [r for grp in rules_dict(SPEC)["groups"] for r in grp["rules"] if "alert" in r]
    assert alert_rules and all("action" in r["labels"] for r in alert_rules)
    assert grafana.ALERTS_SERIES in used


def test_queried_series_are_what_the_exporter_renders(sim_db, boards):
    from prometheus_client.parser import text_string_to_metric_families

    from sloscope.alerts.store_metrics import render as render_metrics

    db, _, _ = sim_db
    with Store(db, read_only=True) as store:
        body, _ = render_metrics(store, SPEC, gauge_max_age_s=None, incident_lookback_s=10**7,
                                 incident_open_s=10**9)
    rendered = set()
    for family in text_string_to_metric_families(body.decode()):
        rendered |= {s.name for s in family.samples}
        if family.type == "gauge":  # a gauge family is rendered (HELP, TYPE) even while no node reports it
            rendered.add(family.name)
        if family.type == "counter":  # so is a counter family (no remediation decision yet, say)
            rendered.add(family.name + "_total")
    used = {n for b in boards.values() for _, e in queries(b) for n in series_names(e)} - {grafana.ALERTS_SERIES}
    assert used <= rendered, f"queried but not in a scrape of a store with data: {sorted(used - rendered)}"


def test_exporter_gaps_are_exactly_the_panels_left_out(boards):
    node_titles = {p["title"] for p in panels(boards[grafana.NODE_UID])}
    exported = metric_names.exported_series()
    gaps = grafana.exporter_gaps()
    for gap in gaps:
        assert gap.series not in exported and gap.series + "_bucket" not in exported
        assert gap.panel not in node_titles and not any(t.startswith(gap.panel) for t in node_titles)
    wanted_panels = {"NVLink throughput", "PCIe throughput", "Block I/O latency", "TCP retransmits", "Pressure stall",
                     "Run-queue delay", "Syscall latency"}
    present = {t for t in node_titles for w in wanted_panels if t.startswith(w)}
    missing = {gp.panel for gp in gaps}
    assert {w for w in wanted_panels if any(t.startswith(w) for t in present)} | (missing & wanted_panels) \
        == wanted_panels, "every wanted panel is either on the dashboard or listed as a gap"
    print("exporter gaps:", [(gp.panel, gp.constant, gp.series) for gp in gaps])


def test_dashboards_are_pure_functions_of_the_spec(boards):
    assert grafana.build_all(SPEC) == boards
    other = grafana.build_all(OTHER_SPEC)
    overview = other[grafana.OVERVIEW_UID]
    rows = [p["title"] for p in overview["panels"] if p["type"] == "row"]
    assert [r.split(":")[0] for r in rows[1:]] == [f"Tier {t}" for t in OTHER_SPEC.tiers]
    exprs = [e for _, e in queries(overview)]
    for t in OTHER_SPEC.tiers.values():
        le = metric_names.le_label(t.threshold_ms / 1000)
        assert any(f'tier="{t.name}"' in e and f'le="{le}"' in e for e in exprs), t.name
        latency = next(p for p in panels(overview) if p["title"].startswith(f"{t.name}: p"))
        steps = latency["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[-1]["value"] == pytest.approx(t.threshold_ms / 1000)
        assert latency["targets"][0]["expr"].startswith(f"histogram_quantile({t.percentile / 100:.12g},")
    assert any("[7d]" in e for e in exprs) and not any("[30d]" in e for e in exprs)
    tier_var = next(v for v in overview["templating"]["list"] if v["name"] == "tier")
    assert tier_var["query"] == "interactive,batch,premium"


@pytest.mark.parametrize("spec", [SPEC, OTHER_SPEC], ids=["30d", "7d"])
def test_burn_panels_read_the_alerts_burn_windows(spec):
    """The burn-rate panels plot each alert's long window with the alert's own factors as thresholds."""
    from sloscope.alerts.burn import PAGE, burn_windows

    burns = burn_windows(spec.window_s)
    overview = grafana.build_all(spec)[grafana.OVERVIEW_UID]
    for t in spec.tiers:
        for title in (f"{t}: latency budget burn rate", f"{t}: error budget burn rate"):
            panel = next(p for p in panels(overview) if p["title"] == title)
            assert [q["legendFormat"] for q in panel["targets"]] == [b.long for b in burns]
            assert all(f"[{b.long}]" in q["expr"] for q, b in zip(panel["targets"], burns))
            steps = [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]]
            assert steps == [min(b.factor for b in burns), min(b.factor for b in burns if b.kind == PAGE)]
            for b in burns:
                assert f"{b.factor_text} over {b.long} and {b.short} ({b.kind})" in panel["description"]


def test_units_on_every_panel_and_stable_uids(boards):
    assert set(boards) == {grafana.OVERVIEW_UID, grafana.NODE_UID, grafana.INCIDENTS_UID}
    for uid, board in boards.items():
        assert board["uid"] == uid and len(uid) <= 40
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for p in panels(board):
            assert p["fieldConfig"]["defaults"].get("unit"), f"{uid}: panel {p['title']!r} has no unit"


def test_datasource_is_a_configurable_template_variable():
    built = grafana.build_all(SPEC, datasource_uid="prom-eu-1")
    for board in built.values():
        ds = next(v for v in board["templating"]["list"] if v["type"] == "datasource")
        assert ds["name"] == "datasource" and ds["query"] == "prometheus"
        assert ds["current"]["value"] == "prom-eu-1"
        for p in panels(board):
            if p["type"] == "nodeGraph":  # serve's /graph, through the `api` data source (its own test)
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        names = [v["name"] for v in board["templating"]["list"]]
        assert names == ["datasource", "tier", "service", "node"] + (["api"] if board["uid"] == grafana.OVERVIEW_UID
                                                                     else [])
        for where, expr in queries(board):  # every panel and annotation follows the node selection
            follows = 'node=~"$node"' in expr or 'target=~".*$node.*"' in expr  # actions name their node
            assert where.startswith("variable") or follows, (board["uid"], where)
            if board["uid"] != grafana.NODE_UID and where.startswith("panel"):
                assert 'tier=~"$tier"' in expr or 'tier="' in expr, (board["uid"], where)


def test_json_round_trips_through_the_sdk_models(boards):
    from grafana_foundation_sdk.models import prometheus, stat, table, timeseries

    options_type = {"timeseries": timeseries.Options, "stat": stat.Options, "table": table.Options}
    for board in boards.values():
        model = grafana.parse(json.loads(json.dumps(board)))
        assert grafana.dumps(model) == board
        for panel in model.panels:
            if panel.type_val == "row":
                continue
            if panel.type_val == "nodeGraph":  # the Infinity plugin's queries, which the SDK has no model of
                assert {t.data["refId"] for t in panel.targets} == {"nodes", "edges"}
                continue
            assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets), panel.title
            if panel.type_val in options_type:
                assert isinstance(panel.options, options_type[panel.type_val]), panel.title


def test_incidents_link_to_the_node_dashboard_over_the_incident_range(boards):
    board = boards[grafana.INCIDENTS_UID]
    tbl = next(p for p in panels(board) if p["type"] == "table")
    exprs = {t["refId"]: t["expr"] for t in tbl["targets"]}
    assert all(t["instant"] and t["format"] == "table" for t in tbl["targets"])
    assert exprs["D"].endswith(f"- {grafana.INCIDENT_LINK_BEFORE_S}) * 1000")
    assert exprs["E"].endswith(f"+ {grafana.INCIDENT_LINK_AFTER_S}) * 1000")
    link = next(prop["value"][0] for o in tbl["fieldConfig"]["overrides"] if o["matcher"]["options"] == "node"
                for prop in o["properties"] if prop["id"] == "links")
    assert link["url"].startswith(f"/d/{grafana.NODE_UID}/")
    assert "var-node=${__data.fields.node}" in link["url"]
    assert "from=${__data.fields.from_ms}&to=${__data.fields.to_ms}" in link["url"]
    organize = next(t for t in tbl["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    assert organize["Value #D"] == "from_ms" and organize["Value #E"] == "to_ms"
    for board in boards.values():
        ann = board["annotations"]["list"][0]
        assert ann["expr"].startswith('ALERTS{alertstate="firing"') and "{{action}}" in ann["titleFormat"]


def test_queries_parse_with_promtool(boards, tmp_path):
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    values = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "30s"}
    rules = []
    for board in boards.values():
        for n, (_, expr) in enumerate(queries(board)):
            text = re.sub(r"\$__rate_interval|\$__range|\$__interval|\$\w+",
                          lambda m: values.get(m.group(0), ".*"), expr)
            rules.append({"record": f"dashboard:{board['uid'].replace('-', '_')}:q{n}", "expr": text})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_build_command_writes_one_file_per_dashboard(tmp_path, capsys):
    assert main(["dashboards", "build", "-o", str(tmp_path), "--datasource-uid", "abc"]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(grafana.file_name(u) for u in grafana.BUILDERS)
    board = json.loads((tmp_path / grafana.file_name(grafana.OVERVIEW_UID)).read_text())
    assert board == grafana.build_all(SPEC, "abc")[grafana.OVERVIEW_UID]
    err = capsys.readouterr().err
    for gap in grafana.exporter_gaps():
        assert gap.series in err


# --- report --------------------------------------------------------------------------------------------------------

def test_report_structure(sim_db, tmp_path, capsys):
    db, truth, result = sim_db
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(db), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    html = out.read_text()
    # Self-contained: nothing to fetch, nothing to run.
    for forbidden in ("<script", " src=", "<link", "@import", "url(", "<iframe"):
        assert forbidden not in html, forbidden
    assert not re.search(r'href="https?://', html)
    eps = episodes(result["incidents"])
    node = truth.fault["node"]
    assert any(ep.node == node for ep in eps)
    n_sli = len(result["incidents"])
    n_evidence = sum(len(c["evidence"]) for ep in eps for c in ep.causes[:3])
    n_paths = html.count("Culprit, from the entry:")  # the trace graph's, drawn without a time axis
    assert html.count("<svg ") == n_sli + n_evidence + n_paths
    assert html.count('class="shade"') == n_sli + n_evidence
    for inc in result["incidents"]:
        assert f"SLI {inc['tier']} / {inc['service']} on {inc['node']}" in html
        objective = SPEC.tiers[inc["tier"]]
        assert f"objective {objective.threshold_ms:g} ms" in html
    top = next(ep for ep in eps if ep.node == node).causes[0]
    assert top["cause"] == truth.fault["cause"]
    assert f"Suggested remediation:</b> {top['remediation']}".replace("'", "&#x27;") in html
    for ev in top["evidence"]:
        assert f"onset {parse_time(ev['onset'], None):%H:%M:%S}" in html
        assert f"<code>{ev['signal']}</code>" in html
    assert "has no remediation audit" in html
    assert '&quot;incidents&quot;' in html  # the rca JSON is embedded for reference


def test_a_node_name_cannot_write_markup_or_links_into_the_report():
    t0 = datetime(2026, 1, 1, 12, 0)
    hostile = Episode("n'><script>alert(1)</script>", t0, t0 + timedelta(minutes=1))
    assert re.fullmatch(r"episode-[A-Za-z0-9-]+", hostile.anchor)
    assert Episode("a b", t0, t0).anchor != Episode("a-b", t0, t0).anchor  # names apart, ids apart
    link = _grafana_link("http://grafana:3000", Episode("a&from=0#x", t0, t0), t0, t0 + timedelta(minutes=1))
    assert "var-node=a%26from%3D0%23x&amp;from=" in link


def test_report_shows_the_remediation_taken(sim_db, tmp_path):
    db, truth, result = sim_db
    copy = tmp_path / "with-audit.duckdb"
    shutil.copy(db, copy)
    node = truth.fault["node"]
    ep = next(e for e in episodes(result["incidents"]) if e.node == node)
    acted = ep.start + timedelta(seconds=60)
    with Store(copy) as store:
        store.con.execute(remediation_schema())
        insert = ("INSERT INTO remediation_audit (ts, alert, fingerprint, starts_at, action, target, params, decision, "
                  "reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
        store.con.execute(insert, [acted, "SloscopeCauseStorageQueue", "fp1", ep.start, "spdk_qos_limit",
                                   f"bdev:{node}/Nvme0n1", json.dumps({"node": node}), "executed", None])
        store.con.execute(insert, [acted, "SloscopeGpuSaturated", "fp2", ep.start, "nft_drain_backend",
                                   "backend:some-other-node", "{}", "dry_run", None])
    with Store(copy, read_only=True) as store:
        html = render(store, SPEC)
    assert "<h3>Remediation taken</h3><table>" in html
    assert f"bdev:{node}/Nvme0n1" in html and "spdk_qos_limit: executed" in html  # table row and chart marker
    assert "some-other-node" not in html


def test_report_without_incidents(sim_db):
    db, truth, _ = sim_db
    before = parse_time(truth.fault["onset"], None) - timedelta(minutes=2)
    with Store(db, read_only=True) as store:
        html = render(store, SPEC, until=before)
    assert "No SLO violations" in html and "<svg" not in html


def test_signal_units():
    assert signal_unit("spdk.bdev.io.wait") == "s"
    assert signal_unit("sloscope.pressure.stall") == "ratio"  # seconds stalled per second
    assert signal_unit("hw.gpu.io") == "bytes/s"
    assert signal_unit("sloscope.tcp.retransmits") == "segment/s"
    assert signal_unit("hw.gpu.memory.usage", "growth_per_min") == "ratio"


@pytest.mark.privileged
def test_report_renders_in_headless_chromium(sim_db, tmp_path):
    chromium = shutil.which("chromium")
    need(chromium is not None, "chromium (Debian package chromium) is not installed")
    db, _, result = sim_db
    out = tmp_path / "report.html"
    with Store(db, read_only=True) as store:
        out.write_text(render(store, SPEC))
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2000"]
    png = tmp_path / "shot.png"
    shot = subprocess.run([*flags, f"--screenshot={png}", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert png.exists(), shot.stderr[-2000:]
    w, h, bpp, rows = decode_png(png)
    assert (w, h) == (1400, 2000)
    white = b"\xff\xff\xff"
    non_white = red = 0
    for row in rows:
        for k in range(0, len(row), bpp):
            px = row[k:k + 3]
            if px != white:
                non_white += 1
                if px[0] > 180 and px[1] < 90 and px[2] < 90:
                    red += 1
    assert non_white > 0.03 * w * h, f"the page looks blank: {non_white} non-white pixels"
    assert red > 500, "no chart lines (the incident's series are drawn red)"
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<svg") == out.read_text().count("<svg ") and dom.count("<polyline") >= len(result["incidents"])


def test_the_service_graph_panel_reads_the_fields_serve_s_graph_gives(boards, tmp_path):
    """The node-graph panel's Infinity queries ask GET /graph for the dashboard's range and map its fields onto
    the panel's frames (id, title, mainstat, ...; source and target for edges): every field they read is one
    /graph answers."""
    from datetime import timedelta

    from sloscope.analytics.rca import graph_answer
    from tests.analytics.test_graph import T0, _store

    [panel] = [p for p in boards[grafana.OVERVIEW_UID]["panels"] if p["type"] == "nodeGraph"]
    targets = {t["refId"]: t for t in panel["targets"]}
    assert set(targets) == {"nodes", "edges"}
    assert all(t["datasource"] == {"type": "yesoreyeram-infinity-datasource", "uid": "${api}"}
               and t["url"].startswith("/graph?since=${__from:date:iso}&until=") for t in targets.values())
    assert {"id", "title", "mainstat"} <= {c["text"] for c in targets["nodes"]["columns"]}
    assert {"id", "source", "target"} <= {c["text"] for c in targets["edges"]["columns"]}
    with _store(tmp_path, seconds=60) as store:
        shown = graph_answer(store, "2026-12-01T12:00:00.000Z", "2026-12-01T12:01:00.000Z")
    assert shown["since"] == "2026-12-01T12:00:00Z" and not shown["clipped"]
    for root in ("nodes", "edges"):
        assert {c["selector"] for c in targets[root]["columns"]} <= set(shown[root][0]), root
    api = [v for v in boards[grafana.OVERVIEW_UID]["templating"]["list"] if v["name"] == "api"]
    assert api and api[0]["query"] == "yesoreyeram-infinity-datasource"
