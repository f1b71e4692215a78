"""Newer wins: of two recalled memories that disagree on the same subject, the newer goes first.

"Alice lives in Oslo" (said in January) and "Alice lives in Bergen" (said in June) may both be
recalled: the write path retires an older memory only when the model judged it replaced
(bot/memory/writing/facts.py), and it does not always. After the ranking, among the best
WINDOW x limit candidates, each pair that disagrees is put in time order: the newer takes the
older's place (the older right after it), and the older is marked `outdated_by` the newer, so
that the prompt shows it as an earlier note (bot/conversation/prompt.py).

Two memories disagree when they are about the same subject (writing.rules.same_subject: the same
person's, the same room's) and either the older is linked as superseded by the newer, or they
say nearly the same thing with one value changed: most content words shared (SHARED) and each
holding a number or name the other lacks (Oslo / Bergen), or at most CHANGED words of their own
each ("blue" / "green"). Two facts that only add to each other ("Alice works at Acme" / "Alice
works at Acme as a nurse") do not disagree, nor do two things done ("went hiking with Tom" /
"went hiking with Ann": both in the past tense, clocks.lean_of), which are two events, not a
value that changed. When the question asks for a value as it stands ("How many sources are in
my library?"), a newer memory that says that value changed ("I've added 52 sources to my
library") goes before an older one holding it (changes.py), whatever their other words, when
both made the cut (`limit`): this weaker sign reorders, it never brings a memory in. A
question that names a date ("in March", "yesterday") asks about that
time: the step leaves its order alone (the date lift decides, ranking.py and happens.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from bot.memory import clocks
from bot.memory.connection import Connection
from bot.memory.recall import changes
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import lenient_text
from bot.memory.writing.rules import content_words, values_conflict

WINDOW = 2        # x limit: how deep in the ranking disagreements are looked for
SHARED = 0.5      # Jaccard of content words for a changed value (Oslo / Bergen)
SHARED_WORDS = 0.6  # and for a changed word (blue / green), of at most CHANGED words each side
CHANGED = 2
# Each text's content words, kept across recalls: the same memories come back recall after
# recall, and stemming their words was most of this step's work.
WORDS_KEPT = 4096


@lru_cache(maxsize=WORDS_KEPT)
def words_of(text: str) -> frozenset[str]:
    """writing.rules.content_words of `text`, remembered (a pure function of the text)."""
    return frozenset(content_words(text))


@dataclass(frozen=True)
class Said:
    """What the step reads of a candidate."""
    memory_id: int
    text: str
    scope: str
    owner_id: int | None
    channel_id: int | None
    created_at: float

    @cached_property
    def words(self) -> frozenset[str]:
        """Its content words (writing.rules.content_words)."""
        return words_of(self.text)

    @cached_property
    def past(self) -> bool:
        """Whether it tells something done (clocks.lean_of)."""
        return clocks.lean_of(self.text) == clocks.PAST

    @cached_property
    def subject(self) -> tuple:
        """Who or what it is about (writing.rules.same_subject, as a key)."""
        if self.scope == "personal":
            return ("personal", self.owner_id)
        return ("room", self.channel_id) if self.scope == "room" else ("global",)

    def newer_than(self, other: "Said") -> bool:
        """Said later (the larger id on the same moment)."""
        return (self.created_at, self.memory_id) > (other.created_at, other.memory_id)


def disagree(a: Said, b: Said) -> bool:
    """Whether two memories of the same subject say the same thing with a value changed."""
    if a.subject != b.subject:
        return False
    # Every pair of a recall's best candidates is compared: one intersection, its size giving the
    # rest (writing.rules.jaccard's quotient, each side's own words) without building more sets.
    size_a, size_b = len(a.words), len(b.words)
    if min(size_a, size_b) < SHARED * max(size_a, size_b):
        return False  # too unequal in size to share SHARED of their words
    common = len(a.words & b.words)
    if common in (size_a, size_b):
        return False  # one adds to the other, or they say the same
    shared = common / (size_a + size_b - common)
    if shared < SHARED:
        return False
    if a.past and b.past:
        return False  # two things done, both true
    if shared >= SHARED and values_conflict(a.text, b.text):
        return True
    return shared >= SHARED_WORDS and size_a - common <= CHANGED and size_b - common <= CHANGED


def read(conn: Connection, ids: list[int]) -> tuple[dict[int, Said], set[tuple[int, int]]]:
    """The candidates' texts and subjects, and the supersede links between them (old, new)."""
    marks = ",".join("?" * len(ids))
    said = {}
    for memory_id, text, scope, owner_id, channel_id, created_at in conn.execute(
            f"SELECT id, CAST(text AS BLOB), scope, owner_id, channel_id, created_at FROM memories "
            f"WHERE id IN ({marks})", ids):
        text = lenient_text(text) if isinstance(text, bytes) else str(text)
        said[memory_id] = Said(memory_id, text, scope, owner_id, channel_id, float(created_at or 0.0))
    links = {(old, new) for old, new in conn.execute(
        f"SELECT source_id, target_id FROM memory_links WHERE kind = 'superseded_by' AND source_id IN ({marks}) "
        f"AND target_id IN ({marks})", [*ids, *ids])}
    return said, links


def newer_first(conn: Connection, ranked: list[Candidate], limit: int, dated: bool = False,
                question: str = "") -> list[Candidate]:
    """`ranked` with each disagreeing pair among its first WINDOW x `limit` in time order, the
    older marked `outdated_by` the newer (see the module doc); as it is when the question is
    `dated` (names a date)."""
    head, tail = ranked[:WINDOW * limit], ranked[WINDOW * limit:]
    if len(head) < 2 or dated:
        return ranked
    said, links = read(conn, [c.memory_id for c in head])
    asked = changes.asked_words(question)
    # a change said in other words only reorders what made the cut: it brings in nothing from below;
    # each text read once: which say the asked value changed, which hold one
    shown = [said[c.memory_id] for c in head[:limit] if c.memory_id in said] if asked is not None else []
    says = [m for m in shown if asked is not None and changes.says_changed(m.text, asked)]
    latest = max(says, key=lambda m: (m.created_at, m.memory_id), default=None)
    holds = {m.memory_id for m in shown if latest is not None and latest.newer_than(m) and asked is not None
             and changes.holds_value(m.text, asked)}
    saying = {m.memory_id for m in says}
    pairs: list[tuple[int, int]] = []  # (older, newer)
    rows = [said[c.memory_id] for c in head if c.memory_id in said]
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            earlier, later = (b, a) if a.newer_than(b) else (a, b)
            if ((earlier.memory_id, later.memory_id) in links or disagree(earlier, later)
                    or (later.memory_id in saying and earlier.memory_id in holds and earlier.subject == later.subject)):
                pairs.append((earlier.memory_id, later.memory_id))
    if not pairs:
        return ranked
    order = list(head)
    by_id = {c.memory_id: c for c in head}
    newest: dict[int, Said] = {}
    for old, new in pairs:
        if old not in newest or said[new].newer_than(newest[old]):
            newest[old] = said[new]
    for old, new in sorted(pairs, key=lambda pair: (said[pair[1]].created_at, pair[1])):
        at_old, at_new = order.index(by_id[old]), order.index(by_id[new])
        if at_new > at_old:
            order.insert(at_old, order.pop(at_new))
    for old, latest in newest.items():
        by_id[old].outdated_by = latest.memory_id
    return order + tail
