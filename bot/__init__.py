"""Muninn's memory engine and conversation pipeline (no Discord imports here; see cogs/)."""
__version__ = "0.1.0"
