"""The `sloscope` command: composes the stages. Each stage module contributes its subcommands through
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it.

`sloscope COMMAND` loads only the module of COMMAND: the node agent's commands (collect, probe) run where only
`pip install sloscope` is installed, and start without loading the analytics stack (DuckDB, Arrow, Polars,
NumPy: over 100 MiB) they never use. A command whose module needs the server's packages, where they are not
installed, is refused with the install that brings them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import version

from sloscope import logs
from sloscope.arguments import Parser

# Each command, by the module that registers it (tests/commands/test_cli.py holds this to what the modules register).
COMMANDS = {
    "simulate": "sloscope.simulator.cli",
    "ingest": "sloscope.analytics.cli", "rca": "sloscope.analytics.cli", "graph": "sloscope.analytics.cli",
    "retention": "sloscope.analytics.cli",
    "clickhouse-columns": "sloscope.analytics.cli",
    "demo": "sloscope.commands.demo",
    "serve": "sloscope.commands.serve",
    "probe": "sloscope.probes.cli",
    "rules": "sloscope.alerts.cli", "webhook": "sloscope.alerts.cli",
    "sampling": "sloscope.sampling.cli",
    "collect": "sloscope.collectors.cli",
    "dashboards": "sloscope.dashboards.cli", "report": "sloscope.dashboards.cli",
    "validate": "sloscope.commands.validate",
}
SERVER_INSTALL = "pip install 'sloscope[server]'"
EXIT_USAGE = 2


class NeedsServer(Exception):
    """A command whose module imports a package this install lacks (the node agent's install, say)."""

    def __init__(self, command: str, missing: str):
        super().__init__(f"sloscope {command} needs packages this install does not have (no module {missing!r}): "
                         f"{SERVER_INSTALL} brings them")


def package_version() -> str:
    """The installed distribution's version: pyproject.toml's, the one the image is tagged with."""
    return version("sloscope")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of COMMAND alone where it is one of ours; of every command whose packages are installed else
    (for --help), naming the others. NeedsServer where COMMAND's own packages are missing."""
    parser = Parser(
        prog="sloscope",
        description="SLO tiers to physical causes for AI inference fleets: ingest OTLP, find SLO violations "
        "per tier, rank their physical-layer causes with evidence.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    missing = {}
    for module in [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values()):
        try:
            importlib.import_module(module).register(subparsers)
        except ModuleNotFoundError as exc:
            if (exc.name or "sloscope").split(".")[0] == "sloscope":  # our own code missing is a bug, not an install
                raise
            if command in COMMANDS:
                raise NeedsServer(command, exc.name) from None
            missing.update({name: exc.name for name, of in COMMANDS.items() if of == module})
    if missing:
        parser.epilog = (f"Not in this install: {', '.join(sorted(missing))} (they need the server's packages: "
                         f"{SERVER_INSTALL}).")
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(next((w for w in words if not w.startswith("-")), None))
    except NeedsServer as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
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
