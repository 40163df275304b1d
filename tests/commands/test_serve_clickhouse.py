"""`sloscope serve --store chdb:///…`: the read side on ClickHouse's tables answers /metrics, /rca, /sampling and
/readyz as `serve` on a DuckDB file loaded from the same OTLP files does, refuses OTLP with the reason, and refuses
what only a writer does."""

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from argparse import Namespace

import pytest

pytest.importorskip("chdb")

from sloscope import metric_names  # noqa: E402
from sloscope.analytics.stores import open_store  # noqa: E402
from sloscope.commands.cli import main  # noqa: E402
from sloscope.commands.serve_clickhouse import refuse_writer_flags  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from tests.alerting_stack import free_port, wait_listening  # noqa: E402
from tests.collector_exporter import rows_of_files  # noqa: E402
from tests.exporter_versions import create_tables  # noqa: E402
from tests.store_parity import incident_summary  # noqa: E402

COMPARED = {metric_names.REQUESTS, metric_names.REQUEST_ERRORS, metric_names.REQUEST_DURATION, metric_names.INCIDENT_CAUSE_SCORE,
            *(g.name for g in metric_names.GAUGES), *(c.name for c in metric_names.COUNTERS), *(h.name for h in metric_names.SIGNAL_HISTOGRAMS)}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """serve on DuckDB and serve on chDB, loaded from the same simulated fleet (a storage fault at the end); on
    chDB three times: in the tables sloscope ingest makes, in those a Collector of v0.160 or later made first, and
    with the rows written as the clickhouseexporter writes them."""
    tmp = tmp_path_factory.mktemp("both")
    simulate(SimulationConfig(out=tmp / "otlp", nodes=3, seed=4, fault="storage_queue", rate=4.0, duration_s=780))
    files = [str(f) for f in sorted((tmp / "otlp").glob("*.jsonl*"))]
    stores = {"duckdb": f"duckdb:///{tmp}/db.duckdb", "chdb": f"chdb:///{tmp}/ch",
              "chdb_collector_made": f"chdb:///{tmp}/ch_collector_made"}
    create_tables(tmp / "ch_collector_made")
    for url in stores.values():
        assert main(["ingest", "--store", url, *files]) == 0
    stores["chdb_collector_wrote"] = f"chdb:///{tmp}/ch_collector_wrote"  # rows as the exporter writes them
    with open_store(stores["chdb_collector_wrote"]) as store:
        for table, data in rows_of_files(sorted((tmp / "otlp").glob("*.jsonl*"))).items():
            store.backend.insert(table, data)
    procs, ports = {}, {}
    try:
        for name, url in stores.items():
            ports[name] = free_port()
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "sloscope.commands.cli", "serve", "--store", url, "--http", f"127.0.0.1:{ports[name]}",
                 "--grpc", "off"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wait_listening(ports[name], procs[name], f"serve --store {url}")
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def _samples(text: str) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text)
            if family.name in COMPARED or family.name + "_total" in COMPARED for s in family.samples}


@pytest.mark.parametrize("tables", ["chdb", "chdb_collector_made", "chdb_collector_wrote"])
def test_metrics_from_clickhouse_match_metrics_from_duckdb(both, tables):
    urls, _ = both
    duck, ch = (_samples(_get(urls[name] + "/metrics").decode()) for name in ("duckdb", tables))
    assert any(name == metric_names.REQUESTS + "_total" or name == metric_names.REQUESTS for name, _ in duck)
    assert any(name.startswith(metric_names.REQUEST_DURATION + "_bucket") for name, _ in duck)
    assert set(ch) == set(duck)
    for key, value in duck.items():
        assert ch[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


@pytest.fixture(scope="module")
def sampled(both):
    """Every side's /sampling, asked of all at once: each serve computes its policy when first asked and keeps it
    for its interval, from the traffic of the minutes before, so sides asked minutes apart (one test after another)
    would judge the fleet's last minutes at different ages."""
    urls, _ = both
    return {name: json.loads(_get(url + "/sampling")) for name, url in urls.items()}


@pytest.mark.parametrize("tables", ["chdb", "chdb_collector_made", "chdb_collector_wrote"])
def test_rca_and_sampling_from_clickhouse_match_duckdb(both, sampled, tables):
    urls, _ = both
    rca = {name: json.loads(_get(urls[name] + "/rca")) for name in ("duckdb", tables)}
    summary = {name: incident_summary(doc) for name, doc in rca.items()}
    assert summary["duckdb"] and summary[tables] == summary["duckdb"]
    sampling = {name: sampled[name] for name in ("duckdb", tables)}
    assert sampling[tables].keys() == sampling["duckdb"].keys()
    assert json.dumps(sampling[tables], sort_keys=True).count("probability") == \
        json.dumps(sampling["duckdb"], sort_keys=True).count("probability") > 0


@pytest.mark.parametrize("tables", ["chdb", "chdb_collector_wrote"])
def test_graph_from_clickhouse_matches_duckdb(both, tables):
    """GET /graph on both sides of serve: the same services and calls, read from the requests and spans tables
    and from the exporter's otel_traces."""
    urls, _ = both
    shown = {name: json.loads(_get(urls[name] + "/graph?since=1h")) for name in ("duckdb", tables)}
    assert shown["duckdb"]["nodes"] and shown[tables]["nodes"] == shown["duckdb"]["nodes"]
    assert shown[tables]["edges"] == shown["duckdb"]["edges"]


def test_the_clickhouse_side_is_ready_and_refuses_otlp_with_the_reason(both):
    urls, _ = both
    assert _get(urls["chdb"] + "/readyz") == b"ready\n"
    request = urllib.request.Request(urls["chdb"] + "/v1/traces", data=b"{}",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 404 and b"no OTLP intake here" in refused.value.read()


def test_what_only_a_writer_does_is_refused_before_anything_opens(tmp_path, capsys):
    assert main(["serve", "--store", f"chdb:///{tmp_path}/none", "--webhook", "127.0.0.1:9", "--grpc",
                 "127.0.0.1:4317"]) == 2
    err = capsys.readouterr().err
    assert "--webhook" in err and "--grpc" in err and not (tmp_path / "none").exists()


@pytest.mark.parametrize("off", ["off", "OFF", "Off"])
def test_off_in_any_case_is_off_to_the_check_of_what_only_a_writer_does(off):
    """serve reads `off` in any case: --grpc OFF and --webhook Off ask for no listener, --http OFF leaves nothing
    to serve (the check runs before the store opens; serve would otherwise bind nothing and run)."""
    args = Namespace(http="127.0.0.1:0", grpc=off, webhook=off, kube_api=None, retention=None)
    refuse_writer_flags(args)
    with pytest.raises(ValueError) as caught:
        refuse_writer_flags(Namespace(**{**vars(args), "http": off}))
    assert str(caught.value) == "--http off leaves nothing to serve"
    with pytest.raises(ValueError, match="^--grpc: no OTLP intake on a ClickHouse store"):
        refuse_writer_flags(Namespace(**{**vars(args), "grpc": "[::1]:4317"}))


def test_stopping_the_clickhouse_side_exits_cleanly(both):
    _, procs = both
    proc = procs["chdb"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stdout.read()[-3000:]
