"""`python -m bot` is the same as the `muninn` command."""
import sys

from .cli import main

sys.exit(main())
