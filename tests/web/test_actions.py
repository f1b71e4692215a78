"""The console's actions: each does what it says, is recorded, and a read-only console refuses them."""
from __future__ import annotations

import json

import pytest

from bot.memory.records import MemoryNotFound
from tests.web.conftest import ALICE, BOB, GENERAL

pytestmark = pytest.mark.usefixtures("backend")


async def post(client, path: str, csrf: str, **data) -> tuple[int, str]:
    answer = await client.post(path, data={"csrf": csrf, **data}, allow_redirects=False)
    return answer.status, answer.headers.get("Location", "")


async def test_forget_deletes_the_memory_and_records_it(operator, world):
    client, csrf = operator
    status, location = await post(client, f"/memories/{world.alice}/forget", csrf)
    assert status == 303 and "done=" in location
    with pytest.raises(MemoryNotFound):
        await world.engine.get(world.alice)
    log = await world.engine.console.log()
    assert [(e.action, e.memory_id) for e in log] == [("forget", world.alice)]
    text = await (await client.get("/log")).text()
    assert "forget" in text and "cello" not in text, "the log never holds a memory's text"
    status, location = await post(client, f"/memories/{world.alice}/forget", csrf)
    assert "failed=" in location


async def test_restore_brings_an_archived_memory_back(operator, world):
    client, csrf = operator
    status, location = await post(client, f"/memories/{world.archived}/restore", csrf)
    assert "done=" in location
    assert (await world.engine.get(world.archived)).archived_at is None
    status, location = await post(client, f"/memories/{world.alice}/restore", csrf)
    assert "failed=" in location, "an active memory has nothing to restore"
    status, location = await post(client, f"/memories/{world.pending}/restore", csrf)
    assert "failed=" in location, "a claim waiting for a moderator is approved, not restored"


async def test_approve_and_reject_act_as_the_operator_in_the_moderators_log(operator, world):
    client, csrf = operator
    await post(client, f"/memories/{world.pending}/approve", csrf)
    assert (await world.engine.get(world.pending)).archived_at is None
    entries = await world.engine.rooms.log(GENERAL)
    assert [(e.action, e.moderator_id, e.memory_id) for e in entries] == [("approve", 0, world.pending)]
    status, location = await post(client, f"/memories/{world.room}/reject", csrf)
    assert "failed=" in location, "only a waiting claim can be rejected"
    assert (await world.engine.get(world.room)).text


async def test_reject_deletes_the_claim(operator, world):
    client, csrf = operator
    await post(client, f"/memories/{world.pending}/reject", csrf)
    with pytest.raises(MemoryNotFound):
        await world.engine.get(world.pending)
    assert [e.action for e in await world.engine.console.log()] == ["reject"]


async def test_export_gives_the_persons_data_and_is_recorded(operator, world):
    client, csrf = operator
    answer = await client.post(f"/people/{ALICE}/export", data={"csrf": csrf})
    assert answer.status == 200
    assert "attachment" in answer.headers["Content-Disposition"]
    data = json.loads(await answer.text())
    texts = {m["text"] for m in data["memories"]}
    assert "Alice plays the cello" in texts and "Bob is learning Rust" not in texts
    assert [(e.action, e.user_id) for e in await world.engine.console.log()] == [("export-user", ALICE)]


async def test_forget_a_person_needs_confirmation_then_forgets_everything(operator, world):
    client, csrf = operator
    status, location = await post(client, f"/people/{BOB}/forget", csrf)
    assert "failed=" in location
    assert (await world.engine.get(world.bob)).text
    status, location = await post(client, f"/people/{BOB}/forget", csrf, confirm="yes")
    assert "done=" in location
    assert await world.engine.memories_of(BOB) == []
    assert (await world.engine.get(world.alice)).text, "nobody else's memories go"
    assert [(e.action, e.user_id) for e in await world.engine.console.log()] == [("forget-user", BOB)]


async def test_a_read_only_console_refuses_every_action_and_shows_no_buttons(reader, world):
    client, csrf = reader
    for path in (f"/memories/{world.alice}/forget", f"/memories/{world.archived}/restore",
                 f"/memories/{world.pending}/approve", f"/memories/{world.pending}/reject",
                 f"/people/{ALICE}/export", f"/people/{BOB}/forget"):
        answer = await client.post(path, data={"csrf": csrf, "confirm": "yes"}, allow_redirects=False)
        assert answer.status == 403, path
        assert "read-only" in await answer.text()
    assert (await world.engine.get(world.alice)).text and await world.engine.memories_of(BOB)
    page = await (await client.get(f"/memories/{world.alice}")).text()
    assert "/forget" not in page
    assert await world.engine.console.log() == []


async def test_an_unknown_action_is_a_404(operator, world):
    client, csrf = operator
    answer = await client.post(f"/memories/{world.alice}/explode", data={"csrf": csrf}, allow_redirects=False)
    assert answer.status == 404
