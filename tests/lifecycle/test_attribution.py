"""People are ids: a mentioned person is a person to attribution, a kept fact that names someone
records their id, secrets and sensitive facts about others are never stored. A hypothesis
property over speakers, mentions, participants and model labels; extraction end to end with
the fake Ollama on both backends."""
from __future__ import annotations

import dataclasses
import logging
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.conversation.exchange import Exchange
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import RawFact, known_people, name_key, participant_names, resolve
from tests.helpers import BOB, CHANNEL, GUILD, exchange, extract_facts, fact, facts_reply

DAVE, ERIN = 404, 505


def bobs(text: str, *, mentions: tuple[tuple[str, int], ...] = (("Dave", DAVE),), **kwargs) -> Exchange:
    return dataclasses.replace(exchange(text, author=BOB, name="Bob", **kwargs), mentions=mentions)


# -- the property ----------------------------------------------------------------------------

NAMES = ["Alice", "Bob", "Dave", "Zoë 🌸", "Al", "Ann Marie", "🌸", "Jo-Jo", "Ørjan", "dave"]
PREDICATES = ["has two cats", "lent {other} 50 euros", "plays chess on Fridays", "and {other} run the book club",
              "is the moderator here", "likes green tea"]
ROOM_SUBJECTS = ["This channel", "The server", "Everyone here"]
ABOUTS = [*NAMES, "room", "general", "channel", "everyone", "@Dave"]


def named(text: str, name: str) -> bool:
    """The test's own reading of "the text names this person": the name as a whole word,
    any case, with or without "@"."""
    return re.search(rf"(?<!\w){re.escape(name.casefold())}(?!\w)", text.casefold()) is not None


@st.composite
def situations(draw):
    author = draw(st.sampled_from(NAMES))
    mentioned = draw(st.lists(st.sampled_from(NAMES), max_size=3))
    participants = draw(st.lists(st.sampled_from(NAMES), max_size=3))
    subject = draw(st.sampled_from([*NAMES, *ROOM_SUBJECTS]))
    other = draw(st.sampled_from(NAMES))
    at = draw(st.booleans()) and subject not in ROOM_SUBJECTS
    text = f"{'@' if at else ''}{subject} " + draw(st.sampled_from(PREDICATES)).format(
        other=("@" if draw(st.booleans()) else "") + other)
    raw = RawFact(text=text, about=draw(st.sampled_from(ABOUTS)),
                  scope=draw(st.sampled_from(["personal", "room", "general"])), importance=0.5)
    dm = draw(st.booleans())
    ex = Exchange(author_id=1, author_name=author, channel_id=CHANNEL, guild_id=None if dm else GUILD, dm=dm,
                  user_message=text, user_message_id=9, reply="ok", participants=tuple(participants),
                  mentions=tuple((name, 100 + i) for i, name in enumerate(mentioned)),
                  speakers=tuple((name, 200 + i) for i, name in enumerate(participants)))
    return raw, ex, mentioned, participants


@pytest.mark.sqlite_only("pure functions: no database")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations())
def test_attribution_never_publishes_a_person_and_personal_facts_are_the_authors(situation):
    raw, ex, mentioned, participants = situation
    fact = resolve(raw, [ex], participant_names([ex]), known_people([ex]))
    if fact is None:
        return
    others = [n for n in [*mentioned, *participants] if name_key(n) != name_key(ex.author_name)]
    if fact.scope == "room":
        assert not any(named(raw.text, n) for n in others), (raw, fact)
        assert "@" not in raw.text or all(name_key(w) == name_key(ex.author_name)
                                          for w in re.findall(r"@(\S+)", raw.text)), (raw, fact)
        assert name_key(raw.about) == name_key(fact.about) and not ex.dm
    if fact.scope == "personal":
        assert fact.owner_id == ex.author_id and fact.about == ex.author_name
        if raw.scope == "personal":
            assert name_key(raw.about) == name_key(ex.author_name)
    assert fact.scope in ("personal", "room")   # extraction never makes a global memory
    assert ex.author_id not in fact.mentions
    known_ids = {uid for _, uid in (*ex.mentions, *ex.speakers)}
    assert set(fact.mentions) <= known_ids


@pytest.mark.sqlite_only("a pure function: no database")
def test_a_name_two_recent_speakers_share_records_neither():
    ex = dataclasses.replace(exchange("I lent Dave 50 euros", author=BOB, name="Bob"),
                             speakers=(("Dave", DAVE), ("Dave", ERIN)))
    raw = RawFact("Bob lent Dave 50 euros.", "Bob", "personal", 0.5)
    fact = resolve(raw, [ex], participant_names([ex]), known_people([ex]))
    assert fact is not None and fact.mentions == ()
    mentioned = dataclasses.replace(ex, mentions=(("Dave", DAVE),))  # the mention says which Dave
    fact = resolve(raw, [mentioned], participant_names([mentioned]), known_people([mentioned]))
    assert fact is not None and fact.mentions == (DAVE,)


# -- extraction with the fake Ollama -------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("backend")

QUOKKA = "Dave lives at 12 Quokka Street."
DIABETES = "Dave has diabetes."


THIRD_PERSON = (QUOKKA, DIABETES, "@Dave has diabetes.")
AS_BOBS = ("Bob says Dave lives at 12 Quokka Street.", "Bob knows that Dave has diabetes.",
           "Bob visits @Dave, who has diabetes.")   # labelled as the author's own: they name Bob


@pytest.mark.parametrize("scope, about, texts", [
    ("room", "room", THIRD_PERSON), ("general", "general", THIRD_PERSON), ("personal", "Dave", THIRD_PERSON),
    ("room", "Dave", THIRD_PERSON), ("personal", "Bob", AS_BOBS), ("room", "room", AS_BOBS)])
async def test_sensitive_facts_about_a_mentioned_person_are_never_stored(engine, script, scope, about, texts, caplog):
    script.add("extract", facts_reply(*(fact(text, about=about, scope=scope) for text in texts)))
    with caplog.at_level(logging.DEBUG):
        facts = await extract_facts(engine, bobs("@Dave lives at 12 Quokka Street and @Dave has diabetes"))
    assert facts == []
    ours = " ".join(r.getMessage() for r in caplog.records if r.name == "bot.lifecycle.facts" or r.levelno >= logging.INFO)
    assert "Quokka" not in ours and "diabetes" not in ours  # counts only
    assert "dropped 2 health, 1 home" in ours


async def test_a_room_label_never_publishes_a_mentioned_person(engine, script):
    script.add("extract", facts_reply(fact("Dave plays chess every Tuesday.", about="room", scope="room"),
                                      fact("@Dave runs the book club.", about="general", scope="general"),
                                      fact("This channel plays chess every Tuesday.", about="room", scope="room")))
    facts = await extract_facts(engine, bobs("@Dave plays chess here every Tuesday and runs the book club"))
    assert [(f.text, f.scope) for f in facts] == [("This channel plays chess every Tuesday.", "room")]


async def test_a_personal_fact_naming_a_mentioned_person_is_theirs_to_find(engine, script):
    script.add("extract", facts_reply(fact("Bob lent Dave 50 euros.", about="Bob"),
                                      fact("Bob and @Dave went fishing.", about="Bob"),
                                      fact("Bob has two cats.", about="Bob")))
    ex = bobs("I lent @Dave 50 euros; we went fishing. I have two cats.")
    facts = await extract_facts(engine, ex)
    assert [(f.text, f.owner_id, f.mentions) for f in facts] == [
        ("Bob lent Dave 50 euros.", BOB, (DAVE,)), ("Bob and @Dave went fishing.", BOB, (DAVE,)),
        ("Bob has two cats.", BOB, ())]
    ids = await store_facts(engine, facts, ex)
    assert sorted(m.id for m in await engine.memories_of(DAVE)) == sorted(ids[:2])


async def test_nobody_s_secret_is_stored_not_even_the_authors(engine, script, caplog):
    script.add("extract", facts_reply(fact("Bob's password is hunter2.", about="Bob"),
                                      fact("The server's API key is sk-abcdefghijklmnop1234.", about="room",
                                           scope="room"),
                                      fact("Bob has two cats.", about="Bob")))
    with caplog.at_level(logging.DEBUG):
        facts = await extract_facts(engine, bobs("my password is hunter2, the API key is sk-abcdefghijklmnop1234, "
                                                 "and I have two cats", mentions=()))
    assert [f.text for f in facts] == ["Bob has two cats."]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "hunter2" not in said.replace("my password is hunter2", "")  # the prompt itself may be logged
    assert "dropped 2 secret" in said
