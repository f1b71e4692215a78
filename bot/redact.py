"""Secrets out of everything Muninn prints: log lines, error messages, `muninn doctor` and every
`--json` output. `muninn -v` must be safe to paste into a bug report.

Two kinds of settings hold secrets (their `kind` in bot/settings.py): a token ("secret",
DISCORD_TOKEN) is shown as `***` entirely; a URL ("url": OLLAMA_URL, which may list several
hosts, and MUNINN_DATABASE_URL) keeps its scheme, host, port and path, so an operator can tell
which server a message is about, while its user name and password both become `***` (a user
name alone is often a token too: https://TOKEN@host) and so does the value of every query
parameter that looks secret (password=, token=, api_key=, ...). `shown` is the one function
that turns a setting's value into what may be printed.

The logging filter is the safety net behind it: from every record it removes the configured
secret values (`remember`: the token, the passwords inside the URLs), any URL's user name and
password, and the tokens discord.py logs at DEBUG (the URL of an interaction reply or webhook
carries its token, valid for 15 minutes, enough to answer as Muninn)."""
from __future__ import annotations

import logging
import re
from urllib.parse import unquote, urlsplit

HIDDEN = "***"

_TOKEN_IN_URL = re.compile(r"(/(?:interactions|webhooks)/\d+/)[A-Za-z0-9_\-.]{20,}")
_BOT_TOKEN = re.compile(r"\b[A-Za-z0-9_\-]{24,28}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}\b")
# The user name and password of any URL in free text: scheme://USER:PASSWORD@host.
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s?#@]+(?:@[^/\s?#@]+)*@")
_SECRET_KEY = r"[\w.\-]*(?:pass|pwd|token|secret|key|auth|sig|credential)[\w.\-]*"
_SECRET_PARAM = re.compile(rf"([?&]{_SECRET_KEY}=)[^&\s#'\"]+", re.IGNORECASE)
_IS_SECRET_KEY = re.compile(rf"^{_SECRET_KEY}$", re.IGNORECASE)
# Shorter remembered values are not searched for in free text: they would cut ordinary words.
# The structural rules above still hide them inside URLs.
MIN_SECRET = 4
# A URL's user name without a password is searched for only when it is this long (a token).
TOKEN_LIKE = 16

_remembered: set[str] = set()


def redact_url(value: str) -> str:
    """One URL, or several separated by commas, with the user name, the password and the values of
    secret query parameters replaced by `***`: http://***@gpu1:11434/ollama?api_key=***."""
    return ",".join(_one_url(part) for part in value.split(","))


def _one_url(url: str) -> str:
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # not a URL we can take apart: hide any user:password@ in it all the same
        return _SECRET_PARAM.sub(rf"\1{HIDDEN}", _USERINFO.sub(rf"\1{HIDDEN}@", url))
    if not parts.scheme or not (parts.netloc or parts.query):
        return _SECRET_PARAM.sub(rf"\1{HIDDEN}", _USERINFO.sub(rf"\1{HIDDEN}@", url))
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = f"{HIDDEN}@{hostport}" if at else hostport
    query = "&".join(_hidden_param(pair) for pair in parts.query.split("&")) if parts.query else ""
    lead = url[:len(url) - len(url.lstrip())]
    return (f"{lead}{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
            + (f"#{parts.fragment}" if parts.fragment else ""))


def _hidden_param(pair: str) -> str:
    key, eq, _ = pair.partition("=")
    return f"{key}={HIDDEN}" if eq and _IS_SECRET_KEY.match(key) else pair


def shown(kind: str, value: object) -> str:
    """A setting's value as it may be printed: "secret" -> `***` (empty stays empty, so "no token"
    still shows), "url" -> `redact_url`, any other kind -> the value itself."""
    text = "" if value is None else str(value)
    if kind == "secret":
        return HIDDEN if text.strip() else ""
    if kind == "url":
        return redact_url(text)
    return text


def secrets_in(kind: str, value: str) -> set[str]:
    """The parts of a setting's value that must never be printed: a whole token; the user names,
    passwords and secret query values of URLs (as written and percent-decoded)."""
    if kind == "secret":
        return {value.strip()} if value.strip() else set()
    if kind != "url":
        return set()
    found: set[str] = set()
    for url in value.split(","):
        try:
            parts = urlsplit(url.strip())
        except ValueError:
            continue
        userinfo, at, _ = parts.netloc.rpartition("@")
        if at:
            user, colon, password = userinfo.partition(":")
            if colon and password:
                found.update({password, unquote(password)})
            elif len(user) >= TOKEN_LIKE:  # https://TOKEN@host; a plain user name is no secret
                found.update({user, unquote(user)})
        for pair in parts.query.split("&"):
            key, eq, secret = pair.partition("=")
            if eq and secret and _IS_SECRET_KEY.match(key):
                found.update({secret, unquote(secret)})
    return {secret for secret in found if secret}


def remember(secrets: set[str] | list[str]) -> None:
    """The values the log filter and `scrub` remove wherever they appear from now on (see
    `secrets_in`), in place of those remembered before: the settings in use are the ones to hide."""
    _remembered.clear()
    _remembered.update(secret for secret in secrets if len(secret) >= MIN_SECRET)


def scrub(text: str, secrets: set[str] | list[str] | None = None) -> str:
    """`text` without the remembered secret values (and `secrets`, if given): each becomes `***`.
    Nothing else changes, so output that quotes people's words stays faithful."""
    found = _remembered if secrets is None else _remembered | {s for s in secrets if len(s) >= MIN_SECRET}
    for secret in sorted(found, key=len, reverse=True):  # longest first: one may contain another
        if secret in text:
            text = text.replace(secret, HIDDEN)
    return text


def redact(text: str, secrets: set[str] | list[str] | None = None) -> str:
    """`text` without remembered secrets (and `secrets`), URL user names and passwords, secret query
    values, interaction/webhook tokens in URLs and bot tokens (the Discord ones become "<token>")."""
    text = _SECRET_PARAM.sub(rf"\1{HIDDEN}", _USERINFO.sub(rf"\1{HIDDEN}@", scrub(text, secrets)))
    return _BOT_TOKEN.sub("<token>", _TOKEN_IN_URL.sub(r"\1<token>", text))


class RedactTokens(logging.Filter):
    """A handler filter that takes every secret out of each record (`redact`): its message, and the
    traceback of an exception logged with it."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the record's formatted message (and traceback) in place; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken record is logging's business, not ours
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of `logger` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactTokens) for f in handler.filters):
            handler.addFilter(RedactTokens())
