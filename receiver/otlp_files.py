"""Reading OTLP-JSON files as the OpenTelemetry Collector's file exporter writes them: one export request per
line, plain or gzip (recognised by its magic bytes, whatever the file is called)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"


class FileReadError(OSError):
    pass


def read_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, line) for every non-blank line. A file that cannot be opened or whose
    compression is broken raises FileReadError after the lines read before the damage."""
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise FileReadError(f"{path}: {exc.strerror or exc}") from None
    opener = gzip.open if compressed else open
    lineno = 0
    try:
        with opener(path, "rb") as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError) as exc:
        raise FileReadError(f"{path}:{lineno + 1}: cannot read further: {exc}") from None
