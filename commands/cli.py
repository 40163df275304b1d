"""The `sloscope` command: composes the stages. Each stage module contributes its subcommands through
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it."""

from __future__ import annotations

import argparse
import os
import sys

from sloscope.arguments import Parser

STAGE_COMMANDS = (
    "sloscope.simulator.cli",
    "sloscope.analytics.cli",
    "sloscope.commands.demo",
    "sloscope.commands.serve",
    "sloscope.probes.cli",
    "sloscope.alerts.cli",
    "sloscope.sampling.cli",
    "sloscope.collectors.cli",
    "sloscope.dashboards.cli",
)

# Commands one module serves alone: the node collector runs everywhere and for good, and registering every
# stage would load the analytics stack (DuckDB, Arrow, Polars, NumPy: over 100 MiB) that it never uses.
LEAN_COMMANDS = {"collect": "sloscope.collectors.cli"}


def package_version() -> str:
    """The installed distribution's version: pyproject.toml's, the one the image is tagged with."""
    from importlib.metadata import version

    return version("sloscope")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    import importlib

    parser = Parser(
        prog="sloscope",
        description="SLO tiers to physical causes for AI inference fleets: ingest OTLP, find SLO violations "
        "per tier, rank their physical-layer causes with evidence.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (LEAN_COMMANDS[command],) if command in LEAN_COMMANDS else STAGE_COMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sloscope import logs

    words = sys.argv[1:] if argv is None else argv
    args = build_parser(next((w for w in words if not w.startswith("-")), None)).parse_args(argv)
    logs.configure_from(args)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sloscope rca | head`: the reader has what it wanted; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exit's flush does not fail again
        return 141  # as a shell reports a command ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
