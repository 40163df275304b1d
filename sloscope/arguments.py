"""Command-line argument types shared by the stages' commands."""

from __future__ import annotations

import argparse


def above_zero(parse):
    """An argparse type: `parse`, and above zero."""

    def positive(text: str):
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be above zero")
        return value

    positive.__name__ = parse.__name__
    return positive


def zero_or_more(text: str) -> int:
    """An argparse type: a whole number, 0 or more (a per-client cap where 0 turns it off)."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, as every other error of the commands is: the usage block that
    argparse prints above them pushed the reason off a narrow terminal. --help still shows it; subcommands made by
    add_subparsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
