"""Who Muninn talks to (bot/conversation/access.py): every rule of the one decision."""
from __future__ import annotations

import pytest

from bot.conversation.access import Author, admit, ids, join

GUILD, GENERAL, THREAD, CATEGORY, RANDOM = 1 << 22, 2 << 22, 3 << 22, 4 << 22, 5 << 22
ALICE, BOB, MOD_ROLE, MUTED_ROLE = 11, 12, 21, 22
IN_THREAD = (THREAD, GENERAL, CATEGORY)  # a thread, its parent channel, the channel's category


@pytest.fixture
def settings(make_settings):
    return make_settings(MUNINN_BLOCKED_USERS="666, 667")


def verdict(settings, author: Author, lists: dict | None = None, places=IN_THREAD, guild=GUILD):
    return admit(settings, author, guild_id=guild, places=places, lists=lists)


def test_bots_webhooks_and_the_operators_blocked_users_are_never_admitted(settings):
    assert verdict(settings, Author(ALICE))
    assert not verdict(settings, Author(ALICE, bot=True))
    assert not verdict(settings, Author(ALICE, webhook=True))
    for place in (GUILD, None):  # in a server and in a DM
        refused = verdict(settings, Author(666), guild=place)
        assert not refused and "MUNINN_BLOCKED_USERS" in refused.reason


def test_dms_follow_the_operator(make_settings):
    assert admit(make_settings(), Author(ALICE), guild_id=None)
    refused = admit(make_settings(MUNINN_ALLOW_DMS="false"), Author(ALICE), guild_id=None)
    assert not refused and "MUNINN_ALLOW_DMS" in refused.reason
    # a server's lists do not reach DMs
    assert admit(make_settings(), Author(ALICE), guild_id=None, lists={"allow_users": str(BOB)})


def test_a_servers_block_lists(settings):
    assert not verdict(settings, Author(BOB), {"block_users": join({BOB})})
    assert verdict(settings, Author(ALICE), {"block_users": join({BOB})})
    assert not verdict(settings, Author(ALICE, frozenset({MUTED_ROLE})), {"block_roles": str(MUTED_ROLE)})
    for blocked in (THREAD, GENERAL, CATEGORY):  # the thread itself, its parent, the category
        assert not verdict(settings, Author(ALICE), {"block_channels": str(blocked)})
    assert verdict(settings, Author(ALICE), {"block_channels": str(RANDOM)})


def test_a_servers_allow_lists(settings):
    only_bob = {"allow_users": str(BOB)}
    assert verdict(settings, Author(BOB), only_bob) and not verdict(settings, Author(ALICE), only_bob)
    users_or_mods = {"allow_users": str(BOB), "allow_roles": str(MOD_ROLE)}
    assert verdict(settings, Author(ALICE, frozenset({MOD_ROLE})), users_or_mods)
    assert not verdict(settings, Author(ALICE, frozenset({MUTED_ROLE})), users_or_mods)
    assert verdict(settings, Author(ALICE), {"allow_channels": str(GENERAL)})  # a thread of an allowed channel
    assert not verdict(settings, Author(ALICE), {"allow_channels": str(GENERAL)}, places=(RANDOM,))
    # a block wins over an allow
    assert not verdict(settings, Author(BOB), {"allow_users": str(BOB), "block_users": str(BOB)})


def test_stored_lists_read_back_as_ids():
    assert ids({"allow_users": join({3, 1, 2})}, "allow_users") == frozenset({1, 2, 3})
    assert join({3, 1, 2}) == "1,2,3" and ids({}, "block_roles") == frozenset()
