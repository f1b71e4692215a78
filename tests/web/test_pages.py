"""The console's pages on a real engine: every view shows what the database holds, escaped."""
from __future__ import annotations

import re

import pytest

from tests.web.conftest import ALICE, BOB, GENERAL

pytestmark = pytest.mark.usefixtures("backend")


async def text_of(client, path: str, status: int = 200) -> str:
    answer = await client.get(path)
    text = await answer.text()
    assert answer.status == status, (path, text[:300])
    return text


async def test_overview_counts_every_kind_and_lists_what_waits(operator, world):
    client, _ = operator
    text = await text_of(client, "/")
    assert "room memories" in text and "waiting for a moderator" in text
    assert "The channel password is swordfish" in text, "the claim waiting for a moderator is listed"
    assert "<svg" in text, "the chart of the last days is drawn"


async def test_servers_list_each_channel_with_its_counts(operator):
    client, _ = operator
    text = await text_of(client, "/servers")
    assert f"/channels/{GENERAL}" in text
    assert "DM / terminal / import" in text


async def test_a_channel_shows_its_room_memories_and_the_claims_waiting(operator, world):
    client, _ = operator
    text = await text_of(client, f"/channels/{GENERAL}")
    assert "Game night is every Friday" in text and "Alice plays the cello" in text
    assert f"/memories/{world.pending}/approve" in text
    waiting = await text_of(client, f"/channels/{GENERAL}?state=pending")
    assert "swordfish" in waiting and "Game night" not in waiting


async def test_people_and_a_persons_memories(operator, world):
    client, _ = operator
    text = await text_of(client, "/people")
    assert f"/people/{ALICE}" in text and f"/people/{BOB}" in text
    alice = await text_of(client, f"/people/{ALICE}")
    assert "Alice plays the cello" in alice and "Bob is learning Rust" not in alice
    assert "Oslo" not in alice, "archived memories are under their own tab"
    archived = await text_of(client, f"/people/{ALICE}?state=archived")
    assert "Oslo" in archived and "decayed" in archived
    assert (await client.get(f"/people/open?id={BOB}")).url.path == f"/people/{BOB}"


async def test_a_memory_page_shows_provenance_links_and_retention(operator, world):
    client, _ = operator
    text = await text_of(client, f"/memories/{world.alice}")
    assert "Alice plays the cello" in text
    assert "co_extracted" in text and f"/memories/{world.room}" in text, "the link is drawn and leads to the other end"
    assert "Retention" in text and "polyline" in text
    room = await text_of(client, f"/memories/{world.room}")
    assert "vouched" in room and "taught by" in room


async def test_text_from_the_database_is_escaped(operator, world):
    client, _ = operator
    for path in (f"/memories/{world.hostile}", f"/people/{BOB}"):
        text = await text_of(client, path)
        assert "<script>" not in text
        assert "&lt;script&gt;" in text


async def test_search_runs_recall_as_the_chosen_viewer(operator, world):
    client, _ = operator
    alice = await text_of(client, f"/search?q=cello&user={ALICE}&channel={GENERAL}&guild=500")
    assert "Alice plays the cello" in alice and "Mode" in alice
    bob = await text_of(client, f"/search?q=cello&user={BOB}&channel={GENERAL}&guild=500")
    assert "Alice plays the cello" not in bob, "the viewer's scope applies: Bob does not see Alice's memory"
    assert "fused" in bob
    assert "Give the user id" in await text_of(client, "/search?q=cello")
    await text_of(client, f"/search?q=cello&user={BOB}&channel={GENERAL}", status=400)


async def test_search_touches_nothing(operator, world):
    client, _ = operator
    before = (await world.engine.get(world.alice)).access_count
    await text_of(client, f"/search?q=cello&user={ALICE}&channel={GENERAL}&guild=500")
    assert (await world.engine.get(world.alice)).access_count == before


async def test_stats_draw_counts_and_days(operator):
    client, _ = operator
    text = await text_of(client, "/stats")
    assert "Memories by kind" in text and "<svg" in text and "decayed" in text
    assert "<svg" in await text_of(client, "/stats?days=7")


@pytest.mark.parametrize("path", ["/memories/abc", "/people/-1", "/channels/1e9", "/people?offset=x",
                                  "/channels/501?state=nope", "/people/open", "/memories/99999999999999999999"])
async def test_bad_numbers_are_one_line_400s(operator, path):
    client, _ = operator
    answer = await client.get(path)
    assert answer.status == 400, path
    error = re.search(r'<div class="error">([^<]*)</div>', await answer.text())
    assert error and error.group(1).strip() and "\n" not in error.group(1), path


async def test_a_missing_memory_is_a_404_that_says_so(operator):
    client, _ = operator
    answer = await client.get("/memories/424242")
    assert answer.status == 404
    assert "no memory #424242" in await answer.text()
