"""Mistakes a newcomer makes on the command line: each is one line on stderr with what to do, exit status 2 for a
usage error, found before anything is created or written; and outputs that say what really happened."""

import gzip
import http.server
import json
import re
import subprocess
import sys
import threading

import pytest

from sloscope.analytics.store import Store, StoreError
from sloscope.commands.cli import build_parser, main
from tests.otlp_builders import gauge, metrics, span, traces, write_lines

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000


def _one_line_error(err: str, *expected: str) -> None:
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert all(text in err for text in expected), err


def _requests_file(tmp_path):
    return write_lines(tmp_path / "t.jsonl", [traces([span(f"{i:032x}", f"{i:016x}", T0 + i * S, 100)
                                                      for i in range(1, 4)])])


def _store_with_requests(tmp_path):
    db = tmp_path / "x.duckdb"
    assert main(["ingest", "--db", str(db), str(_requests_file(tmp_path))]) == 0
    return db


# --- the store: only DuckDB's own files ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, content", [("g.json", b'{"a": 1}\n'), ("t.jsonl.gz", gzip.compress(b"{}\n"))])
def test_a_file_that_is_not_a_duckdb_database_is_refused_by_writers_and_readers(tmp_path, capsys, name, content):
    db = tmp_path / name
    db.write_bytes(content)
    assert main(["ingest", "--db", str(db), str(_requests_file(tmp_path))]) == 2
    _one_line_error(capsys.readouterr().err, f"{db}: not a DuckDB database file")
    assert main(["rca", "--db", str(db)]) == 2
    _one_line_error(capsys.readouterr().err, f"{db}: not a DuckDB database file")
    assert db.read_bytes() == content


def test_a_database_that_does_not_open_file_backed_is_refused():
    with pytest.raises(StoreError, match="not a DuckDB database file"):
        Store(":memory:")  # what DuckDB makes of some files it does not own: nothing written would last


# --- retention ----------------------------------------------------------------------------------------------------

def test_retention_refuses_a_kept_period_without_a_unit_and_says_the_cutoff(tmp_path, capsys):
    db = _store_with_requests(tmp_path)
    capsys.readouterr()
    assert main(["retention", "--db", str(db), "--keep", "7"]) == 2
    _one_line_error(capsys.readouterr().err, "--keep", "'7'", "unit", "7d")
    assert main(["retention", "--db", str(db), "--keep", "7d"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"older than \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(kept 7d before now\)", err), err


def test_retention_on_a_clickhouse_store_is_refused_before_anything_is_created(tmp_path, capsys):
    assert main(["retention", "--store", f"chdb:///{tmp_path}/chx", "--keep", "7d"]) == 2
    _one_line_error(capsys.readouterr().err, "ttl")
    assert not (tmp_path / "chx").exists()


# --- rca ------------------------------------------------------------------------------------------------------------

def test_rca_on_a_store_without_requests_says_so_rather_than_that_objectives_were_met(tmp_path, capsys):
    db = tmp_path / "m.duckdb"
    only_metrics = write_lines(tmp_path / "m.jsonl", [metrics([gauge("hw.gpu.temperature", [(T0, 50.0)])])])
    assert main(["ingest", "--db", str(db), str(only_metrics)]) == 0
    capsys.readouterr()
    assert main(["rca", "--db", str(db), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"incidents": []}
    _one_line_error(err, "holds no requests")
    assert main(["rca", "--db", str(db), "--format", "table"]) == 0
    out, err = capsys.readouterr()
    assert "holds no requests" in out and "No SLO violations" not in out and "holds no requests" in err


def test_rca_on_a_range_outside_the_stored_requests_says_it_holds_none(tmp_path, capsys):
    db = _store_with_requests(tmp_path)
    capsys.readouterr()
    assert main(["rca", "--db", str(db), "--since", "2030-01-01T00:00:00Z", "--format", "table"]) == 0
    out, err = capsys.readouterr()
    assert "holds no requests" in out and "holds no requests" in err


@pytest.mark.parametrize("flags, expected", [
    (["--since", "2025-11-29T11:00:00Z", "--until", "2025-11-29T10:00:00Z"], ("--until", "not after --since")),
    (["--since", "0s"], ("--since: ", "above zero")),
    (["--until", "0m"], ("--until: ", "above zero")),
    (["--at", "0"], ("--at: ", "above zero")),
    (["--since", "yesterday"], ("--since: ", "neither an RFC 3339 time nor a duration")),
])
def test_rca_names_the_flag_whose_time_is_wrong(tmp_path, capsys, flags, expected):
    db = _store_with_requests(tmp_path)
    capsys.readouterr()
    assert main(["rca", "--db", str(db), *flags]) == 2
    _one_line_error(capsys.readouterr().err, *expected)


# --- ingest ---------------------------------------------------------------------------------------------------------

def test_ingest_refuses_a_missing_input_or_a_directory_before_creating_the_store(tmp_path, capsys):
    db = tmp_path / "x.duckdb"
    good = _requests_file(tmp_path)
    assert main(["ingest", "--db", str(db), str(good), str(tmp_path / "missing.jsonl")]) == 2
    _one_line_error(capsys.readouterr().err, "missing.jsonl: no such file")
    assert main(["ingest", "--db", str(db), str(tmp_path)]) == 2
    _one_line_error(capsys.readouterr().err, f"{tmp_path}: a directory")
    assert not db.exists()


def test_ingest_names_a_file_it_cannot_read_once(tmp_path, capsys):
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b'{"resourceSpans": []}\n' * 100)[:40])
    proto = tmp_path / "spans.proto"
    proto.write_bytes(len(b"\x0a\x00").to_bytes(4, "big") + b"\x0a\x00")  # the file exporter's format: proto
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(broken), str(proto)]) == 1
    refused = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("ingested")]
    assert len(refused) == 2 and all(line.count(str(tmp_path)) == 1 for line in refused), refused


# --- simulate and demo -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out, expected", [("afile", "a file of that name"), ("afile/sub", "cannot create it")])
def test_simulate_refuses_an_output_directory_it_cannot_make(tmp_path, capsys, out, expected):
    (tmp_path / "afile").write_text("")
    assert main(["simulate", "--out", str(tmp_path / out), "--nodes", "2", "--duration", "3m", "--rate", "2"]) == 2
    _one_line_error(capsys.readouterr().err, f"{tmp_path / out}", expected)


def test_demo_refuses_an_unknown_fault_before_it_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--simulated", "--fault", "nosuch", "--dir", str(tmp_path / "demo")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and "simulating" not in err
    assert "--fault: unknown cause 'nosuch'" in err.splitlines()[-1]
    assert not (tmp_path / "demo").exists()


# --- sampling --------------------------------------------------------------------------------------------------------

def test_sampling_at_says_what_it_takes(tmp_path, capsys):
    db = _store_with_requests(tmp_path)
    capsys.readouterr()
    assert main(["sampling", "policy", "--db", str(db), "--at", "1h"]) == 2
    _one_line_error(capsys.readouterr().err, "--at", "RFC 3339", "latest", "'1h'")
    assert main(["sampling", "policy", "--db", str(db), "--at", "2025-11-29T10:00:02Z"]) == 0


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_sampling_url_errors_name_the_url(capsys):
    url = "http://127.0.0.1:1/sampling"  # nothing listens on port 1
    assert main(["sampling", "policy", "--url", url]) == 2
    _one_line_error(capsys.readouterr().err, f"--url {url}: ")
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sampling"
        assert main(["sampling", "policy", "--url", url]) == 2
        _one_line_error(capsys.readouterr().err, f"--url {url}: answered 404")
    finally:
        server.shutdown()
        server.server_close()


# --- webhook ---------------------------------------------------------------------------------------------------------

def test_webhook_max_body_takes_serves_sizes():
    def max_body(*flags):
        return build_parser("webhook").parse_args(["webhook", "--config", "r.yaml", *flags]).max_body

    assert max_body("--max-body", "1MiB") == max_body() == 2**20
    assert max_body("--max-body", "64KiB") == 65536 and max_body("--max-body", "4096") == 4096
    for wrong in ("0", "1MB2"):
        with pytest.raises(SystemExit):
            max_body("--max-body", wrong)


def test_serve_refuses_a_retention_without_a_unit():
    done = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "serve", "--retention", "7"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "argument --retention: '7' has no unit" in done.stderr


def test_report_on_a_store_without_requests_says_there_was_nothing_to_judge(tmp_path, capsys):
    db = tmp_path / "empty.duckdb"
    Store(db).close()
    out = tmp_path / "r.html"
    assert main(["report", "--db", str(db), "-o", str(out)]) == 0
    html = out.read_text()
    assert "Nothing to judge" in html and "No SLO violations" not in html
    assert main(["report", "--db", str(db), "-o", str(out), "--since", "2026-01-02T00:00:00Z",
                 "--until", "2026-01-01T00:00:00Z"]) == 2
    assert "--until 2026-01-01T00:00:00Z is not after --since" in capsys.readouterr().err


def test_the_webhook_refuses_an_audit_database_that_is_not_a_duckdb_file(tmp_path, capsys):
    audit, config = tmp_path / "alerts.json", tmp_path / "remediation.yaml"
    audit.write_text("{}")
    config.write_text("execute: false\nactions: {}\n")
    assert main(["webhook", "--config", str(config), "--db", str(audit), "--listen", "127.0.0.1:0"]) == 2
    assert "not a DuckDB database file" in capsys.readouterr().err


@pytest.mark.parametrize("hold, written", [("90", "90s"), ("1h30m", "90m"), ("1.5s", "1500ms"), ("15s", "15s")])
def test_rules_hold_takes_the_one_duration_grammar_and_writes_prometheus_durations(capsys, hold, written):
    assert main(["rules", "--hold", hold]) == 0
    assert f"for: {written}\n" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["ingest", "--batch-rows", "0", "x.jsonl"], "argument --batch-rows: '0': must be above zero"),
    (["serve", "--http", "localhost", "--db", "{tmp}/s.duckdb"], "--http: expected HOST:PORT"),
])
def test_counts_and_addresses_are_refused_in_one_line(tmp_path, argv, says):
    done = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", *[a.format(tmp=tmp_path) for a in argv]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, says", [
    (["collect", "--probe", "nosuch", "--print-config"], "unknown probe 'nosuch'"),
    (["rules", "--label", "release=x"], "--label goes with --format prometheusrule"),
    (["clickhouse-columns", "--store", "duckdb:///x.duckdb"], "the columns are for a ClickHouse store"),
])
def test_options_that_would_do_nothing_are_refused(capsys, argv, says):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["rca", "--top", "x"], "sloscope rca: argument --top: invalid int value: 'x' (see sloscope rca --help)"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["collect", "--interval"], "sloscope collect: argument --interval: expected one argument"),
])
def test_a_flag_the_parser_refuses_is_one_line_without_the_usage_block(argv, says):
    done = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" not in done.stderr
    _one_line_error(done.stderr, says)
