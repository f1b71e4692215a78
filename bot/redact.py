"""Secrets out of the log: discord.py logs every HTTP request at DEBUG, and the URL of an
interaction reply or webhook carries its token (valid for 15 minutes, enough to answer as
Muninn). `muninn -v` must be safe to paste into a bug report."""
from __future__ import annotations

import logging
import re

_TOKEN_IN_URL = re.compile(r"(/(?:interactions|webhooks)/\d+/)[A-Za-z0-9_\-.]{20,}")
_BOT_TOKEN = re.compile(r"\b[A-Za-z0-9_\-]{24,28}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}\b")


def redact(text: str) -> str:
    """`text` with interaction/webhook tokens in URLs and bot tokens replaced by "<token>"."""
    return _BOT_TOKEN.sub("<token>", _TOKEN_IN_URL.sub(r"\1<token>", text))


class RedactTokens(logging.Filter):
    """A handler filter that replaces interaction/webhook tokens and bot tokens in each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the record's formatted message in place; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken record is logging's business, not ours
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of `logger` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactTokens) for f in handler.filters):
            handler.addFilter(RedactTokens())
