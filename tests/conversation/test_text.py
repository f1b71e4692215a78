"""Splitting replies into Discord's 2,000-character messages."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.conversation.text import DISCORD_LIMIT, split_message

FENCE_RE = re.compile(r"```")


def words(text: str) -> list[str]:
    """The visible words, ignoring the fences a split may add."""
    return FENCE_RE.sub(" ", text).split()


def test_short_text_is_one_message_and_blank_is_none():
    assert split_message("  hello  ") == ["hello"]
    assert split_message(" \n ") == []
    assert split_message("x" * DISCORD_LIMIT) == ["x" * DISCORD_LIMIT]


def test_prefers_paragraph_boundaries():
    first, second = "a" * 1200, "b" * 1200
    assert split_message(f"{first}\n\n{second}") == [first, second]


def test_falls_back_to_sentence_boundaries():
    sentence = "This sentence is exactly forty chars ok. "
    text = sentence * 80  # 3,280 characters, one paragraph
    parts = split_message(text)
    assert len(parts) == 2 and all(len(p) <= DISCORD_LIMIT for p in parts)
    assert all(p.endswith(".") for p in parts)  # every cut falls after a full stop
    assert words(" ".join(parts)) == words(text)


def test_a_word_longer_than_a_message_is_cut_hard():
    parts = split_message("z" * 4500)
    assert [len(p) for p in parts] == [2000, 2000, 500]


def test_code_block_that_fits_moves_whole_to_the_next_message():
    prose = "p" * 1500
    code = "```python\n" + "print('hi')\n" * 50 + "```"  # 1500 + 613 > 2000, but the block alone fits
    assert split_message(f"{prose}\n\n{code}\n\nThe end.") == [prose, f"{code}\n\nThe end."]


def test_long_code_block_is_closed_and_reopened_with_its_language():
    body = "".join(f"line_{i} = {i}  # some code\n" for i in range(200))
    parts = split_message(f"Here:\n```py\n{body}```\nDone.")
    assert len(parts) >= 3
    for part in parts:
        assert len(part) <= DISCORD_LIMIT
        assert part.count("```") % 2 == 0, part[:80]
    code_parts = [p for p in parts if "line_" in p]
    assert all("```py\n" in p for p in code_parts)
    assert all(p.rstrip().endswith("```") for p in code_parts[:-1])
    # no code line is cut in the middle
    lines = [line for p in parts for line in p.splitlines() if line.startswith("line_")]
    assert lines == [line for line in body.splitlines()]


def test_unclosed_code_block_is_closed():
    parts = split_message("intro\n\n```\n" + "x = 1\n" * 500)
    assert all(p.count("```") % 2 == 0 for p in parts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="`"), min_size=0, max_size=900),
    st.builds(lambda lang, lines: f"```{lang}\n" + "\n".join(lines) + "\n```",
              st.sampled_from(["", "py", "js"]),
              st.lists(st.text(alphabet="abc xyz=();", max_size=120), max_size=60)),
), max_size=8))
def test_every_part_fits_and_nothing_is_lost(blocks):
    text = "\n\n".join(blocks)
    parts = split_message(text)
    assert all(0 < len(p) <= DISCORD_LIMIT for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)
    assert words(" ".join(parts)) == words(text) or "".join(words(" ".join(parts))) == "".join(words(text))
