"""The images as `make image` builds them (scripts/build-image.sh: a debootstrap of bookworm cached under var/image,
then the Containerfile twice, whose layers podman caches, so a rebuild of an unchanged tree takes seconds), run
with podman: `sloscope --version` says the package version each is tagged with; in the node agent's image,
`sloscope probe node`, with the node's kernel mounts and the DaemonSet's capabilities, loads its eBPF probes, and
the server's packages are absent, so it is the smaller image; the server's image has them."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sloscope.commands.cli import package_version
from tests.conftest import need

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BUILD = ["bash", str(ROOT / "scripts" / "build-image.sh")]
IMAGE = f"localhost/sloscope:{package_version()}"
AGENT_IMAGE = f"localhost/sloscope-agent:{package_version()}"
# What the collector's pod lends it (deploy/daemonset.yaml): kernel headers, BTF, tracefs; and its capabilities.
# podman's default seccomp profile (containers/common) allows bpf(2) only with SYS_ADMIN: map creation fails with
# EPERM under it, the case the DaemonSet's seccompProfile note describes; so no seccomp filter here.
NODE_MOUNTS = ["/lib/modules", "/usr/src", "/sys/kernel/btf", "/sys/kernel/tracing"]
DAEMONSET_CAPS = ["--cap-drop", "ALL", "--cap-add", "BPF,PERFMON,SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
                  "--pid", "host"]


@pytest.fixture(scope="module")
def image():
    need(os.geteuid() == 0, "debootstrap and podman's storage need root")
    need(shutil.which("apt-get") is not None, "the image tools come from Debian (apt-get)")
    built = subprocess.run(BUILD, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    options = subprocess.run(BUILD + ["--print-run-options"], capture_output=True, text=True, check=True)
    return ["podman", "run", "--rm", *options.stdout.split(), *DAEMONSET_CAPS]


@pytest.mark.parametrize("tag", [IMAGE, AGENT_IMAGE])
def test_the_image_is_tagged_with_the_package_version_and_says_so(image, tag):
    done = subprocess.run(image + [tag, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"sloscope {package_version()}"


def test_the_agent_image_holds_no_server_package_and_is_the_smaller(image):
    probe = "import importlib.util; print(*[m for m in ('duckdb', 'polars', 'pyarrow') if importlib.util.find_spec(m)])"
    found = {tag: subprocess.run(image + ["--entrypoint", "python3", tag, "-c", probe], capture_output=True,
                                 text=True, timeout=120).stdout.split() for tag in (IMAGE, AGENT_IMAGE)}
    assert found == {IMAGE: ["duckdb", "polars", "pyarrow"], AGENT_IMAGE: []}
    sizes = {tag: int(subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", tag],
                                     capture_output=True, text=True, check=True).stdout) for tag in (IMAGE, AGENT_IMAGE)}
    assert sizes[AGENT_IMAGE] < sizes[IMAGE]
    refused = subprocess.run(image + [AGENT_IMAGE, "rca"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "sloscope[server]" in refused.stderr


def test_probe_node_loads_the_ebpf_probes_in_the_container(image):
    for path in NODE_MOUNTS:
        need(os.path.isdir(path), f"{path} is missing on this node")
    mounts = [arg for path in NODE_MOUNTS for arg in ("-v", f"{path}:{path}:ro")]
    done = subprocess.run(image + mounts + [AGENT_IMAGE, "probe", "node", "--duration", "2", "--interval", "1",
                                            "--format", "json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    status = {r["requested"]: r for r in records if r["record"] == "status"}
    for probe in ("syscall", "tcp", "block", "runqueue"):
        assert status[probe]["running"] == [probe] and status[probe]["missing"] == [], status[probe]
    names = {r["name"] for r in records if r["record"] == "sample"}
    assert "sloscope.syscall.duration" in names
