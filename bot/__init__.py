"""Muninn's memory engine and conversation pipeline (no Discord imports here; see cogs/)."""
__version__ = "0.1.0"

import os

# Before numpy is first imported (any module of bot/ may be the first): the vector search runs
# many small products at once, one core each, and BLAS threads would only fight over the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
