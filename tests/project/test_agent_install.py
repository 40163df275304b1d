"""The node agent's install, `pip install sloscope` without the server extra: `sloscope collect`, `sloscope probe`
and the SDK head sampler need none of the server's packages, and a server command says which install brings them.

The server's packages are made absent in a child interpreter by an import hook that refuses them, as an
interpreter without them installed would."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULES = ("duckdb", "polars", "pyarrow", "numpy", "grafana_client", "grafana_foundation_sdk", "orjson",
                  "google_crc32c", "lz4", "cramjam", "backports", "chdb", "clickhouse_connect")
WITHOUT_SERVER = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
"""
AGENT_PACKAGES = ("sloscope.probes", "sloscope.collectors")


def run_without_server(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_SERVER + code], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_the_base_install_names_no_server_package():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=;\[ ]", d)[0].lower() for d in project["dependencies"]}
    server = {re.split(r"[<>=;\[ ]", d)[0].lower() for d in project["optional-dependencies"]["server"]}
    assert not base & {"duckdb", "polars", "pyarrow", "numpy", "grafana-client", "grafana-foundation-sdk", "chdb"}
    assert {"duckdb", "polars", "pyarrow", "grafana-client"} <= server


def test_the_agent_and_the_head_sampler_import_without_the_server_packages():
    code = """
import importlib, pkgutil
import sloscope
names = [m.name for m in pkgutil.iter_modules(sloscope.__path__, "sloscope.") if not m.ispkg]
for package in %r:
    names += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
for name in names + ["sloscope.sampling.head_sampler", "sloscope.commands.cli"]:
    importlib.import_module(name)
from opentelemetry.sdk.trace import TracerProvider
from sloscope.sampling.head_sampler import AdaptiveSampler
sampler = AdaptiveSampler("http://127.0.0.1:9/sampling", service="gateway", start=False, fallback_probability=1.0)
provider = TracerProvider(sampler=sampler)
with provider.get_tracer("t").start_as_current_span("GET /v1/completions") as span:
    print("sampled", span.get_span_context().trace_flags.sampled)
print("modules", len(names))
""" % (AGENT_PACKAGES,)
    done = run_without_server(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sampled True" in done.stdout and int(done.stdout.split("modules ")[1]) > 30


@pytest.mark.parametrize("argv, says", [(["collect", "--help"], "--spool-max-bytes"),
                                        (["probe", "--help"], "probe"),
                                        (["probe", "pressure", "--duration", "0.5", "--interval", "0.2"], "")])
def test_the_agent_commands_run_without_the_server_packages(argv, says):
    done = run_without_server(f"import sys\nfrom sloscope.commands.cli import main\nsys.exit(main({argv!r}))")
    assert done.returncode == 0, done.stderr[-3000:]
    assert says in done.stdout


def test_a_node_validates_its_configs_without_the_server_packages(tmp_path):
    collector = tmp_path / "collector.yaml"
    collector.write_text("interval: 5s\nlisten: 127.0.0.1:9465\nspool: {max_bytes: 256Mi}\n")
    twice = tmp_path / "remediation.yaml"
    twice.write_text("execute: false\nexecute: true\n")
    files = [str(collector), str(REPO / "alerts" / "remediation.example.yaml"), str(twice)]
    argv = ["validate", *files]
    done = run_without_server(f"import sys\nfrom sloscope.commands.cli import main\nsys.exit(main({argv!r}))")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{collector}: ok (collector)" in done.stdout and "remediation.example.yaml: ok (remediation)" in done.stdout
    assert f"{twice}:2: not valid YAML: duplicate key 'execute' (first on line 1)" in done.stderr


def test_a_server_command_names_the_install_that_brings_it():
    done = run_without_server("import sys\nfrom sloscope.commands.cli import main\nsys.exit(main(['rca']))")
    assert done.returncode == 2
    assert "sloscope rca needs packages this install does not have" in done.stderr
    assert "pip install 'sloscope[server]'" in done.stderr and "Traceback" not in done.stderr


def test_help_lists_what_this_install_runs_and_names_the_rest():
    done = run_without_server("import sys\nfrom sloscope.commands.cli import main\nsys.exit(main(['--help']))")
    assert done.returncode == 0, done.stderr[-3000:]
    listed = set(re.findall(r"^    (\S+)", done.stdout, re.M))
    assert {"collect", "probe"} <= listed and not {"rca", "serve", "ingest"} & listed
    assert re.search(r"Not in this install: .*rca.*serve", done.stdout.replace("\n", " "))
