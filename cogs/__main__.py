"""`python -m cogs` is the same as the `muninn` command."""
import sys

from cogs.launch import main

sys.exit(main())
