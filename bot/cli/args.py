"""The command line's argument types: each checks one option's text and says what is wrong in one line."""
from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from bot import validate


class UsageError(Exception):
    """Bad command-line input found after parsing; the message is shown as one line."""


class OneLineParser(argparse.ArgumentParser):
    """A parser whose errors are one line on stderr (what is wrong, and where the help is), not
    argparse's usage block; its subcommands' parsers are of this class too. Its epilog (the
    examples) is printed as written."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print `muninn CMD: what is wrong (see muninn CMD --help)` and exit with status 2."""
        print(f"{self.prog}: {validate.replace_invalid(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def add_command(sub: Any, common: argparse.ArgumentParser, name: str, handler: Any, summary: str,
                *examples: str, no_json: str | None = None) -> argparse.ArgumentParser:
    """Register one subcommand: its one-line `summary` (help and description), its `examples`
    (each a command line after `muninn `, shown under --help) and its handler; `no_json` says
    why it refuses --json, for a command with no result to print. Returns its parser, for its arguments."""
    parser = sub.add_parser(name, parents=[common], help=summary, description=summary + ".",
                            epilog="examples:\n" + "\n".join(f"  muninn {example}" for example in examples))
    parser.set_defaults(handler=handler, no_json=no_json)
    return parser


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{validate.replace_invalid(repr(text))} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def recall_limit(text: str) -> int:
    """How many memories a recall returns: 1 to validate.MAX_RECALL_LIMIT."""
    value = positive_int(text)
    if value > validate.MAX_RECALL_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {validate.MAX_RECALL_LIMIT}")
    return value


def snowflake(text: str) -> int:
    """A Discord id (user, channel, guild or memory)."""
    try:
        value = validate.snowflake(text, "id", optional=False)
    except validate.Invalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert value is not None
    return value


def importance(text: str) -> float:
    """A memory's importance: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{validate.replace_invalid(repr(text))} is not a number") from None
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value
