"""Log lines of sloscope's commands: each with a UTC timestamp, at the level `--log-level` chooses, as text or
(`--log-format json`) one JSON object per line for a log pipeline.

Messages carry what clients sent (header values, addresses, reasons a payload was refused), so neither format
lets a message break its line: text escapes line breaks, JSON escapes everything it must.
"""

from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


def add_arguments(parser) -> None:
    """--log-level and --log-format on a command's parser; `configure_from(args)` applies them."""
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help="least severe level logged (default: info, or debug with -v)")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="text lines, or one JSON object per line with time, level, logger and message "
                        "(default: %(default)s)")


def configure_from(args) -> None:
    """Logging as the command line asks; commands without the flags log text at info (debug with -v)."""
    verbose = getattr(args, "verbose", False)
    configure(getattr(args, "log_level", None) or ("debug" if verbose else "info"),
              getattr(args, "log_format", "text"))


def configure(level: str = "info", log_format: str = "text", stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`2026-12-01T09:30:00.123Z INFO sloscope.serve: message`; a traceback follows on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)
