"""The spool's set-aside files: batches moved to rejected/ (the receiver refuses them for good) or corrupt/ (they
cannot be trusted), kept for people to look at. They will never be sent, but they take disk inside the spool's byte
bound, so when room is needed they are the first to go, oldest first. Their batches were counted as dropped when
they were set aside: removing the files loses nothing more, and is logged, not counted again."""

from __future__ import annotations

import logging
import os
from typing import Callable

log = logging.getLogger(__name__)


class SetAside:
    """The set-aside files (path -> batch number and bytes of disk) and the disk they take in all."""

    def __init__(self, found: dict[str, tuple[int, int]]):
        self._files = dict(found)
        self.bytes = sum(taken for _seq, taken in found.values())

    def numbers(self) -> list[int]:
        return [seq for seq, _taken in self._files.values()]

    def add(self, path: str, seq: int, taken: int, keep: int) -> None:
        """A batch set aside at `path`; only the `keep` newest of its folder stay."""
        self._files[path] = (seq, taken)
        self.bytes += taken
        folder = os.path.dirname(path)
        for old in self._oldest_first(lambda held: os.path.dirname(held) == folder)[:-keep]:
            self._remove(old)

    def remove_oldest(self, enough: Callable[[int], bool], why: str) -> int:
        """Remove files, oldest first, until enough(bytes of disk freed); the bytes freed."""
        removed, freed = 0, 0
        for path in self._oldest_first(lambda _held: True):
            if enough(freed):
                break
            freed += self._remove(path)
            removed += 1
        if removed:
            log.warning("spool: %s: removed the %d oldest files of rejected/ and corrupt/ (%d bytes of disk)", why,
                        removed, freed)
        return freed

    def _oldest_first(self, which: Callable[[str], bool]) -> list[str]:
        return [path for _seq, path in sorted((seq, path) for path, (seq, _taken) in self._files.items()
                                              if which(path))]

    def _remove(self, path: str) -> int:
        _seq, taken = self._files.pop(path)
        self.bytes -= taken
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("spool: could not remove %s: %s", path, exc)
        return taken
