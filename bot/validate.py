"""One validation of every value that enters Muninn from outside: import lines, recall batch
lines, command-line arguments, slash-command arguments and LLM output.

Each function returns the clean value or raises `Invalid` (a ValueError) whose message
names the field and says what is allowed, so a caller can report it in one line and
skip just that input. The rules:
  ids         whole numbers in SQLite's int64 range, not negative (Discord snowflakes fit)
  numbers     finite (no NaN, no infinity) and inside the field's range
  times       ISO-8601 text (naive = UTC) or unix seconds, not before 2000; a creation time
              at most a day ahead of now; an `as_of` at most a day ahead when it touches
              memories (a far-future touch would pin them so they never fade), otherwise
              before 2100
  booleans    JSON true/false only ("false" is a string, not a boolean)
  text        a str that encodes as UTF-8: stored text with a lone surrogate is rejected;
              a query has them replaced by U+FFFD (it only searches)
  limits      whole numbers from 1 to a cap
"""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

INT64_MAX = 2**63 - 1
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc).timestamp()
LATEST_AS_OF = datetime(2100, 1, 1, tzinfo=timezone.utc).timestamp()
FUTURE_SLACK_S = 86400.0          # clocks differ; a day ahead is still believable
MAX_RECALL_LIMIT = 200            # recall asks vec0 for 3 x limit candidates; vec0 refuses k > 4096
MAX_EXTERNAL_ID_CHARS = 200


class Invalid(ValueError):
    """An input value is not acceptable; the message names the field and the rule."""


def snowflake(value: Any, name: str, *, optional: bool = True) -> int | None:
    """An id: a non-negative whole number (or digit string) that fits SQLite's int64."""
    if value is None or value == "":
        if optional:
            return None
        raise Invalid(f"{name} is required")
    if isinstance(value, bool):
        raise Invalid(f"{name} {value!r} must be a numeric id")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 40:
        number = int(value)
    elif isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        number = int(value)
    else:
        raise Invalid(f"{name} {_short(value)} must be a numeric id")
    if not 0 <= number <= INT64_MAX:
        raise Invalid(f"{name} {_short(value)} is out of range (0 to {INT64_MAX})")
    return number


def number(value: Any, name: str, *, low: float, high: float) -> float:
    """A finite number within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{name} {_short(value)} must be a number from {low:g} to {high:g}")
    try:
        result = float(value)
    except OverflowError:
        raise Invalid(f"{name} {_short(value)} is too large") from None
    if not math.isfinite(result) or not low <= result <= high:
        raise Invalid(f"{name} {_short(value)} must be a number from {low:g} to {high:g}")
    return result


def timestamp(value: Any, name: str, *, latest: float | None = None, now: float | None = None) -> float | None:
    """Unix seconds from ISO-8601 text or a number, between 2000 and `latest`
    (default: now + one day). None stays None."""
    if value is None:
        return None
    now = time.time() if now is None else now
    latest = now + FUTURE_SLACK_S if latest is None else latest
    if isinstance(value, bool):
        raise Invalid(f"{name} {value!r} must be ISO-8601 text or unix seconds")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise Invalid(f"{name} {_short(value)} is not a usable time") from None
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise Invalid(f"{name} {_short(value)} is not ISO-8601 (e.g. 2026-04-05T21:14:00Z)") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        seconds = moment.timestamp()
    else:
        raise Invalid(f"{name} {_short(value)} must be ISO-8601 text or unix seconds")
    if not math.isfinite(seconds) or seconds < EARLIEST:
        raise Invalid(f"{name} {_short(value)} is before 2000-01-01 (or not a time)")
    if seconds > latest:
        raise Invalid(f"{name} {_short(value)} is too far in the future (latest {_iso(latest)})")
    return seconds


def as_of(value: Any, *, touch: bool, now: float | None = None) -> float | None:
    """The moment a recall is evaluated at: at most a day ahead when it touches memories."""
    now = time.time() if now is None else now
    latest = now + FUTURE_SLACK_S if touch else LATEST_AS_OF
    try:
        return timestamp(value, "as_of", latest=latest, now=now)
    except Invalid as exc:
        if touch and "future" in str(exc):
            raise Invalid(f"{exc}; a future as_of only works with no_touch (--no-touch)") from None
        raise


def boolean(value: Any, name: str, *, default: bool = False) -> bool:
    """JSON true or false (absent = default); anything else is refused, "false" included."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise Invalid(f"{name} {_short(value)} must be true or false")
    return value


def limit(value: Any, name: str = "limit", *, cap: int = MAX_RECALL_LIMIT) -> int | None:
    """A result limit: a whole number from 1 to `cap`; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise Invalid(f"{name} {_short(value)} must be a whole number from 1 to {cap}")
    return value


def stored_text(value: Any, name: str = "text") -> str:
    """Text that will be stored: a string that is valid Unicode (no lone surrogates)."""
    if not isinstance(value, str):
        raise Invalid(f"{name} must be a string")
    if not encodable(value):
        raise Invalid(f"{name} contains invalid characters (a lone surrogate, i.e. broken UTF-16/UTF-8); "
                      "rejected: fix the text")
    return value


def query_text(value: Any, name: str = "query") -> tuple[str, bool]:
    """A query: invalid characters are replaced by U+FFFD. Returns (text, whether replaced)."""
    if not isinstance(value, str):
        raise Invalid(f"{name} must be a string")
    if encodable(value):
        return value, False
    return replace_invalid(value), True


def replace_invalid(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (for output that must not fail)."""
    if encodable(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


def external_id(value: Any) -> str | None:
    """The id an imported item has in its data set: text or a whole number,
    stored as 1 to MAX_EXTERNAL_ID_CHARS characters of text; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Invalid(f"external_id {_short(value)} must be text or a whole number")
    text = stored_text(str(value), "external_id")
    if not text or len(text) > MAX_EXTERNAL_ID_CHARS:
        raise Invalid(f"external_id must have 1 to {MAX_EXTERNAL_ID_CHARS} characters")
    return text


def message_ids(value: Any, name: str = "source_message_ids") -> list[str]:
    """A list of message ids (numbers or text), stored as text."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(f"{name} must be a list of message ids")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise Invalid(f"{name} must hold only ids (numbers or text)")
        if isinstance(item, int):
            snowflake(item, name)
        out.append(stored_text(str(item), name))
    return out


def reject_json_constant(name: str) -> float:
    """For json.loads(parse_constant=...): NaN and Infinity are not JSON; Python accepts them."""
    raise Invalid(f"{name} is not a number JSON allows")


def encodable(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (False: it holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _short(value: Any) -> str:
    """A value for an error message: repr, made safe to print and cut short."""
    text = replace_invalid(repr(value))
    return text if len(text) <= 40 else text[:37] + "..."
