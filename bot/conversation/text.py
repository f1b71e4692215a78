"""Splitting long replies into Discord-sized messages (2,000 characters each).

Cuts go, in order of preference, between paragraphs, between sentences, between
words, and only as a last resort inside a word. A fenced code block is never cut
open: it moves whole to the next message when it fits there, and a block longer
than one message is split between lines, each part closed with ``` and the next
one reopened with the same language tag, so every message renders on its own.
Like Discord, a code block runs from one ``` to the next; an unclosed one is closed.
"""
from __future__ import annotations

import re
from typing import Iterator

DISCORD_LIMIT = 2000
FENCE = "```"

_CODE_BLOCK = re.compile(r"```.*?(?:```|\Z)", re.S)
_LANGUAGE = re.compile(r"```([A-Za-z0-9_+\-.#]*)\n")
_PARAGRAPH_END = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
_WORD_END = re.compile(r"\s+")


def split_message(text: str, limit: int = DISCORD_LIMIT) -> list[str]:
    """Messages of at most `limit` characters that together carry `text`."""
    if limit < 50:
        raise ValueError("limit must leave room for code fences")
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    chunks: list[str] = []
    current = ""
    for piece in _pieces(text, limit):
        if current and len((current + piece).strip()) > limit:
            chunks.append(current.strip())
            current = ""
        current += piece
    if current.strip():
        chunks.append(current.strip())
    return chunks


def _pieces(text: str, limit: int) -> Iterator[str]:
    """Units that are not cut further (each at most `limit`), separators included."""
    start = 0
    for match in _CODE_BLOCK.finditer(text):
        yield from _prose_pieces(text[start:match.start()], limit)
        block = match.group()
        if not block.endswith(FENCE) or len(block) < 2 * len(FENCE):
            block = block.rstrip() + "\n" + FENCE  # unclosed: close it
        yield from ([block] if len(block) <= limit else _code_pieces(block, limit))
        start = match.end()
    yield from _prose_pieces(text[start:], limit)


def _prose_pieces(text: str, limit: int) -> Iterator[str]:
    for paragraph in _split_after(text, _PARAGRAPH_END):
        if len(paragraph) <= limit:
            yield paragraph
            continue
        for sentence in _split_after(paragraph, _SENTENCE_END):
            if len(sentence) <= limit:
                yield sentence
                continue
            for word in _split_after(sentence, _WORD_END):
                for start in range(0, len(word), limit):
                    yield word[start:start + limit]


def _split_after(text: str, separator: re.Pattern) -> list[str]:
    """Split `text` after each separator match, which stays with the part before it."""
    parts, start = [], 0
    for match in separator.finditer(text):
        if match.end() > start:
            parts.append(text[start:match.end()])
            start = match.end()
    parts.append(text[start:])
    return [part for part in parts if part]


def _code_pieces(block: str, limit: int) -> Iterator[str]:
    """A too-long code block as several closed blocks, split between lines."""
    language = _LANGUAGE.match(block)
    opening = f"{FENCE}{language.group(1)}\n" if language else f"{FENCE}\n"
    body = block[language.end() if language else len(FENCE):-len(FENCE)]
    closing = FENCE
    room = limit - len(opening) - len(closing) - 1  # -1: the newline before the closing fence
    current = ""
    for line in body.splitlines(keepends=True):
        for start in range(0, len(line), room):
            part = line[start:start + room]
            if current and len(current) + len(part) > room:
                yield opening + current.rstrip("\n") + "\n" + closing + "\n"
                current = ""
            current += part
    if current.strip():
        yield opening + current.rstrip("\n") + "\n" + closing + "\n"
