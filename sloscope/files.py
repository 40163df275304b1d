"""Durable files: what the node collector's spool and serve's intake log both need of the file system."""

from __future__ import annotations

import os


def fsync_directory(path) -> None:
    """Make a directory's entries durable (a file created, renamed or removed in it): fsync of the file alone
    does not persist its name."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
