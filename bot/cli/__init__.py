"""The `muninn` command line, parsed in `main.py`; it imports no discord.py: `cogs.launch` plugs the Discord adapter in."""
