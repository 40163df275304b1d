"""The spool's byte bound holds at every moment: room for a batch is made before it is written, and the files set
aside in rejected/ and corrupt/ count in the bound and are the first to go."""

import os

import pytest

from sloscope.collectors.spool import Spool
from sloscope.collectors.spool_format import HEADER
from tests.collectors.test_spool import disk_taken_by_a_file_of, flip, request

POINTS = 2  # per batch: every batch one block


def taken_under(directory: str) -> int:
    """The disk every file under `directory` takes, its subfolders' included (du's count less the directories'
    own blocks, which the bound leaves out)."""
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, _dirs, names in os.walk(directory) for name in names)


class DiskWatch:
    """The disk taken under the spool directory, measured whenever a file lands in it (os.replace: a batch
    renamed into place, or moved aside), before the spool does anything else."""

    def __init__(self, monkeypatch, directory: str):
        self.directory = directory
        self.taken: list[int] = []
        replace = os.replace

        def measured(source, target, *args, **kwargs):
            replace(source, target, *args, **kwargs)
            self.taken.append(taken_under(directory))

        monkeypatch.setattr(os, "replace", measured)


@pytest.fixture
def block(tmp_path) -> int:
    """What one batch takes on disk: a whole block (skips where the file system keeps it in less)."""
    return disk_taken_by_a_file_of(len(request(POINTS, 0)) + HEADER.size, tmp_path)


def append_watched(spool: Spool, watch: DiskWatch, tag: int) -> None:
    assert spool.append(request(POINTS, tag)) is not None
    watch.taken.append(taken_under(spool.directory))


def test_the_bound_holds_while_each_batch_is_written(tmp_path, monkeypatch, block, caplog):
    spool = Spool(str(tmp_path / "spool"), max_bytes=3 * block)
    watch = DiskWatch(monkeypatch, spool.directory)
    for tag in range(10):
        append_watched(spool, watch, tag)
    assert len(watch.taken) == 20 and max(watch.taken) <= spool.max_bytes  # as each landed, and after each
    assert spool.sequence_numbers() == [7, 8, 9]
    assert spool.dropped_batches == 7 and spool.dropped_points == 7 * POINTS
    assert caplog.text.count("dropped the 1 oldest batches") == 7


def set_aside_two(spool: Spool) -> None:
    """Batches 0 and 1 of 0, 1, 2: 0 refused for good (to rejected/), 1 found corrupt (to corrupt/)."""
    for tag in range(3):
        spool.append(request(POINTS, tag))
    spool.reject(0, "refused on purpose")
    flip(spool.path(1), HEADER.size + 20)
    assert spool.peek()[0] == 2


def set_aside(spool: Spool) -> list[str]:
    return sorted(f"{sub}/{name}" for sub in ("rejected", "corrupt")
                  for name in os.listdir(os.path.join(spool.directory, sub)))


def test_set_aside_files_count_in_the_bound_and_go_first(tmp_path, monkeypatch, block, caplog):
    spool = Spool(str(tmp_path / "spool"), max_bytes=4 * block)
    watch = DiskWatch(monkeypatch, spool.directory)
    set_aside_two(spool)
    assert set_aside(spool) == [f"corrupt/{1:020d}.pb", f"rejected/{0:020d}.pb"] and spool.sequence_numbers() == [2]
    counted = (spool.dropped_batches, spool.dropped_points)  # set aside: lost to the pipeline, counted already
    assert counted == (2, POINTS)  # a corrupt batch's points are unknown
    append_watched(spool, watch, 3)  # 4 blocks: room without removing anything
    assert len(set_aside(spool)) == 2
    append_watched(spool, watch, 4)  # the oldest set-aside file goes, not a batch
    assert set_aside(spool) == [f"corrupt/{1:020d}.pb"] and spool.sequence_numbers() == [2, 3, 4]
    append_watched(spool, watch, 5)
    assert set_aside(spool) == [] and spool.sequence_numbers() == [2, 3, 4, 5]
    assert (spool.dropped_batches, spool.dropped_points) == counted  # not counted twice
    assert caplog.text.count("removed the 1 oldest files of rejected/ and corrupt/") == 2
    for tag in (6, 7, 8):  # nothing set aside is left: the oldest batches go, counted
        append_watched(spool, watch, tag)
    assert spool.sequence_numbers() == [5, 6, 7, 8]
    assert (spool.dropped_batches, spool.dropped_points) == (counted[0] + 3, counted[1] + 3 * POINTS)
    assert max(watch.taken) <= spool.max_bytes


def test_reopening_with_a_smaller_bound_removes_set_aside_files_first(tmp_path, block):
    spool = Spool(str(tmp_path / "spool"), max_bytes=8 * block)
    set_aside_two(spool)
    spool.close()
    again = Spool(str(tmp_path / "spool"), max_bytes=2 * block)
    assert set_aside(again) == [f"corrupt/{1:020d}.pb"] and again.sequence_numbers() == [2]
    assert again.dropped_batches == 0 and taken_under(again.directory) <= again.max_bytes
    assert again.append(request(POINTS, 3)) == 3  # room for it: the last set-aside file goes
    assert set_aside(again) == [] and again.sequence_numbers() == [2, 3]
