"""The console's actions, when the operator enabled them: forget or restore a memory, approve or
reject a room claim, export a person's data or forget them. Each is recorded in the console's log
(approvals and rejections in the channel's moderators' log too), never with a memory's text.

Every action is a POST behind the session and its CSRF token (bot/web/auth.py); read-only
consoles answer 403. Each ends in a redirect back with one line saying what happened.
"""
from __future__ import annotations

import json
from urllib.parse import quote

from aiohttp import web

from bot import validate
from bot.cli.users import export_data
from bot.web.pages import changes, engine_of, number


def _allowed(request: web.Request) -> None:
    if not changes(request):
        raise web.HTTPForbidden(text="the console is read-only: start it with `muninn web --allow-changes` "
                                     "(or MUNINN_WEB_CHANGES=true) to act")


def _back(target: str, *, done: str = "", failed: str = "") -> web.HTTPSeeOther:
    note = f"done={quote(done)}" if done else f"failed={quote(failed)}"
    return web.HTTPSeeOther(f"{target}{'&' if '?' in target else '?'}{note}")


async def memory_action(request: web.Request) -> web.StreamResponse:
    """POST /memories/{id}/{action}: forget, restore, approve or reject one memory."""
    _allowed(request)
    memory_id = number(request, "id", source="path")
    assert memory_id is not None
    action = request.match_info["action"]
    console = engine_of(request).console
    if action == "forget":
        gone = await console.forget(memory_id)
        if gone is None:
            raise _back("/", failed=f"#{memory_id} was already gone")
        raise _back(f"/channels/{gone.channel_id}" if gone.scope == "room" and gone.channel_id else
                    f"/people/{gone.owner_id}" if gone.owner_id else "/", done=f"forgot #{memory_id}")
    decide = {"restore": console.restore, "approve": console.approve, "reject": console.reject}.get(action)
    if decide is None:
        raise web.HTTPNotFound(text=f"no action {action!r}")
    done = await decide(memory_id)
    if done is None:
        raise _back(f"/memories/{memory_id}", failed=f"#{memory_id} cannot be {action}d now")
    if action == "reject":
        raise _back(f"/channels/{done.channel_id}", done=f"rejected #{memory_id}")
    raise _back(f"/memories/{memory_id}", done=f"{action}d #{memory_id}")


async def export_person(request: web.Request) -> web.StreamResponse:
    """POST /people/{id}/export: everything kept about a person, as a JSON download (recorded)."""
    _allowed(request)
    user_id = number(request, "id", source="path")
    assert user_id is not None
    engine = engine_of(request)
    memories = await engine.memories_of(user_id)
    messages = await engine.messages.of_person(user_id)
    await engine.console.record("export-user", user_id=user_id)
    text = validate.replace_invalid(json.dumps(export_data(user_id, memories, messages), ensure_ascii=False, indent=2))
    return web.Response(text=text + "\n", content_type="application/json", headers={
        "Content-Disposition": f'attachment; filename="muninn-user-{user_id}.json"'})


async def forget_person(request: web.Request) -> web.StreamResponse:
    """POST /people/{id}/forget (with confirm=yes): /memory forget-all for that person (recorded)."""
    _allowed(request)
    user_id = number(request, "id", source="path")
    assert user_id is not None
    form = await request.post()
    if form.get("confirm") != "yes":
        raise _back(f"/people/{user_id}", failed="not confirmed; nothing was forgotten")
    from bot.conversation.pipeline import Pipeline  # only here: the pages start without the conversation
    engine = engine_of(request)
    forgotten = await Pipeline(engine).forget_person(user_id)
    await engine.console.record("forget-user", user_id=user_id)
    raise _back(f"/people/{user_id}", done=f"forgot user {user_id}: {forgotten.personal} personal memories, "
                                            f"{forgotten.taught} room memories taught, {forgotten.messages} messages")
