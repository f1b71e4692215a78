"""What chat models answer, made usable: reasoning stripped, JSON repaired and checked.

Small models wrap JSON in code fences or `<think>` blocks, or answer a bare list where an
object was asked: all accepted. An invalid answer is retried once with the reason."""
from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from bot.llm.errors import OllamaError, OllamaUnavailable

if TYPE_CHECKING:
    from bot.llm.servers import LLMClient

log = logging.getLogger(__name__)
T = TypeVar("T")

class InvalidReply(ValueError):
    """The model's answer cannot be used; the message says why (it is sent back on retry)."""


# -- robust JSON from a chat model ---------------------------------------------

_TAGS = r"(?:think|thinking|reasoning|thought)"
_THINK_BLOCK = re.compile(rf"<({_TAGS})\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(rf"<{_TAGS}\b[^>]*>.*$", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = re.compile(rf"</{_TAGS}\s*>", re.IGNORECASE)
# gpt-oss's "harmony" format, when a template leaves it raw: the answer is the final channel.
_HARMONY_FINAL = re.compile(r"<\|channel\|>\s*final\s*<\|message\|>", re.IGNORECASE)
_HARMONY_TOKEN = re.compile(r"<\|(?:start|end|return|channel|message|call)\|>", re.IGNORECASE)
_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
_TAG_STARTS = ("<think", "<thinking", "<reasoning", "<thought", "<|channel|>", "</think", "</thinking",
               "</reasoning", "</thought")


def strip_thinking(raw: str) -> str:
    """A reply without the model's reasoning: `<think>` blocks (any case, also `<thinking>`,
    `<reasoning>`, `<thought>`), an unclosed block (the rest is reasoning), the reasoning before
    a lone closing tag (the chat template opened the block in the prompt, as QwQ and
    DeepSeek-R1 templates do), and gpt-oss's analysis channel. Code fences stay."""
    if _HARMONY_TOKEN.search(raw):
        final = list(_HARMONY_FINAL.finditer(raw))
        if not final:
            return ""                         # only the analysis channel: all reasoning
        raw = _HARMONY_TOKEN.split(raw[final[-1].end():])[0]
    text = _THINK_BLOCK.sub("", raw)
    text = _THINK_OPEN.sub("", text)          # unclosed: the rest is reasoning
    if _THINK_CLOSE.search(text):             # template opened the block in the prompt
        text = _THINK_CLOSE.split(text)[-1]
    return text.strip()


def visible_so_far(partial: str) -> str:
    """What of a reply still being streamed may be shown: `strip_thinking`, and nothing of a
    tag that may be starting at the very end (`<thi` could become `<think>`)."""
    cut = partial.rfind("<")
    if cut >= 0 and ">" not in partial[cut:]:
        tail = partial[cut:].lower()
        if any(tag.startswith(tail) or tail.startswith(tag) for tag in _TAG_STARTS):
            partial = partial[:cut]
    return strip_thinking(partial)


def strip_reasoning(raw: str) -> str:
    """The answer without reasoning blocks and without the code fence around it (for JSON)."""
    text = strip_thinking(raw)
    fence = _FENCE.search(text)
    if fence:
        text = fence.group(1)
    else:
        text = re.sub(r"^\s*```[\w-]*", "", text)   # an opening fence that never closes
    return text.strip()


def parse_json_reply(raw: str) -> Any:
    """Parse a model's JSON answer, tolerating reasoning, fences and prose around it."""
    if not isinstance(raw, str):
        raise InvalidReply("the answer was not text")
    text = strip_reasoning(raw)
    if not text:
        raise InvalidReply("the answer was empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    starts = [i for i, ch in enumerate(text) if ch in "[{"][:20]
    for start in starts:
        try:
            return decoder.raw_decode(text[start:])[0]
        except json.JSONDecodeError:
            continue
    raise InvalidReply("the answer is not valid JSON")


async def ask_json(client: "LLMClient", messages: list[dict[str, str]], schema: dict,
                   check: Callable[[Any], tuple[T, list[str]]], *, what: str,
                   timeout: float | None = None, raise_unavailable: bool = False) -> T | None:
    """Ask for JSON matching `schema`; `check` turns the parsed answer into a value plus the
    problems it found (raising ValueError when nothing is usable). An answer with problems is
    retried once with the reason; then the usable part is returned and the rest logged.
    Returns None when nothing usable came back (logged); never raises OllamaError, except
    OllamaUnavailable with `raise_unavailable` (the caller tries again once Ollama is back).
    The reasons are logged at INFO/WARNING, so `check` must word them without quoting the
    answer (say "fact 2 uses I/me", not the fact); the raw answer is logged at DEBUG only."""
    fallback: T | None = None
    for attempt in (1, 2):
        try:
            raw = await client.chat(messages, format=schema, options={"temperature": 0}, timeout=timeout,
                                    background=True)  # never in the way of a reply
        except OllamaError as exc:
            if raise_unavailable and isinstance(exc, OllamaUnavailable) and fallback is None:
                raise
            log.warning("%s skipped: %s", what, exc)
            return fallback
        try:
            value, problems = check(parse_json_reply(raw))
        except ValueError as exc:  # InvalidReply included
            reason, value = str(exc), None
        else:
            if not problems:
                return value
            reason = "; ".join(problems[:5])
        log.debug("%s: invalid answer %r", what, raw[:2000] if isinstance(raw, str) else raw)
        if attempt == 2:
            log.warning("%s: the model's answer was invalid twice (%s); %s", what, reason,
                        "keeping its valid part" if value is not None else "dropped")
            return value if value is not None else fallback
        fallback = value
        log.info("%s: invalid answer (%s); asking once more", what, reason)
        messages = messages + [
            {"role": "assistant", "content": raw[:4000]},
            {"role": "user", "content": f"That answer was invalid: {reason}. "
                                        "Reply again with only the JSON, following the schema exactly."}]
    return fallback  # pragma: no cover - the loop always returns
