"""The spool on a real full disk: a 2 MiB ext4 file system, loop-mounted (root)."""

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.collectors.spool import Spool
from tests.conftest import need

pytestmark = pytest.mark.privileged

BATCH_BYTES = 60_000


@pytest.fixture
def small_disk(tmp_path):
    need(os.geteuid() == 0, "loop-mounting a file system needs root")
    need(all(shutil.which(tool) for tool in ("mkfs.ext4", "mount", "umount")), "mkfs.ext4, mount and umount")
    image, mountpoint = tmp_path / "disk.img", tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(["truncate", "-s", "2M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", str(image)], check=True)  # -m 0: root has no reserve either
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], capture_output=True, text=True)
    need(mounted.returncode == 0, f"mount -o loop: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def big_request(tag: int) -> bytes:
    """A serialized request of about BATCH_BYTES whose one gauge point carries `tag` (incompressible
    padding, so the file system holds what it is given)."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.add(key="padding").value.string_value = os.urandom(BATCH_BYTES // 2).hex()
    metric = rm.scope_metrics.add().metrics.add(name="hw.gpu.temperature")
    metric.gauge.data_points.add(as_double=float(tag), time_unix_nano=tag + 1)
    return req.SerializeToString()


def tag_of(body: bytes) -> int:
    req = ExportMetricsServiceRequest.FromString(body)
    return int(req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double)


def fill(directory: Path) -> Path:
    """Take every free block with a file of something else; its path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (64 * 1024, 1024, 1):  # big pieces, then what is left of the last blocks
            try:
                while True:
                    os.write(fd, os.urandom(size))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def stray_temporary_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_a_full_disk_drops_the_oldest_batches_and_leaves_no_temporary_files(small_disk, caplog):
    spool = Spool(str(small_disk / "spool"))  # bounds far above the disk: the disk is the bound
    written = [spool.append(big_request(tag)) for tag in range(40)]
    assert all(seq is not None for seq in written)  # every new batch found room, at the oldest's expense
    assert spool.disk_full_batches > 0 and spool.dropped_batches == spool.disk_full_batches
    assert spool.dropped_points == spool.dropped_batches  # one point each, counted as they went
    assert "disk full: dropped the" in caplog.text
    assert stray_temporary_files(small_disk / "spool") == []
    kept = spool.sequence_numbers()
    assert kept == list(range(40 - len(kept), 40)) and len(kept) >= 5  # the newest, without a gap
    assert spool.bytes == sum(os.stat(spool.path(seq)).st_blocks * 512 for seq in kept)  # the disk they take
    seen = []
    while spool:  # every file that was kept is whole
        seq, body, _ = spool.peek()
        seen.append(tag_of(body))
        spool.remove(seq)
    assert seen == kept and spool.corrupt_batches == 0


def test_a_disk_full_of_something_else_drops_the_new_batch_and_goes_on(small_disk, caplog):
    spool = Spool(str(small_disk / "spool"))
    filler = fill(small_disk)
    assert spool.append(big_request(1)) is None  # nothing of its own to drop: the new batch is lost, counted
    assert spool.dropped_batches == spool.disk_full_batches == 1 and spool.dropped_points == 1
    assert "could not be written" in caplog.text and "No space left on device" in caplog.text
    assert stray_temporary_files(small_disk / "spool") == [] and len(spool) == 0
    filler.unlink()
    seq = spool.append(big_request(2))
    assert seq is not None and tag_of(spool.peek()[1]) == 2


def test_room_made_on_a_full_disk_is_durable_across_a_reopen(small_disk):
    spool = Spool(str(small_disk / "spool"))
    for tag in range(30):
        spool.append(big_request(tag))
    spool.close()
    again = Spool(str(small_disk / "spool"))
    assert again.sequence_numbers() == spool.sequence_numbers() and again.bytes == spool.bytes
    assert again.append(big_request(30)) == 30
