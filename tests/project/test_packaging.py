"""What `pip install sloscope` puts into site-packages: one top-level package, `sloscope`, with every stage folder
of the repository as its subpackage (setup.py maps them) and the files the code reads beside it."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the tracked files alone, as a clean clone would build it."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(REPO), "--null", "-T", "-", "-cf", str(src / "src.tar")], input=tracked,
                   check=True)
    subprocess.run(["tar", "-C", str(src), "-xf", str(src / "src.tar")], check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=600)
    built, = out.glob("sloscope-*.whl")
    return built


def test_the_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"sloscope", wheel.name.split("-")[0] + "-" +
                                                 wheel.name.split("-")[1] + ".dist-info"}
    for stage in ("probes", "simulator", "live", "edge", "collectors", "receiver", "enrich", "analytics", "alerts",
                  "sampling", "dashboards", "commands"):
        assert f"sloscope/{stage}/__init__.py" in names, stage
    # what the code reads at run time, beside the modules
    assert {"sloscope/analytics/sql/schema.sql", "sloscope/analytics/sql/clickhouse/sli_windows.sql",
            "sloscope/probes/ebpf/tcp.c", "sloscope/probes/ebpf/hist.h"} <= set(names)


def test_installing_the_wheel_adds_only_sloscope_to_site_packages(wheel, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    added = {p.name for p in site.iterdir()} - before
    assert {n for n in added if not n.endswith(".dist-info")} == {"sloscope"}
    # the installed package imports from its own copy, the stages under its name
    code = "import sloscope.probes.tcp_states as tcp_states; print(tcp_states.__file__)"
    where = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()
    assert Path(where).is_relative_to(site / "sloscope" / "probes")


def test_the_agent_install_runs_the_agent_and_leaves_the_server_out(wheel, tmp_path):
    """`pip install sloscope` for real, its dependencies from the package index (or pip's cache): the node agent's
    commands run, the server's packages are not there, and a server command says which install brings them."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python, sloscope = env / "bin" / "python", env / "bin" / "sloscope"
    installed = subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    absent = subprocess.run([python, "-c", "import importlib.util as found; print(*[m for m in ('duckdb', 'polars', "
                             "'pyarrow', 'numpy', 'grafana_client') if found.find_spec(m)])"],
                            capture_output=True, text=True, check=True, cwd=tmp_path)
    assert absent.stdout.split() == []
    probe = subprocess.run([sloscope, "probe", "pressure", "--duration", "0.5", "--interval", "0.2", "--format",
                            "json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert probe.returncode == 0 and '"record": "status"' in probe.stdout, probe.stderr[-3000:]
    collect = subprocess.run([sloscope, "collect", "--help"], capture_output=True, text=True, timeout=120)
    assert collect.returncode == 0 and "--spool-max-bytes" in collect.stdout
    refused = subprocess.run([sloscope, "serve"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and "pip install 'sloscope[server]'" in refused.stderr, refused.stderr[-3000:]
