"""The update decision: asking the LLM whether a new fact repeats or replaces older memories of
its subject, and checking its answer. The rules and the one transaction that store the facts are
in the memory layer (bot/memory/writing/).

Thresholds (settings, chosen by measurement in docs/lifecycle.md):
  dedup_cosine   same fact again -> reinforce instead of insert (guarded by the value check)
  update_cosine  older memories of the subject the LLM is asked about (update or not)
  link_cosine    semantic link between two memories of one visibility key
"""
from __future__ import annotations

from typing import Any, Sequence

from bot.memory.writing.rules import UpdateDecision

__all__ = ["UPDATE_SCHEMA", "UpdateDecision", "check_update_reply", "update_messages"]

UPDATE_SCHEMA = {
    "type": "object",
    "properties": {
        "same": {"type": "array", "items": {"type": "integer"}},
        "replaces": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["same", "replaces"],
}

UPDATE_SYSTEM = (
    "You keep a memory store tidy. You get one NEW fact and a numbered list of EXISTING memories about "
    "the same subject. Answer with JSON only: {\"same\": [...], \"replaces\": [...]}.\n"
    "- same: numbers of existing memories that state the same thing as the new fact, in other words.\n"
    "- replaces: numbers of existing memories that the new fact makes outdated or contradicts "
    "(a new city, a changed preference, a corrected date).\n"
    "- A memory that is merely related (another detail about the same person) is in neither list.\n"
    "- When unsure, leave the number out. Use [] for an empty list."
)


def update_messages(fact_text: str, candidates: Sequence[tuple[int, str]]) -> list[dict[str, str]]:
    """The update decision's prompt: the new fact and the candidate
    memories, numbered from 1 as `check_update_reply` reads them back."""
    listing = "\n".join(f"{number}. {text}" for number, (_, text) in enumerate(candidates, start=1))
    return [{"role": "system", "content": UPDATE_SYSTEM},
            {"role": "user", "content": f"NEW: {fact_text}\n\nEXISTING:\n{listing}"}]


def check_update_reply(data: Any, candidates: Sequence[tuple[int, str]]) -> tuple[UpdateDecision, list[str]]:
    """The decision as memory ids, and the problems found (invalid numbers are dropped)."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object with 'same' and 'replaces'")
    problems: list[str] = []
    lists: dict[str, list[int]] = {}
    for key in ("same", "replaces"):
        raw = data.get(key, [])
        if raw is None:
            raw = []
        if not isinstance(raw, list):
            problems.append(f"'{key}' must be a list of numbers")
            raw = []
        chosen: list[int] = []
        for item in raw:
            number = _as_int(item)
            if number is None or not 1 <= number <= len(candidates):
                problems.append(f"'{key}' must hold only numbers from 1 to {len(candidates)}")
                continue
            if candidates[number - 1][0] not in chosen:
                chosen.append(candidates[number - 1][0])
        lists[key] = chosen
    both = set(lists["same"]) & set(lists["replaces"])
    if both:
        problems.append("a memory cannot be both the same and replaced")
        lists["replaces"] = [i for i in lists["replaces"] if i not in both]
    return UpdateDecision(tuple(lists["same"]), tuple(lists["replaces"])), problems


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None
