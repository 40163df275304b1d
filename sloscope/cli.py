"""The `sloscope` command: composes the stages. Each stage module contributes its subcommands through
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it."""

from __future__ import annotations

import argparse
import logging
import sys

STAGE_COMMANDS = (
    "simulator.cli",
    "analytics.cli",
    "sloscope.demo",
    "sloscope.serve",
    "probes.cli",
    "alerts.cli",
    "collectors.cli",
    "dashboards.cli",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="sloscope",
        description="SLO tiers to physical causes for AI inference fleets: ingest OTLP, find SLO violations "
        "per tier, rank their physical-layer causes with evidence.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in STAGE_COMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
