"""The vmstat probe: /proc/vmstat page faults as system.paging.faults (major and minor), from a captured file
and the live /proc; a major fault is counted when a page comes back from disk."""

import mmap
import os
from pathlib import Path

import pytest

from sloscope.probes.procfs.vmstat import SIGNAL, VmstatProbe, parse_vmstat
from sloscope import catalog
from tests.conftest import need

DATA = Path(__file__).parents[1] / "data" / "procfs"


def _proc_with(tmp_path, text):
    (tmp_path / "vmstat").write_text(text)
    return str(tmp_path)


def test_vmstat_fixture_and_catalog():
    counts = parse_vmstat((DATA / "vmstat").read_text())
    assert counts["pgfault"] >= counts["pgmajfault"] > 0
    assert catalog.signal(SIGNAL).attributes == ("system.paging.type",)


def test_vmstat_rejects_garbage_and_missing_counters(tmp_path):
    with pytest.raises(ValueError):
        parse_vmstat("pgfault 1 2\n")
    probe = VmstatProbe(proc=_proc_with(tmp_path, "pgfault 10\n"))
    with pytest.raises(Exception, match="pgmajfault"):
        probe.start()


def test_deltas_split_major_from_minor(tmp_path):
    proc = _proc_with(tmp_path, "pgfault 1000\npgmajfault 10\n")
    probe = VmstatProbe(proc=proc)
    probe.start()
    (tmp_path / "vmstat").write_text("pgfault 1500\npgmajfault 60\n")
    samples = {s.attributes["system.paging.type"]: s for s in probe.collect()}
    assert samples["major"].value == 50 and samples["minor"].value == 450
    assert {s.name for s in samples.values()} == {SIGNAL}


def test_live_major_faults_when_a_mapped_file_comes_back_from_disk(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(4 * 2**20))
    probe = VmstatProbe()
    probe.start()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: the next touch reads the disk
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as weights:
            weights.madvise(mmap.MADV_RANDOM)
            sum(weights[i] for i in range(0, len(weights), 4096))
    finally:
        os.close(fd)
    major = sum(s.value for s in probe.collect() if s.attributes["system.paging.type"] == "major")
    need(major > 0, "the page cache kept the file (a filesystem that ignores POSIX_FADV_DONTNEED)")
    assert major >= 100
