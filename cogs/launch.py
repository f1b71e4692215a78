"""The `muninn` command: the command line of `bot.cli` with the Discord adapter plugged in.

The command line itself never imports discord.py; only `muninn run` and `muninn sync`
load it, through `load_discord`, so `muninn recall` starts fast."""
from __future__ import annotations

import sys
from types import ModuleType

from bot.cli.main import main as cli_main


def load_discord() -> ModuleType:
    """The Discord adapter (cogs.adapter), imported only by the commands that need it."""
    from cogs import adapter
    return adapter


def main(argv: list[str] | None = None) -> int:
    """Run the `muninn` command line on `argv` (default: the process's arguments); returns its exit status."""
    return cli_main(argv, load_discord=load_discord)


if __name__ == "__main__":
    sys.exit(main())
