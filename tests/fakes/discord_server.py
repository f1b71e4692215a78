"""A local fake Discord (REST API + websocket gateway) for end-to-end bot tests.

``FakeDiscord`` is an aiohttp app on 127.0.0.1 (random free port) that speaks
enough of Discord's real wire protocol (API v10) for an *unmodified*
discord.py 2.x ``Client``/``commands.Bot`` to log in, connect to the gateway,
receive READY/GUILD_CREATE/MESSAGE_CREATE/INTERACTION_CREATE, and reply over
REST.  Everything the bot sends is recorded for assertions.

Pointing discord.py at it (test code only, never product code)::

    async with FakeDiscord(heartbeat_interval=200) as fake:
        patch_discord_urls(fake, monkeypatch)      # Route.BASE + DEFAULT_GATEWAY
        alice = fake.add_user("alice")
        guild = fake.add_guild("Test Guild", members=[alice])
        general = guild["channels"][0]
        task = asyncio.create_task(bot.start("fake-token"))
        await fake.wait_until_ready()
        await fake.send_message(general["id"], alice, "ping")
        sent = await fake.wait_for_sent_message(general["id"])
        ...
        await bot.close()

discord.py facts this relies on (2.7.1):

* REST URLs are built from ``discord.http.Route.BASE`` at ``Route()``
  construction time, for the bot HTTP client *and* the interaction/webhook
  adapter, so patching the class attribute is enough.
* A plain (non-sharded) ``Client`` never calls ``GET /gateway/bot``; it
  connects straight to ``DiscordWebSocket.DEFAULT_GATEWAY`` (a ``yarl.URL``),
  appending ``?v=10&encoding=json&compress=zlib-stream`` (``zstd-stream`` if
  the ``zstandard`` package is importable).  So that attribute must be
  patched too.  ``AutoShardedClient`` does use ``GET /gateway/bot``.
* After READY discord.py reconnects/resumes to ``resume_gateway_url``.
* Interaction callbacks are POSTed with ``?with_response=1`` and discord.py
  parses the body (``data['interaction']``), so a 204 would crash it.
* ``on_ready`` fires ``guild_ready_timeout`` (default 2 s) after the last
  GUILD_CREATE; pass ``guild_ready_timeout=0.1`` to the bot in tests if you
  need ``wait_until_ready()``.  Events such as ``on_message`` are dispatched
  before that anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import re
import time
import uuid
import zlib
from datetime import datetime, timezone
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Tuple,
    Union,
)

from aiohttp import WSMsgType, web

# Only needed when discord.py negotiates compress=zstd-stream (it does so when
# `zstandard` or Python 3.14's `compression.zstd` is importable).
try:
    import zstandard as _zstd  # type: ignore
except ImportError:  # pragma: no cover - depends on environment
    _zstd = None
try:
    from compression import zstd as _stdlib_zstd  # type: ignore  # Python >= 3.14
except ImportError:  # pragma: no cover - depends on environment
    _stdlib_zstd = None

log = logging.getLogger(__name__)

__all__ = [
    "FakeDiscord",
    "GatewayConnection",
    "Intents",
    "Perm",
    "patch_discord_urls",
    "discord_urls_patched",
    "fake_discord",
]

API_VERSION = 10
DISCORD_EPOCH = 1420070400000
Snowflake = Union[int, str]
UserLike = Union[Dict[str, Any], int, str]


class Intents:
    """Gateway intent bits (subset)."""

    GUILDS = 1 << 0
    GUILD_MEMBERS = 1 << 1
    GUILD_PRESENCES = 1 << 8
    GUILD_MESSAGES = 1 << 9
    GUILD_MESSAGE_REACTIONS = 1 << 10
    GUILD_MESSAGE_TYPING = 1 << 11
    DIRECT_MESSAGES = 1 << 12
    MESSAGE_CONTENT = 1 << 15
    PRIVILEGED = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT


class Perm:
    """Permission bits (subset)."""

    CREATE_INSTANT_INVITE = 1 << 0
    ADMINISTRATOR = 1 << 3
    ADD_REACTIONS = 1 << 6
    VIEW_CHANNEL = 1 << 10
    SEND_MESSAGES = 1 << 11
    MANAGE_MESSAGES = 1 << 13
    EMBED_LINKS = 1 << 14
    ATTACH_FILES = 1 << 15
    READ_MESSAGE_HISTORY = 1 << 16
    MENTION_EVERYONE = 1 << 17
    USE_EXTERNAL_EMOJIS = 1 << 18
    CONNECT = 1 << 20
    SPEAK = 1 << 21
    CHANGE_NICKNAME = 1 << 26
    USE_APPLICATION_COMMANDS = 1 << 31
    CREATE_PUBLIC_THREADS = 1 << 35
    SEND_MESSAGES_IN_THREADS = 1 << 38
    ALL = (1 << 51) - 1

    EVERYONE_DEFAULT = (
        CREATE_INSTANT_INVITE | ADD_REACTIONS | VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS
        | ATTACH_FILES | READ_MESSAGE_HISTORY | USE_EXTERNAL_EMOJIS | CONNECT | SPEAK
        | CHANGE_NICKNAME | USE_APPLICATION_COMMANDS | CREATE_PUBLIC_THREADS | SEND_MESSAGES_IN_THREADS
    )
    BOT_DEFAULT = EVERYONE_DEFAULT | MANAGE_MESSAGES


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _sid(value: Any) -> str:
    """Normalise a snowflake / user dict / message dict to its string id."""
    if isinstance(value, dict):
        return str(value["id"])
    return str(value)


def _json(data: Any, status: int = 200) -> web.Response:
    # discord.py's json_or_text() only decodes when Content-Type is exactly
    # "application/json" (aiohttp's json_response adds "; charset=utf-8").
    return web.Response(body=json.dumps(data).encode(), status=status,
                        headers={"Content-Type": "application/json"})


def _error(status: int, message: str, code: int = 0, errors: Optional[dict] = None) -> web.Response:
    body: Dict[str, Any] = {"message": message, "code": code}
    if errors is not None:
        body["errors"] = errors
    return _json(body, status=status)


def _form_error(field: str, code: str, message: str) -> web.Response:
    return _error(400, "Invalid Form Body", 50035, {field: {"_errors": [{"code": code, "message": message}]}})


def _truthy(value: Optional[str]) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class GatewayConnection:
    """One websocket connection to the fake gateway (server side)."""

    def __init__(self, ws: web.WebSocketResponse, query: Dict[str, str]) -> None:
        self.ws = ws
        self.query = query
        self.compress: Optional[str] = query.get("compress")
        self.encoding: str = query.get("encoding", "json")
        self._zlib = zlib.compressobj() if self.compress == "zlib-stream" else None
        self._zstd: Optional[Callable[[bytes], bytes]] = None
        if self.compress == "zstd-stream":  # pragma: no cover - needs a zstd library
            if _zstd is not None:
                cobj = _zstd.ZstdCompressor().compressobj()
                self._zstd = lambda b: cobj.compress(b) + cobj.flush(_zstd.COMPRESSOBJ_FLUSH_BLOCK)
            elif _stdlib_zstd is not None:
                comp = _stdlib_zstd.ZstdCompressor()
                self._zstd = lambda b: comp.compress(b, mode=_stdlib_zstd.ZstdCompressor.FLUSH_BLOCK)
            else:  # discord.py also accepts plain TEXT frames
                log.warning("fake gateway: zstd-stream requested but no zstd library; sending text frames")
        self.lock = asyncio.Lock()
        self.seq = 0
        self.session_id: Optional[str] = None
        self.identified = False
        self.resumed = False
        self.token: Optional[str] = None
        self.intents: int = 0
        self.shard: Optional[List[int]] = None
        self.heartbeats = 0
        self.closed = False
        self.close_code: Optional[int] = None
        self.received: List[Dict[str, Any]] = []  # every op the client sent
        self.sent: List[Dict[str, Any]] = []  # every payload we sent (uncompressed)

    def has_intent(self, bit: int) -> bool:
        return bool(self.intents & bit)

    async def send(self, payload: Dict[str, Any]) -> None:
        async with self.lock:
            if self.closed or self.ws.closed:
                return
            if payload.get("op") == 0:
                self.seq += 1
                payload["s"] = self.seq
            self.sent.append(payload)
            text = json.dumps(payload, separators=(",", ":"))
            if self._zlib is not None:
                data = self._zlib.compress(text.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                await self.ws.send_bytes(data)  # ends with 00 00 ff ff
            elif self._zstd is not None:  # pragma: no cover - needs a zstd library
                await self.ws.send_bytes(self._zstd(text.encode()))  # one complete message per frame
            else:
                await self.ws.send_str(text)

    async def close(self, code: int = 1000, message: bytes = b"") -> None:
        if not self.ws.closed:
            await self.ws.close(code=code, message=message)
        self.closed = True
        self.close_code = code


class FakeDiscord:
    """Fake Discord REST API + gateway on 127.0.0.1.  Also an async context manager.

    Data is kept as plain Discord wire-format dicts with string snowflakes
    (``fake.users``, ``fake.guilds``, ``fake.channels``, ``fake.messages``).
    """

    def __init__(
        self,
        *,
        bot_username: str = "Muninn",
        bot_id: Optional[Snowflake] = None,
        application_id: Optional[Snowflake] = None,
        heartbeat_interval: int = 41250,
        rejected_tokens: Iterable[str] = (),
        allowed_intents: Optional[int] = None,
        echo_bot_messages: bool = True,
        enforce_intents: bool = True,
        ack_heartbeats: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """
        heartbeat_interval: ms, sent in HELLO (discord.py beats at that period).
        rejected_tokens: REST answers 401 (-> discord.LoginFailure) and the
            gateway closes with 4004 for these tokens.
        allowed_intents: if set, IDENTIFY asking for other bits is closed with
            4014 (-> discord.PrivilegedIntentsRequired).
        echo_bot_messages: like real Discord, dispatch MESSAGE_CREATE for the
            bot's own REST-sent messages (so on_message sees them).
        enforce_intents: like real Discord, don't deliver guild/DM messages
            without GUILD_MESSAGES/DIRECT_MESSAGES and blank the content of
            guild messages that don't mention the bot without MESSAGE_CONTENT.
        ack_heartbeats: set False to simulate a zombie connection.
        """
        self.host = host
        self.port = port
        self.heartbeat_interval = heartbeat_interval
        self.rejected_tokens = set(rejected_tokens)
        self.allowed_intents = allowed_intents
        self.echo_bot_messages = echo_bot_messages
        self.enforce_intents = enforce_intents
        self.ack_heartbeats = ack_heartbeats

        self._sf_last = 0
        self._sf_inc = itertools.count()

        bot_id = str(bot_id) if bot_id is not None else self.snowflake()
        self.application_id: str = str(application_id) if application_id is not None else bot_id
        self.application_flags = (1 << 19) | (1 << 15)  # *_LIMITED intent flags of an unverified bot

        # ---- world state (wire-format dicts) ----
        self.users: Dict[str, Dict[str, Any]] = {}
        self.guilds: Dict[str, Dict[str, Any]] = {}
        self.channels: Dict[str, Dict[str, Any]] = {}
        self.messages: Dict[str, List[Dict[str, Any]]] = {}  # channel id -> chronological
        self.commands: Dict[Optional[str], List[Dict[str, Any]]] = {None: []}  # guild id (None=global)
        self.interactions: Dict[str, Dict[str, Any]] = {}  # token -> interaction payload
        self._dm_by_user: Dict[str, str] = {}
        self._original_responses: Dict[str, Dict[str, Any]] = {}  # token -> message
        self._responded: set = set()
        self._command_ids: Dict[Tuple[Optional[str], str, int], str] = {}
        self.bot_user: Dict[str, Any] = self.add_user(bot_username, id=bot_id, bot=True)

        # ---- recordings ----
        self.requests: List[Dict[str, Any]] = []
        self.unhandled_requests: List[Dict[str, Any]] = []
        self.errors: List[Dict[str, Any]] = []  # requests we answered with 4xx
        self.sent_messages: List[Dict[str, Any]] = []
        self.edited_messages: List[Dict[str, Any]] = []
        self.deleted_messages: List[Dict[str, Any]] = []
        self.reactions: List[Dict[str, Any]] = []
        self.typing: List[str] = []
        self.created_threads: List[Dict[str, Any]] = []
        self.interaction_responses: List[Dict[str, Any]] = []
        self.followups: List[Dict[str, Any]] = []
        self.dispatched: List[Tuple[str, Dict[str, Any]]] = []
        self.identify_payload: Optional[Dict[str, Any]] = None
        self.identifies: List[Dict[str, Any]] = []
        self.resumes: List[Dict[str, Any]] = []
        self.presence_updates: List[Dict[str, Any]] = []
        self.member_requests: List[Dict[str, Any]] = []
        self.heartbeats_received = 0
        self.heartbeat_acks = 0
        self.gateway_connections: List[GatewayConnection] = []
        self._sessions: Dict[str, Dict[str, Any]] = {}  # session_id -> {intents, token, shard}
        self.recommended_shards = 1  # what GET /gateway/bot answers as "shards"

        self._ready = asyncio.Event()
        self._runner: Optional[web.AppRunner] = None
        self._routes = self._build_routes()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "FakeDiscord":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway_handler)
        app.router.add_get("/gateway/", self._gateway_handler)
        app.router.add_route("*", r"/api/v{version:\d+}/{tail:.*}", self._rest_handler)
        app.router.add_route("*", "/{tail:.*}", self._unknown_root)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        for conn in list(self.gateway_connections):
            with contextlib.suppress(Exception):
                await conn.close(1001)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "FakeDiscord":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("FakeDiscord is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def rest_url(self) -> str:
        return f"{self.base_url}/api/v{API_VERSION}"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self.host}:{self.port}/gateway"

    # ------------------------------------------------------------------ ids
    def snowflake(self) -> str:
        """A fresh, strictly increasing, realistic snowflake (as a string)."""
        ms = int(time.time() * 1000) - DISCORD_EPOCH
        value = (ms << 22) | (1 << 17) | (next(self._sf_inc) & 0xFFF)
        if value <= self._sf_last:
            value = self._sf_last + 1
        self._sf_last = value
        return str(value)

    # ------------------------------------------------------------------ world building
    def add_user(
        self,
        username: str,
        *,
        id: Optional[Snowflake] = None,
        bot: bool = False,
        global_name: Optional[str] = None,
    ) -> Dict[str, Any]:
        uid = str(id) if id is not None else self.snowflake()
        user = {
            "id": uid,
            "username": username,
            "global_name": global_name if global_name is not None else (None if bot else username.title()),
            "discriminator": "0",
            "avatar": None,
            "avatar_decoration_data": None,
            "banner": None,
            "accent_color": None,
            "public_flags": 0,
            "bot": bot,
        }
        self.users[uid] = user
        return user

    def _user(self, user: UserLike) -> Dict[str, Any]:
        if isinstance(user, dict):
            self.users.setdefault(str(user["id"]), user)
            return user
        return self.users[str(user)]

    def add_guild(
        self,
        name: str = "Test Guild",
        *,
        id: Optional[Snowflake] = None,
        members: Iterable[UserLike] = (),
        channels: Iterable[Union[str, Dict[str, Any]]] = ("general",),
        owner: Optional[UserLike] = None,
        everyone_permissions: int = Perm.EVERYONE_DEFAULT,
        bot_permissions: int = Perm.BOT_DEFAULT,
    ) -> Dict[str, Any]:
        """Create a guild (sent as GUILD_CREATE on IDENTIFY) with the bot as a member.

        ``channels`` items are names (text channels) or kwargs dicts for
        :meth:`add_channel`.  Returns the full guild dict; ``guild["channels"]``
        lists its channels, ``guild["members"]`` its members (bot first).
        """
        gid = str(id) if id is not None else self.snowflake()
        member_users = [self._user(m) for m in members]
        owner_user = self._user(owner) if owner is not None else (member_users[0] if member_users else None)
        bot_role_id = self.snowflake()
        guild: Dict[str, Any] = {
            "id": gid,
            "name": name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": owner_user["id"] if owner_user else self.snowflake(),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 1,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "vanity_url_code": None,
            "features": [],
            "emojis": [],
            "stickers": [],
            "roles": [
                self._role(gid, "@everyone", everyone_permissions, position=0),
                self._role(
                    bot_role_id, self.bot_user["username"], bot_permissions, position=1,
                    managed=True, tags={"bot_id": self.bot_user["id"]},
                ),
            ],
            "channels": [],
            "members": [],
            "threads": [],
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "lazy": True,
            "large": False,
            "unavailable": False,
            "joined_at": _now_iso(),
            "member_count": 0,
            "max_members": 500000,
            "max_video_channel_users": 25,
            "application_id": None,
            "_bot_role_id": bot_role_id,  # stripped before sending
        }
        self.guilds[gid] = guild
        self.add_member(guild, self.bot_user, roles=[bot_role_id])
        for user in member_users:
            self.add_member(guild, user)
        for ch in channels:
            if isinstance(ch, str):
                self.add_channel(guild, ch)
            else:
                self.add_channel(guild, **ch)
        if guild["channels"]:
            guild["system_channel_id"] = guild["channels"][0]["id"]
        return guild

    @staticmethod
    def _role(rid: str, name: str, permissions: int, *, position: int, managed: bool = False,
              tags: Optional[dict] = None) -> Dict[str, Any]:
        role = {
            "id": rid,
            "name": name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": position,
            "permissions": str(permissions),
            "managed": managed,
            "mentionable": False,
            "flags": 0,
        }
        if tags is not None:
            role["tags"] = tags
        return role

    def add_role(self, guild: Union[Dict[str, Any], Snowflake], name: str, permissions: int = 0,
                 *, id: Optional[Snowflake] = None) -> Dict[str, Any]:
        g = self.guilds[_sid(guild)]
        role = self._role(str(id) if id is not None else self.snowflake(), name, permissions,
                          position=len(g["roles"]))
        g["roles"].append(role)
        return role

    def add_member(
        self,
        guild: Union[Dict[str, Any], Snowflake],
        user: UserLike,
        *,
        roles: Iterable[Snowflake] = (),
        nick: Optional[str] = None,
    ) -> Dict[str, Any]:
        g = self.guilds[_sid(guild)]
        u = self._user(user)
        for existing in g["members"]:
            if existing["user"]["id"] == u["id"]:
                return existing
        member = {
            "user": u,
            "nick": nick,
            "avatar": None,
            "banner": None,
            "roles": [str(r) for r in roles],
            "joined_at": _now_iso(),
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }
        g["members"].append(member)
        g["member_count"] = len(g["members"])  # == cached count, so no chunking needed
        return member

    def add_channel(
        self,
        guild: Union[Dict[str, Any], Snowflake],
        name: str,
        *,
        id: Optional[Snowflake] = None,
        type: int = 0,
        topic: Optional[str] = None,
        nsfw: bool = False,
        parent_id: Optional[Snowflake] = None,
        permission_overwrites: Optional[List[Dict[str, Any]]] = None,
    ) -> Dict[str, Any]:
        """Add a guild channel (type 0 text, 2 voice, 4 category, 5 news, 15 forum)."""
        g = self.guilds[_sid(guild)]
        cid = str(id) if id is not None else self.snowflake()
        ch: Dict[str, Any] = {
            "id": cid,
            "type": type,
            "guild_id": g["id"],
            "name": name,
            "position": len(g["channels"]),
            "permission_overwrites": permission_overwrites or [],
            "parent_id": str(parent_id) if parent_id is not None else None,
            "nsfw": nsfw,
            "flags": 0,
        }
        if type in (0, 5, 15, 16):
            ch.update(topic=topic, last_message_id=None, rate_limit_per_user=0,
                      default_auto_archive_duration=1440, default_thread_rate_limit_per_user=0)
        if type in (2, 13):
            ch.update(bitrate=64000, user_limit=0, rtc_region=None, last_message_id=None,
                      rate_limit_per_user=0, video_quality_mode=1)
        if type in (15, 16):
            ch.update(available_tags=[], default_reaction_emoji=None, default_sort_order=None,
                      default_forum_layout=0)
        g["channels"].append(ch)
        self.channels[cid] = ch
        self.messages.setdefault(cid, [])
        return ch

    def add_thread(
        self,
        parent: Union[Dict[str, Any], Snowflake],
        name: str,
        *,
        id: Optional[Snowflake] = None,
        type: int = 11,
        owner: Optional[UserLike] = None,
    ) -> Dict[str, Any]:
        """Add a thread (type 11 public, 12 private) of a guild text channel; it is sent in its
        guild's GUILD_CREATE ``threads`` (add it before the bot connects, or use :meth:`open_thread`)."""
        ch = self.channels[_sid(parent)]
        g = self.guilds[ch["guild_id"]]
        tid = str(id) if id is not None else self.snowflake()
        thread: Dict[str, Any] = {
            "id": tid,
            "type": type,
            "guild_id": g["id"],
            "parent_id": ch["id"],
            "owner_id": _sid(owner) if owner is not None else self.bot_user["id"],
            "name": name,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "message_count": 0,
            "member_count": 1,
            "flags": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": 1440, "archive_timestamp": _now_iso(),
                                "locked": False, "invitable": True, "create_timestamp": _now_iso()},
        }
        g["threads"].append(thread)
        self.channels[tid] = thread
        self.messages.setdefault(tid, [])
        return thread

    async def open_thread(self, parent: Union[Dict[str, Any], Snowflake], name: str, **kwargs: Any) -> Dict[str, Any]:
        """Add a thread while the bot is connected: THREAD_CREATE is dispatched."""
        thread = self.add_thread(parent, name, **kwargs)
        await self._dispatch("THREAD_CREATE", lambda conn: dict(thread, newly_created=True), require=True)
        return thread

    def channel(self, name_or_id: Snowflake, guild: Optional[Union[Dict[str, Any], Snowflake]] = None) -> Dict[str, Any]:
        """Look a channel up by id or by name (optionally within one guild)."""
        key = str(name_or_id)
        if key in self.channels:
            return self.channels[key]
        gid = _sid(guild) if guild is not None else None
        for ch in self.channels.values():
            if ch.get("name") == key and (gid is None or ch.get("guild_id") == gid):
                return ch
        raise KeyError(name_or_id)

    def dm_channel(self, user: UserLike) -> Dict[str, Any]:
        """Get or create the DM channel (type 1) between the bot and ``user``."""
        u = self._user(user)
        cid = self._dm_by_user.get(u["id"])
        if cid is None:
            cid = self.snowflake()
            self.channels[cid] = {
                "id": cid,
                "type": 1,
                "last_message_id": None,
                "flags": 0,
                "recipients": [u],
            }
            self.messages.setdefault(cid, [])
            self._dm_by_user[u["id"]] = cid
        return self.channels[cid]

    def member(self, guild: Union[Dict[str, Any], Snowflake], user: UserLike) -> Optional[Dict[str, Any]]:
        g = self.guilds.get(_sid(guild))
        if g is None:
            return None
        uid = _sid(user)
        for m in g["members"]:
            if m["user"]["id"] == uid:
                return m
        return None

    def base_permissions(self, guild: Union[Dict[str, Any], Snowflake], user: UserLike) -> int:
        """Guild-level permissions of a member (roles only, channel overwrites ignored)."""
        g = self.guilds[_sid(guild)]
        uid = _sid(user)
        if g["owner_id"] == uid:
            return Perm.ALL
        roles = {r["id"]: int(r["permissions"]) for r in g["roles"]}
        perms = roles.get(g["id"], 0)
        m = self.member(g, uid)
        for rid in (m["roles"] if m else []):
            perms |= roles.get(rid, 0)
        return Perm.ALL if perms & Perm.ADMINISTRATOR else perms

    @staticmethod
    def mention(user: UserLike) -> str:
        return f"<@{_sid(user)}>"

    @staticmethod
    def _public_guild(guild: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in guild.items() if not k.startswith("_")}

    def _guild_of_channel(self, channel_id: str) -> Optional[str]:
        ch = self.channels.get(channel_id)
        return ch.get("guild_id") if ch else None

    @staticmethod
    def _member_without_user(member: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in member.items() if k != "user"}

    def _member_or_default(self, gid: str, user: Dict[str, Any]) -> Dict[str, Any]:
        m = self.member(gid, user)
        if m is not None:
            return m
        return {"user": user, "nick": None, "avatar": None, "banner": None, "roles": [], "joined_at": _now_iso(),
                "premium_since": None, "deaf": False, "mute": False, "flags": 0, "pending": False,
                "communication_disabled_until": None}

    def _find_message(self, message_id: str, channel_id: Optional[str] = None) -> Optional[Dict[str, Any]]:
        lists = [self.messages.get(channel_id, [])] if channel_id else list(self.messages.values())
        for msgs in lists:
            for m in msgs:
                if m["id"] == message_id:
                    return m
        return None

    def _store_message(self, msg: Dict[str, Any]) -> None:
        cid = msg["channel_id"]
        if self._find_message(msg["id"], cid) is None:
            self.messages.setdefault(cid, []).append(msg)
        ch = self.channels.get(cid)
        if ch is not None and "last_message_id" in ch:
            ch["last_message_id"] = msg["id"]

    # ------------------------------------------------------------------ gateway
    @property
    def live_connections(self) -> List[GatewayConnection]:
        return [c for c in self.gateway_connections if c.identified and not c.closed and not c.ws.closed]

    async def _gateway_handler(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0, autoping=True)
        await ws.prepare(request)
        conn = GatewayConnection(ws, dict(request.query))
        self.gateway_connections.append(conn)
        log.debug("fake gateway: connection with %s", conn.query)
        await conn.send({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval,
                                         "_trace": ["[\"fake-gateway\"]"]}, "s": None, "t": None})
        try:
            while True:
                msg = await ws.receive()
                if msg.type == WSMsgType.CLOSE:
                    if conn.close_code is None:
                        conn.close_code = msg.data  # the code the client closed with
                    await ws.close()
                    break
                if msg.type in (WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    break
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    raw = msg.data if isinstance(msg.data, str) else msg.data.decode()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        log.warning("fake gateway: undecodable frame %r", raw[:200])
                        await conn.close(4002)
                        break
                    conn.received.append(payload)
                    try:
                        await self._handle_op(conn, payload)
                    except Exception:  # pragma: no cover - a bug in the fake
                        log.exception("fake gateway: error handling %r", payload)
        finally:
            conn.closed = True
            if conn.close_code is None:
                conn.close_code = ws.close_code
            log.debug("fake gateway: connection closed (%s)", conn.close_code)
        return ws

    async def _handle_op(self, conn: GatewayConnection, payload: Dict[str, Any]) -> None:
        op = payload.get("op")
        d = payload.get("d")
        if op == 1:  # HEARTBEAT
            conn.heartbeats += 1
            self.heartbeats_received += 1
            if self.ack_heartbeats:
                await conn.send({"op": 11, "d": None, "s": None, "t": None})
                self.heartbeat_acks += 1
        elif op == 2:  # IDENTIFY
            await self._identify(conn, d or {})
        elif op == 3:  # PRESENCE_UPDATE
            self.presence_updates.append(d)
        elif op == 6:  # RESUME
            await self._resume(conn, d or {})
        elif op == 8:  # REQUEST_GUILD_MEMBERS
            await self._request_members(conn, d or {})
        elif op == 4:  # VOICE_STATE_UPDATE: ignore
            pass
        else:
            log.warning("fake gateway: unhandled op %s: %r", op, payload)

    async def _identify(self, conn: GatewayConnection, d: Dict[str, Any]) -> None:
        self.identify_payload = d
        self.identifies.append(d)
        token = str(d.get("token", ""))
        intents = int(d.get("intents", 0) or 0)
        if token in self.rejected_tokens:
            await conn.close(4004, b"Authentication failed.")
            return
        if self.allowed_intents is not None and intents & ~self.allowed_intents:
            await conn.close(4014, b"Disallowed intent(s).")
            return
        conn.token = token
        conn.intents = intents
        conn.shard = d.get("shard")
        conn.session_id = uuid.uuid4().hex
        conn.identified = True
        self._sessions[conn.session_id] = {"intents": intents, "token": token, "shard": conn.shard}
        me = dict(self.bot_user, verified=True, mfa_enabled=False, flags=0, email=None, locale="en-US",
                  premium_type=0)
        ready = {
            "v": API_VERSION,
            "user": me,
            "user_settings": {},
            "guilds": [{"id": gid, "unavailable": True} for gid in self.guilds if self.serves(conn, gid)],
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": ["local"],
            "session_type": "normal",
            "session_id": conn.session_id,
            "resume_gateway_url": self.gateway_url,
            "auth": {},
            "application": {"id": self.application_id, "flags": self.application_flags},
            "_trace": ["[\"fake-gateway\"]"],
        }
        if conn.shard is not None:
            ready["shard"] = conn.shard
        await self._send_dispatch(conn, "READY", ready)
        for gid, guild in self.guilds.items():
            if self.serves(conn, gid):
                await self._send_dispatch(conn, "GUILD_CREATE", self._public_guild(guild))
        self._ready.set()

    @staticmethod
    def shard_of(guild_id: Optional[Snowflake], shard_count: int) -> int:
        """Discord's rule: a guild's events go to shard (guild_id >> 22) % shard_count; DMs to shard 0."""
        return 0 if guild_id is None else (int(guild_id) >> 22) % shard_count

    @classmethod
    def serves(cls, conn: GatewayConnection, guild_id: Optional[Snowflake]) -> bool:
        """Whether a connection gets the events of this guild (None: a DM). An unsharded
        connection (no "shard" in IDENTIFY) gets everything."""
        if not conn.shard:
            return True
        shard_id, shard_count = conn.shard
        return cls.shard_of(guild_id, int(shard_count)) == int(shard_id)

    async def _resume(self, conn: GatewayConnection, d: Dict[str, Any]) -> None:
        self.resumes.append(d)
        info = self._sessions.get(str(d.get("session_id")))
        if info is None or info["token"] != d.get("token"):
            await conn.send({"op": 9, "d": False, "s": None, "t": None})
            return
        conn.token = info["token"]
        conn.intents = info["intents"]
        conn.shard = info["shard"]
        conn.session_id = str(d["session_id"])
        conn.seq = int(d.get("seq") or 0)
        conn.identified = True
        conn.resumed = True
        await self._send_dispatch(conn, "RESUMED", {"_trace": ["[\"fake-gateway\"]"]})

    async def _request_members(self, conn: GatewayConnection, d: Dict[str, Any]) -> None:
        self.member_requests.append(d)
        gid = str(d.get("guild_id"))
        guild = self.guilds.get(gid)
        members = list(guild["members"]) if guild else []
        user_ids = d.get("user_ids")
        if user_ids:
            wanted = {str(u) for u in (user_ids if isinstance(user_ids, list) else [user_ids])}
            members = [m for m in members if m["user"]["id"] in wanted]
        query = d.get("query")
        if query:
            members = [m for m in members if m["user"]["username"].lower().startswith(query.lower())]
        limit = int(d.get("limit") or 0)
        if limit:
            members = members[:limit]
        chunk = {"guild_id": gid, "members": members, "chunk_index": 0, "chunk_count": 1, "not_found": []}
        if d.get("nonce"):
            chunk["nonce"] = d["nonce"]
        if d.get("presences"):
            chunk["presences"] = []
        await self._send_dispatch(conn, "GUILD_MEMBERS_CHUNK", chunk)

    async def _send_dispatch(self, conn: GatewayConnection, event: str, data: Dict[str, Any]) -> None:
        await conn.send({"op": 0, "t": event, "s": None, "d": data})

    async def dispatch(self, event: str, data: Dict[str, Any]) -> int:
        """Send an op 0 DISPATCH ``event`` to every identified connection.

        Raises RuntimeError if no bot is connected (so tests fail loudly).
        Returns the number of connections it was sent to.
        """
        return await self._dispatch(event, lambda conn: data, require=True)

    async def _dispatch(
        self,
        event: str,
        make: Callable[[GatewayConnection], Optional[Dict[str, Any]]],
        *,
        require: bool,
        guild_id: Optional[str] = None,
    ) -> int:
        """``guild_id``: the guild whose shard gets the event, when the payload
        names it otherwise (GUILD_CREATE / GUILD_DELETE carry it as ``id``)."""
        conns = self.live_connections
        if not conns and require:
            raise RuntimeError(f"FakeDiscord.dispatch({event}): no identified gateway connection")
        sent = 0
        for conn in conns:
            data = make(conn)
            if data is None or not self.serves(conn, guild_id if guild_id is not None else data.get("guild_id")):
                continue
            if event == "MESSAGE_CREATE":
                self._store_message(data)
            self.dispatched.append((event, data))
            await self._send_dispatch(conn, event, data)
            sent += 1
        return sent

    async def remove_guild(self, guild: Union[Dict[str, Any], Snowflake], *, unavailable: bool = False) -> int:
        """Dispatch GUILD_DELETE as Discord does when the bot leaves or is removed
        from a guild (kicked, banned, the guild deleted): the guild leaves the
        world (a later IDENTIFY no longer lists it). With ``unavailable`` it is
        an outage instead: the guild stays, and discord.py reports
        ``on_guild_unavailable``, not ``on_guild_remove``. Returns the number
        of connections it was sent to (the guild's shard only)."""
        gid = _sid(guild)
        data: Dict[str, Any] = {"id": gid}
        if unavailable:
            data["unavailable"] = True
        else:
            self.guilds.pop(gid, None)
        return await self._dispatch("GUILD_DELETE", lambda conn: data, require=True, guild_id=gid)

    async def join_guild(self, guild: Dict[str, Any]) -> int:
        """Dispatch GUILD_CREATE for a guild the bot was just added to (one made
        with :meth:`add_guild` after the bot connected, or one removed with
        :meth:`remove_guild` and added back): discord.py reports
        ``on_guild_join``. Without an ``unavailable`` key, as Discord sends a
        join (``unavailable: false`` would be an outage ending)."""
        gid = _sid(guild)
        self.guilds[gid] = guild
        data = {k: v for k, v in self._public_guild(guild).items() if k != "unavailable"}
        return await self._dispatch("GUILD_CREATE", lambda conn: data, require=True, guild_id=gid)

    async def send_reconnect(self) -> None:
        """Send op 7 RECONNECT (discord.py closes and RESUMEs)."""
        for conn in self.live_connections:
            await conn.send({"op": 7, "d": None, "s": None, "t": None})

    async def invalidate_session(self, resumable: bool = False) -> None:
        """Send op 9 INVALID_SESSION."""
        for conn in self.live_connections:
            await conn.send({"op": 9, "d": resumable, "s": None, "t": None})

    async def close_gateway(self, code: int = 4000) -> None:
        """Drop every live gateway connection with ``code`` (4000 = resumable)."""
        for conn in self.live_connections:
            await conn.close(code)

    # ------------------------------------------------------------------ user-side actions
    async def send_message(
        self,
        channel_id: Snowflake,
        author: UserLike,
        content: str,
        guild_id: Optional[Snowflake] = None,
        mentions: Iterable[UserLike] = (),
        *,
        mention_roles: Iterable[Snowflake] = (),
        mention_everyone: bool = False,
        reply_to: Optional[Union[Dict[str, Any], Snowflake]] = None,
        attachments: Iterable[Dict[str, Any]] = (),
        embeds: Iterable[Dict[str, Any]] = (),
        message_id: Optional[Snowflake] = None,
        dispatch: bool = True,
        **extra: Any,
    ) -> Dict[str, Any]:
        """Dispatch a MESSAGE_CREATE as if ``author`` typed ``content`` (``dispatch=False``: only
        store it, as a message written before the bot joined, which REST still serves).

        ``guild_id`` is inferred from the channel when omitted; DM channels
        (see :meth:`dm_channel`) produce a message without guild_id/member.
        ``mentions`` are users (dicts/ids) and are *not* auto-parsed from the
        content; use ``fake.mention(user)`` to put ``<@id>`` in the text.
        Returns the full message payload (also stored in ``fake.messages``).
        """
        cid = str(channel_id)
        user = self._user(author)
        gid = str(guild_id) if guild_id is not None else self._guild_of_channel(cid)
        mid = str(message_id) if message_id is not None else self.snowflake()
        mention_users = [self._user(m) for m in mentions]
        msg: Dict[str, Any] = {
            "id": mid,
            "channel_id": cid,
            "author": user,
            "content": content,
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": mention_everyone,
            "mentions": [],
            "mention_roles": [str(r) for r in mention_roles],
            "attachments": list(attachments),
            "embeds": list(embeds),
            "components": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
            "nonce": None,
            "referenced_message": None,
        }
        if gid is not None:
            msg["guild_id"] = gid
            msg["member"] = self._member_without_user(self._member_or_default(gid, user))
            for mu in mention_users:
                m = self._member_or_default(gid, mu)
                msg["mentions"].append(dict(mu, member=self._member_without_user(m)))
        else:
            msg["mentions"] = [dict(mu) for mu in mention_users]
        if reply_to is not None:
            ref_id = _sid(reply_to)
            ref = reply_to if isinstance(reply_to, dict) else self._find_message(ref_id)
            msg["type"] = 19
            msg["message_reference"] = {"type": 0, "message_id": ref_id, "channel_id": cid}
            if gid is not None:
                msg["message_reference"]["guild_id"] = gid
            msg["referenced_message"] = ref
        msg.update(extra)
        mentions_bot = any(mu["id"] == self.bot_user["id"] for mu in mention_users)
        # like Discord, a reply to the bot's message is delivered with its content without MESSAGE_CONTENT
        referenced = msg.get("referenced_message") or {}
        mentions_bot = mentions_bot or (referenced.get("author") or {}).get("id") == self.bot_user["id"]

        def make(conn: GatewayConnection) -> Optional[Dict[str, Any]]:
            if not self.enforce_intents or user["id"] == self.bot_user["id"]:
                return msg
            if gid is None:
                return msg if conn.has_intent(Intents.DIRECT_MESSAGES) else None
            if not conn.has_intent(Intents.GUILD_MESSAGES):
                return None
            if not conn.has_intent(Intents.MESSAGE_CONTENT) and not mentions_bot:
                return dict(msg, content="", embeds=[], attachments=[], components=[])
            return msg

        self._store_message(msg)
        if dispatch:
            await self._dispatch("MESSAGE_CREATE", make, require=True)
        return msg

    async def send_interaction(
        self,
        name: str,
        user: UserLike,
        channel_id: Snowflake,
        *,
        guild_id: Optional[Snowflake] = None,
        options: Optional[Union[Dict[str, Any], List[Dict[str, Any]]]] = None,
        resolved: Optional[Dict[str, Any]] = None,
        command_id: Optional[Snowflake] = None,
        command_type: int = 1,
        command_guild_id: Optional[Snowflake] = None,
        locale: str = "en-US",
        app_permissions: Optional[int] = None,
        target_id: Optional[Snowflake] = None,
        **extra: Any,
    ) -> Dict[str, Any]:
        """Dispatch an APPLICATION_COMMAND (type 2) INTERACTION_CREATE.

        ``options`` is either ``{"name": value}`` (str/int/float/bool, types
        inferred) or a raw Discord options list (for subcommands etc.).
        ``command_guild_id`` marks it as a guild command (data.guild_id), which
        discord.py's tree uses to look up guild-scoped commands.
        Returns the payload; its ``token``/``id`` key the recorded responses.
        """
        cid = str(channel_id)
        u = self._user(user)
        gid = str(guild_id) if guild_id is not None else self._guild_of_channel(cid)
        if isinstance(options, dict):
            opts = [self._option(k, v) for k, v in options.items()]
        else:
            opts = list(options or [])
        data: Dict[str, Any] = {"id": str(command_id) if command_id is not None else
                                self._command_id(str(command_guild_id) if command_guild_id else None, name,
                                                 command_type),
                                "name": name, "type": command_type}
        if opts:
            data["options"] = opts
        if resolved:
            data["resolved"] = resolved
        if command_guild_id is not None:
            data["guild_id"] = str(command_guild_id)
        if target_id is not None:  # a context menu's user or message
            data["target_id"] = str(target_id)
        iid = self.snowflake()
        token = "aW50ZXJhY3Rpb246" + uuid.uuid4().hex + uuid.uuid4().hex
        payload: Dict[str, Any] = {
            "id": iid,
            "application_id": self.application_id,
            "type": 2,
            "data": data,
            "channel_id": cid,
            "token": token,
            "version": 1,
            "locale": locale,
            "entitlements": [],
            "entitlement_sku_ids": [],
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        if gid is not None:
            guild = self.guilds[gid]
            ch = self.channels.get(cid, {"id": cid, "type": 0, "guild_id": gid, "name": "unknown", "position": 0})
            member = self._member_or_default(gid, u)
            payload.update(
                guild_id=gid,
                guild={"id": gid, "locale": guild.get("preferred_locale", "en-US"), "features": guild["features"]},
                guild_locale=guild.get("preferred_locale", "en-US"),
                channel=dict(ch, permissions=str(self.base_permissions(gid, u))),
                member=dict(member, permissions=str(self.base_permissions(gid, u))),
                app_permissions=str(app_permissions if app_permissions is not None
                                    else self.base_permissions(gid, self.bot_user)),
                authorizing_integration_owners={"0": gid},
                context=0,
            )
        else:
            ch = self.channels.get(cid) or self.dm_channel(u)
            payload.update(
                channel=dict(ch),
                user=u,
                app_permissions=str(app_permissions if app_permissions is not None else Perm.EVERYONE_DEFAULT),
                authorizing_integration_owners={"0": "0"},
                context=1,
            )
        payload.update(extra)
        self.interactions[token] = payload
        await self._dispatch("INTERACTION_CREATE", lambda conn: payload, require=True)
        return payload

    async def use_message_menu(self, name: str, user: UserLike, message: Dict[str, Any], *,
                               command_id: Optional[Snowflake] = None, **extra: Any) -> Dict[str, Any]:
        """Dispatch a message command (a context menu, data.type 3): ``user`` right-clicks
        ``message`` (a payload from :meth:`send_message` or a bot message) and picks ``name``.
        Discord sends the target's id and the whole message in ``data.resolved.messages``."""
        target = self._find_message(_sid(message["id"]), message["channel_id"]) or message
        resolved = {"messages": {target["id"]: {k: v for k, v in target.items() if k not in ("guild_id", "member")}}}
        return await self.send_interaction(name, user, target["channel_id"], command_type=3, resolved=resolved,
                                           command_id=command_id, target_id=target["id"], **extra)

    async def autocomplete(self, name: str, user: UserLike, channel_id: Snowflake,
                           options: List[Dict[str, Any]], *, command_id: Optional[Snowflake] = None,
                           **extra: Any) -> Dict[str, Any]:
        """Dispatch an APPLICATION_COMMAND_AUTOCOMPLETE (type 4) INTERACTION_CREATE: ``user`` is
        typing into the option marked ``"focused": True`` of ``options`` (raw Discord options, the
        typed value a string). Its answer is recorded as a type 8 callback
        (:meth:`wait_for_interaction_response`; the choices are in ``data.choices``)."""
        return await self.send_interaction(name, user, channel_id, options=options, command_id=command_id,
                                           type=4, **extra)

    async def press_button(self, user: UserLike, message: Dict[str, Any], label: Optional[str] = None, *,
                           custom_id: Optional[str] = None) -> Dict[str, Any]:
        """Dispatch a MESSAGE_COMPONENT (type 3) INTERACTION_CREATE: ``user`` presses the button
        ``label`` (or ``custom_id``) of ``message``, a message the bot posted (e.g. the
        ``message`` of an interaction response record). Returns the payload."""
        if custom_id is None:
            custom_id = next((c["custom_id"] for row in message.get("components") or []
                              for c in row.get("components") or [] if c.get("label") == label), None)
            if custom_id is None:
                raise KeyError(f"no button {label!r} on message {message['id']}")
        return await self.send_interaction("", user, message["channel_id"], type=3, message=message,
                                           data={"custom_id": custom_id, "component_type": 2})

    async def click(self, message: Dict[str, Any], user: UserLike, label: str) -> Dict[str, Any]:
        """`press_button` with the message first: ``user`` presses the button labelled ``label``."""
        return await self.press_button(user, message, label)

    @staticmethod
    def _option(name: str, value: Any) -> Dict[str, Any]:
        if isinstance(value, bool):
            t = 5
        elif isinstance(value, int):
            t = 4
        elif isinstance(value, float):
            t = 10
        else:
            t, value = 3, str(value)
        return {"name": name, "type": t, "value": value}

    def _command_id(self, guild_id: Optional[str], name: str, type_: int) -> str:
        key = (guild_id, name, type_)
        if key not in self._command_ids:
            self._command_ids[key] = self.snowflake()
        return self._command_ids[key]

    # ------------------------------------------------------------------ waiting
    async def wait_for(
        self,
        predicate: Callable[[], Any],
        timeout: float = 15.0,
        *,
        interval: float = 0.01,
        message: Optional[str] = None,
    ) -> Any:
        """Poll ``predicate()`` (may be async) until truthy; return its value.

        Raises TimeoutError after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            if loop.time() >= deadline:
                raise TimeoutError(message or f"FakeDiscord.wait_for: condition not met within {timeout}s")
            await asyncio.sleep(interval)

    async def wait_until_ready(self, timeout: float = 15.0) -> None:
        """Wait until some client IDENTIFYed and got READY + all GUILD_CREATEs."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no bot identified within {timeout}s; requests so far: "
                               f"{[(r['method'], r['path'], r['status']) for r in self.requests]}") from None

    async def wait_for_sent_message(
        self,
        channel_id: Optional[Snowflake] = None,
        *,
        since: int = 0,
        predicate: Optional[Callable[[Dict[str, Any]], bool]] = None,
        timeout: float = 15.0,
    ) -> Dict[str, Any]:
        """Wait for a recorded REST message (``sent_messages[since:]``) in ``channel_id``."""
        def find() -> Optional[Dict[str, Any]]:
            for rec in self.sent_messages[since:]:
                if channel_id is not None and rec["channel_id"] != str(channel_id):
                    continue
                if predicate is not None and not predicate(rec):
                    continue
                return rec
            return None

        return await self.wait_for(
            find, timeout,
            message=f"bot sent no matching message to channel {channel_id} within {timeout}s "
                    f"(sent: {[(r['channel_id'], r['json'].get('content')) for r in self.sent_messages]}, "
                    f"unhandled: {[(r['method'], r['path']) for r in self.unhandled_requests]})",
        )

    async def wait_for_interaction_response(self, interaction: Optional[Dict[str, Any]] = None,
                                            timeout: float = 15.0) -> Dict[str, Any]:
        token = interaction["token"] if interaction else None

        def find() -> Optional[Dict[str, Any]]:
            for rec in self.interaction_responses:
                if token is None or rec["token"] == token:
                    return rec
            return None

        return await self.wait_for(find, timeout, message=f"no interaction callback within {timeout}s")

    def clear_recordings(self) -> None:
        for lst in (self.requests, self.unhandled_requests, self.errors, self.sent_messages, self.edited_messages,
                    self.deleted_messages, self.reactions, self.typing, self.interaction_responses, self.followups,
                    self.dispatched, self.presence_updates, self.member_requests):
            lst.clear()

    # ------------------------------------------------------------------ REST plumbing
    def _build_routes(self) -> List[Tuple[str, "re.Pattern[str]", Callable[..., Awaitable[web.StreamResponse]]]]:
        S = r"(?P<%s>\d+)"
        T = r"(?P<token>[^/]+)"
        table = [
            ("GET", "/gateway", self._get_gateway),
            ("GET", "/gateway/bot", self._get_gateway_bot),
            ("GET", "/users/@me", self._get_me),
            ("GET", "/users/" + S % "user_id", self._get_user),
            ("POST", "/users/@me/channels", self._create_dm),
            ("GET", "/oauth2/applications/@me", self._get_app),
            ("GET", "/applications/@me", self._get_app),
            ("GET", "/channels/" + S % "channel_id", self._get_channel),
            ("POST", "/channels/" + S % "channel_id" + "/messages", self._post_message),
            ("GET", "/channels/" + S % "channel_id" + "/messages", self._get_messages),
            ("GET", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id", self._get_message),
            ("PATCH", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id", self._edit_message),
            ("DELETE", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id", self._delete_message),
            ("PUT", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id" + "/reactions/(?P<emoji>[^/]+)/@me",
             self._reaction),
            ("DELETE", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id"
             + "/reactions/(?P<emoji>[^/]+)/@me", self._reaction),
            ("POST", "/channels/" + S % "channel_id" + "/typing", self._typing),
            ("POST", "/channels/" + S % "channel_id" + "/messages/" + S % "message_id" + "/threads",
             self._thread_from_message),
            ("GET", "/guilds/" + S % "guild_id", self._get_guild),
            ("GET", "/guilds/" + S % "guild_id" + "/channels", self._get_guild_channels),
            ("GET", "/guilds/" + S % "guild_id" + "/roles", self._get_guild_roles),
            ("GET", "/guilds/" + S % "guild_id" + "/members", self._get_members),
            ("GET", "/guilds/" + S % "guild_id" + "/members/" + S % "user_id", self._get_member),
            ("POST", "/interactions/" + S % "interaction_id" + "/" + T + "/callback", self._interaction_callback),
            ("POST", "/webhooks/" + S % "app_id" + "/" + T, self._webhook_execute),
            ("GET", "/webhooks/" + S % "app_id" + "/" + T + "/messages/@original", self._webhook_get_original),
            ("PATCH", "/webhooks/" + S % "app_id" + "/" + T + "/messages/(?P<message_id>@original|\\d+)",
             self._webhook_edit),
            ("DELETE", "/webhooks/" + S % "app_id" + "/" + T + "/messages/(?P<message_id>@original|\\d+)",
             self._webhook_delete),
            ("GET", "/applications/" + S % "app_id" + "/commands", self._get_commands),
            ("PUT", "/applications/" + S % "app_id" + "/commands", self._put_commands),
            ("POST", "/applications/" + S % "app_id" + "/commands", self._post_command),
            ("DELETE", "/applications/" + S % "app_id" + "/commands/" + S % "command_id", self._delete_command),
            ("GET", "/applications/" + S % "app_id" + "/guilds/" + S % "guild_id" + "/commands", self._get_commands),
            ("PUT", "/applications/" + S % "app_id" + "/guilds/" + S % "guild_id" + "/commands", self._put_commands),
            ("POST", "/applications/" + S % "app_id" + "/guilds/" + S % "guild_id" + "/commands", self._post_command),
            ("DELETE", "/applications/" + S % "app_id" + "/guilds/" + S % "guild_id" + "/commands/"
             + S % "command_id", self._delete_command),
        ]
        return [(m, re.compile("^" + p + "$"), h) for m, p, h in table]

    async def _read_body(self, request: web.Request) -> Tuple[Any, List[Dict[str, Any]]]:
        """Return (json_body_or_None, files).  Multipart: payload_json + files[n]."""
        files: List[Dict[str, Any]] = []
        ctype = request.content_type or ""
        if ctype.startswith("multipart/"):
            body: Any = None
            reader = await request.multipart()
            async for part in reader:
                if part is None:
                    break
                if part.name == "payload_json":
                    body = json.loads(await part.text())
                elif part.filename is not None:
                    files.append({"field": part.name, "filename": part.filename,
                                  "content_type": part.headers.get("Content-Type"),
                                  "data": bytes(await part.read())})
                else:
                    files.append({"field": part.name, "filename": None, "content_type": None,
                                  "data": bytes(await part.read())})
            return body, files
        raw = await request.read()
        if not raw:
            return None, files
        try:
            return json.loads(raw), files
        except ValueError:
            return raw.decode(errors="replace"), files

    async def _unknown_root(self, request: web.Request) -> web.StreamResponse:
        rec = {"method": request.method, "path": request.path, "query": dict(request.query), "json": None,
               "files": [], "token": None, "status": 404}
        self.requests.append(rec)
        self.unhandled_requests.append(rec)
        log.warning("FakeDiscord: unhandled request %s %s (not under /api/v%d)", request.method, request.path_qs,
                    API_VERSION)
        return _error(404, "404: Not Found", 0)

    async def _rest_handler(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        body, files = await self._read_body(request)
        auth = request.headers.get("Authorization")
        token = auth[4:] if auth and auth.startswith("Bot ") else auth
        rec: Dict[str, Any] = {"method": request.method, "path": path, "query": dict(request.query),
                               "json": body, "files": files, "token": token, "status": None}
        # "body" is kept as an alias of "json" for convenience
        rec["body"] = body
        self.requests.append(rec)

        if token is not None and token in self.rejected_tokens:
            resp = _error(401, "401: Unauthorized", 0)
        else:
            for method, pattern, handler in self._routes:
                if method != request.method:
                    continue
                m = pattern.match(path)
                if m:
                    resp = await handler(request, m.groupdict(), body, files)
                    break
            else:
                self.unhandled_requests.append(rec)
                log.warning("FakeDiscord: unhandled route %s %s (json=%r)", request.method, request.path_qs, body)
                resp = _error(404, "Unknown", 0)
        rec["status"] = resp.status
        if resp.status >= 400:
            self.errors.append(rec)
            if resp.status != 404 or rec not in self.unhandled_requests:
                log.info("FakeDiscord: %s %s -> %s %s", request.method, path, resp.status,
                         getattr(resp, "text", ""))
        return resp

    # ------------------------------------------------------------------ REST handlers
    async def _get_gateway(self, request, p, body, files):
        return _json({"url": self.gateway_url})

    async def _get_gateway_bot(self, request, p, body, files):
        return _json({
            "url": self.gateway_url,
            "shards": self.recommended_shards,
            "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1},
        })

    async def _get_me(self, request, p, body, files):
        return _json(dict(self.bot_user, verified=True, mfa_enabled=False, flags=0, email=None,
                                      locale="en-US", premium_type=0))

    async def _get_user(self, request, p, body, files):
        user = self.users.get(p["user_id"])
        if user is None:
            return _error(404, "Unknown User", 10013)
        return _json(user)

    async def _get_app(self, request, p, body, files):
        owner = next((u for u in self.users.values() if not u["bot"]), None) or self.add_user("owner")
        return _json({
            "id": self.application_id,
            "name": self.bot_user["username"],
            "icon": None,
            "description": "",
            "summary": "",
            "type": None,
            "hook": True,
            "bot_public": True,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "owner": owner,
            "team": None,
            "flags": self.application_flags,
            "bot": dict(self.bot_user),
            "redirect_uris": [],
            "interactions_endpoint_url": None,
            "role_connections_verification_url": None,
            "tags": [],
            "install_params": None,
            "integration_types_config": {"0": {}},
            "approximate_guild_count": len(self.guilds),
            "approximate_user_install_count": 0,
        })

    async def _create_dm(self, request, p, body, files):
        rid = str((body or {}).get("recipient_id", ""))
        if rid not in self.users:
            return _error(404, "Unknown User", 10013)
        return _json(self.dm_channel(rid))

    async def _get_channel(self, request, p, body, files):
        ch = self.channels.get(p["channel_id"])
        if ch is None:
            return _error(404, "Unknown Channel", 10003)
        return _json(ch)

    def _bot_message(self, channel_id: str, body: Dict[str, Any], files: List[Dict[str, Any]],
                     *, webhook_id: Optional[str] = None, message_id: Optional[str] = None) -> Dict[str, Any]:
        """Build the message object Discord returns for a message the bot created."""
        mid = message_id or self.snowflake()
        attachments = []
        file_parts = [f for f in files if f["filename"] is not None]
        meta = {str(a.get("id")): a for a in (body.get("attachments") or []) if isinstance(a, dict)}
        for index, f in enumerate(file_parts):
            aid = self.snowflake()
            extra = meta.get(str(index), {})
            attachments.append({
                "id": aid,
                "filename": f["filename"],
                "size": len(f["data"]),
                "url": f"https://cdn.discordapp.com/attachments/{channel_id}/{aid}/{f['filename']}",
                "proxy_url": f"https://media.discordapp.net/attachments/{channel_id}/{aid}/{f['filename']}",
                "content_type": f["content_type"],
                "description": extra.get("description"),
                "spoiler": f["filename"].startswith("SPOILER_"),
            })
        ref = body.get("message_reference")
        msg: Dict[str, Any] = {
            "id": mid,
            "channel_id": channel_id,
            "author": self.bot_user,
            "content": body.get("content") or "",
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": bool(body.get("tts", False)),
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": attachments,
            "embeds": body.get("embeds") or [],
            "components": body.get("components") or [],
            "pinned": False,
            "type": 19 if ref else 0,
            "flags": int(body.get("flags") or 0),
            "nonce": body.get("nonce"),
        }
        if body.get("sticker_ids"):
            msg["sticker_items"] = []
        if webhook_id is not None:
            msg["webhook_id"] = webhook_id
            msg["application_id"] = self.application_id
        if ref:
            ref_id = str(ref.get("message_id"))
            msg["message_reference"] = {"type": ref.get("type", 0), "message_id": ref_id,
                                        "channel_id": str(ref.get("channel_id") or channel_id)}
            if ref.get("guild_id") is not None:
                msg["message_reference"]["guild_id"] = str(ref["guild_id"])
            msg["referenced_message"] = self._find_message(ref_id)
        return msg

    def _validate_message_body(self, body: Dict[str, Any], files: List[Dict[str, Any]], channel_id: str
                               ) -> Optional[web.Response]:
        content = body.get("content")
        if content is not None and len(content) > 2000:
            return _form_error("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
        embeds = body.get("embeds") or []
        if len(embeds) > 10:
            return _form_error("embeds", "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        if not (content or embeds or files or body.get("sticker_ids") or body.get("components")
                or body.get("poll") or body.get("attachments")):
            return _error(400, "Cannot send an empty message", 50006)
        ref = body.get("message_reference")
        if ref and ref.get("fail_if_not_exists", True) and ref.get("type", 0) == 0:
            if self._find_message(str(ref.get("message_id")), str(ref.get("channel_id") or channel_id)) is None:
                return _form_error("message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
        return None

    async def _echo(self, msg: Dict[str, Any]) -> None:
        """Real Discord sends the bot its own messages over the gateway too."""
        self._store_message(msg)
        if not self.echo_bot_messages:
            return
        gid = self._guild_of_channel(msg["channel_id"])
        event = dict(msg)
        if gid is not None:
            event["guild_id"] = gid
            event["member"] = self._member_without_user(self._member_or_default(gid, self.bot_user))

        def make(conn: GatewayConnection) -> Optional[Dict[str, Any]]:
            if self.enforce_intents:
                need = Intents.GUILD_MESSAGES if gid is not None else Intents.DIRECT_MESSAGES
                if not conn.has_intent(need):
                    return None
            return event

        await self._dispatch("MESSAGE_CREATE", make, require=False)

    async def _post_message(self, request, p, body, files):
        cid = p["channel_id"]
        if cid not in self.channels:
            return _error(404, "Unknown Channel", 10003)
        body = body if isinstance(body, dict) else {}
        bad = self._validate_message_body(body, files, cid)
        if bad is not None:
            return bad
        msg = self._bot_message(cid, body, files)
        self.sent_messages.append({"channel_id": cid, "json": body, "files": files, "message": msg,
                                   "content": body.get("content")})
        await self._echo(msg)
        return _json(msg)

    async def _thread_from_message(self, request, p, body, files):
        cid, mid = p["channel_id"], p["message_id"]
        if cid not in self.channels or self._find_message(mid, cid) is None:
            return _error(404, "Unknown Message", 10008)
        if mid in self.channels:
            return _error(400, "A thread has already been created for this message", 160004)
        name = str((body or {}).get("name") or "")
        if not 1 <= len(name) <= 100:
            return _form_error("name", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        thread = self.add_thread(cid, name, id=mid)
        self.created_threads.append(thread)
        await self._dispatch("THREAD_CREATE", lambda conn: dict(thread, newly_created=True), require=False)
        return _json(thread, 201)

    async def _get_messages(self, request, p, body, files):
        cid = p["channel_id"]
        if cid not in self.channels:
            return _error(404, "Unknown Channel", 10003)
        msgs = self.messages.get(cid, [])
        q = request.query
        limit = max(1, min(100, int(q.get("limit", 50))))
        if "before" in q:
            msgs = [m for m in msgs if int(m["id"]) < int(q["before"])]
            result = msgs[-limit:]
        elif "after" in q:
            msgs = [m for m in msgs if int(m["id"]) > int(q["after"])]
            result = msgs[:limit]
        elif "around" in q:
            ids = [int(m["id"]) for m in msgs]
            centre = min(range(len(ids)), key=lambda i: abs(ids[i] - int(q["around"]))) if ids else 0
            start = max(0, centre - limit // 2)
            result = msgs[start:start + limit]
        else:
            result = msgs[-limit:]
        return _json(list(reversed(result)))  # newest first, like Discord

    async def _get_message(self, request, p, body, files):
        msg = self._find_message(p["message_id"], p["channel_id"])
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        return _json(msg)

    async def _edit_message(self, request, p, body, files):
        msg = self._find_message(p["message_id"], p["channel_id"])
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        body = body if isinstance(body, dict) else {}
        if body.get("content") is not None and len(body["content"]) > 2000:
            return _form_error("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
        for key in ("content", "embeds", "components", "flags"):
            if key in body:
                msg[key] = body[key] if body[key] is not None else ([] if key != "content" else "")
        msg["edited_timestamp"] = _now_iso()
        self.edited_messages.append({"channel_id": p["channel_id"], "message_id": p["message_id"], "json": body,
                                     "files": files})
        return _json(msg)

    async def _delete_message(self, request, p, body, files):
        msg = self._find_message(p["message_id"], p["channel_id"])
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        self.messages[p["channel_id"]].remove(msg)
        self.deleted_messages.append({"channel_id": p["channel_id"], "message_id": p["message_id"]})
        return web.Response(status=204)

    async def _reaction(self, request, p, body, files):
        if self._find_message(p["message_id"], p["channel_id"]) is None:
            return _error(404, "Unknown Message", 10008)
        from urllib.parse import unquote
        self.reactions.append({"method": request.method, "channel_id": p["channel_id"],
                               "message_id": p["message_id"], "emoji": unquote(p["emoji"])})
        return web.Response(status=204)

    async def _typing(self, request, p, body, files):
        if p["channel_id"] not in self.channels:
            return _error(404, "Unknown Channel", 10003)
        self.typing.append(p["channel_id"])
        return web.Response(status=204)

    async def _get_guild(self, request, p, body, files):
        g = self.guilds.get(p["guild_id"])
        if g is None:
            return _error(404, "Unknown Guild", 10004)
        drop = {"channels", "members", "threads", "presences", "voice_states", "joined_at", "large",
                "member_count", "lazy", "unavailable", "stage_instances", "guild_scheduled_events",
                "soundboard_sounds"}
        return _json({k: v for k, v in self._public_guild(g).items() if k not in drop})

    async def _get_guild_channels(self, request, p, body, files):
        g = self.guilds.get(p["guild_id"])
        if g is None:
            return _error(404, "Unknown Guild", 10004)
        return _json(g["channels"])

    async def _get_guild_roles(self, request, p, body, files):
        g = self.guilds.get(p["guild_id"])
        if g is None:
            return _error(404, "Unknown Guild", 10004)
        return _json(g["roles"])

    async def _get_members(self, request, p, body, files):
        g = self.guilds.get(p["guild_id"])
        if g is None:
            return _error(404, "Unknown Guild", 10004)
        limit = int(request.query.get("limit", 1))
        after = int(request.query.get("after", 0))
        members = sorted((m for m in g["members"] if int(m["user"]["id"]) > after), key=lambda m: int(m["user"]["id"]))
        return _json(members[:limit])

    async def _get_member(self, request, p, body, files):
        m = self.member(p["guild_id"], p["user_id"])
        if m is None:
            return _error(404, "Unknown Member", 10007)
        return _json(m)

    # ---- interactions / webhooks
    async def _interaction_callback(self, request, p, body, files):
        token = p["token"]
        interaction = self.interactions.get(token)
        if interaction is None or interaction["id"] != p["interaction_id"]:
            return _error(404, "Unknown interaction", 10062)
        if token in self._responded:
            return _error(400, "Interaction has already been acknowledged.", 40060)
        body = body if isinstance(body, dict) else {}
        cb_type = int(body.get("type", 0))
        data = body.get("data") or {}
        flags = int(data.get("flags") or 0)
        record = {"interaction_id": p["interaction_id"], "token": token, "type": cb_type, "data": data,
                  "json": body, "files": files, "ephemeral": bool(flags & 64),
                  "with_response": _truthy(request.query.get("with_response"))}
        self.interaction_responses.append(record)
        self._responded.add(token)

        cid = interaction.get("channel_id") or interaction.get("channel", {}).get("id")
        message: Optional[Dict[str, Any]] = None
        if cb_type in (4, 5):  # CHANNEL_MESSAGE_WITH_SOURCE / DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
            msg_body = dict(data)
            if cb_type == 5:
                msg_body = {"content": "", "flags": flags | 128}  # LOADING
            message = self._bot_message(str(cid), msg_body, files, webhook_id=self.application_id)
            message["type"] = 20  # CHAT_INPUT_COMMAND
            message["interaction_metadata"] = {
                "id": interaction["id"], "type": interaction["type"],
                "user": interaction.get("user") or interaction["member"]["user"],
                "authorizing_integration_owners": interaction.get("authorizing_integration_owners", {}),
                "name": interaction["data"].get("name"),
                "command_type": interaction["data"].get("type", 1),
            }
            self._original_responses[token] = message
            record["message"] = message
            if cb_type == 4 and not flags & 64:
                await self._echo(message)
        elif cb_type in (6, 7) and interaction.get("message"):
            # DEFERRED_UPDATE_MESSAGE / UPDATE_MESSAGE of a component interaction: its "original
            # response" is the message the component is on, edited in place.
            message = interaction["message"]
            for key in ("content", "embeds", "components"):
                if cb_type == 7 and key in data:
                    message[key] = data[key] if data[key] is not None else ([] if key != "content" else "")
            self._original_responses[token] = message
            record["message"] = message
        if not record["with_response"]:
            return web.Response(status=204)
        payload: Dict[str, Any] = {"interaction": {
            "id": interaction["id"],
            "type": interaction["type"],
            "response_message_loading": cb_type == 5,
            "response_message_ephemeral": bool(flags & 64),
        }}
        if message is not None:
            payload["interaction"]["response_message_id"] = message["id"]
            payload["resource"] = {"type": cb_type, "message": message}
        elif cb_type in (6, 7, 9, 12):
            payload["resource"] = {"type": cb_type}
        return _json(payload)

    def _check_webhook(self, p) -> Optional[web.Response]:
        if p["app_id"] != self.application_id or p["token"] not in self.interactions:
            return _error(404, "Unknown Webhook", 10015)
        return None

    async def _webhook_execute(self, request, p, body, files):
        bad = self._check_webhook(p)
        if bad is not None:
            return bad
        body = body if isinstance(body, dict) else {}
        if p["token"] not in self._responded:
            return _error(404, "Unknown Webhook", 10015)  # followups need an initial response first
        interaction = self.interactions[p["token"]]
        cid = str(interaction.get("channel_id"))
        invalid = self._validate_message_body(body, files, cid)
        if invalid is not None:
            return invalid
        msg = self._bot_message(cid, body, files, webhook_id=self.application_id)
        self.followups.append({"kind": "followup", "method": "POST", "token": p["token"], "json": body,
                               "files": files, "message": msg, "ephemeral": bool(msg["flags"] & 64)})
        if not msg["flags"] & 64:
            await self._echo(msg)
        if _truthy(request.query.get("wait")):
            return _json(msg)
        return web.Response(status=204)

    async def _webhook_get_original(self, request, p, body, files):
        bad = self._check_webhook(p)
        if bad is not None:
            return bad
        msg = self._original_responses.get(p["token"])
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        return _json(msg)

    async def _webhook_edit(self, request, p, body, files):
        bad = self._check_webhook(p)
        if bad is not None:
            return bad
        body = body if isinstance(body, dict) else {}
        token = p["token"]
        if p["message_id"] == "@original":
            msg = self._original_responses.get(token)
            if msg is None:
                return _error(404, "Unknown Message", 10008)
            kind = "edit_original"
        else:
            msg = self._find_message(p["message_id"])
            if msg is None:
                msg = next((f["message"] for f in self.followups if f["message"]["id"] == p["message_id"]), None)
            if msg is None:
                return _error(404, "Unknown Message", 10008)
            kind = "edit"
        if body.get("content") is not None and len(body["content"]) > 2000:
            return _form_error("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
        for key in ("content", "embeds", "components"):
            if key in body:
                msg[key] = body[key] if body[key] is not None else ([] if key != "content" else "")
        msg["flags"] = int(msg.get("flags", 0)) & ~128  # no longer loading
        msg["edited_timestamp"] = _now_iso()
        self.followups.append({"kind": kind, "method": "PATCH", "token": token, "json": body, "files": files,
                               "message": msg, "ephemeral": bool(msg["flags"] & 64)})
        return _json(msg)

    async def _webhook_delete(self, request, p, body, files):
        bad = self._check_webhook(p)
        if bad is not None:
            return bad
        self.followups.append({"kind": "delete", "method": "DELETE", "token": p["token"],
                               "message_id": p["message_id"], "json": None, "files": [], "message": None,
                               "ephemeral": False})
        if p["message_id"] == "@original":
            msg = self._original_responses.pop(p["token"], None)
        else:
            msg = self._find_message(p["message_id"])
        if msg is not None and msg in self.messages.get(msg["channel_id"], []):
            self.messages[msg["channel_id"]].remove(msg)
        return web.Response(status=204)

    # ---- application commands
    def _full_command(self, cmd: Dict[str, Any], guild_id: Optional[str]) -> Dict[str, Any]:
        out = dict(cmd)
        out.setdefault("type", 1)
        out.setdefault("description", "")
        out.setdefault("options", [])
        out.setdefault("default_member_permissions", None)
        out.setdefault("nsfw", False)
        out.setdefault("contexts", None)
        out.setdefault("integration_types", [0])
        out["id"] = self._command_id(guild_id, out["name"], int(out["type"]))
        out["application_id"] = self.application_id
        out["version"] = self.snowflake()
        if guild_id is not None:
            out["guild_id"] = guild_id
        else:
            out.setdefault("dm_permission", True)
        return out

    async def _get_commands(self, request, p, body, files):
        return _json(self.commands.get(p.get("guild_id"), []))

    async def _put_commands(self, request, p, body, files):
        gid = p.get("guild_id")
        if gid is not None and gid not in self.guilds:
            return _error(404, "Unknown Guild", 10004)
        cmds = [self._full_command(c, gid) for c in (body or [])]
        self.commands[gid] = cmds
        return _json(cmds)

    async def _post_command(self, request, p, body, files):
        gid = p.get("guild_id")
        cmd = self._full_command(body or {}, gid)
        existing = [c for c in self.commands.get(gid, []) if c["id"] != cmd["id"]]
        self.commands[gid] = existing + [cmd]
        return _json(cmd, status=201)

    async def _delete_command(self, request, p, body, files):
        gid = p.get("guild_id")
        self.commands[gid] = [c for c in self.commands.get(gid, []) if c["id"] != p["command_id"]]
        return web.Response(status=204)


# ---------------------------------------------------------------------- pointing discord.py at the fake
def _targets(fake: FakeDiscord) -> List[Tuple[Any, str, Any]]:
    import discord.gateway
    import discord.http
    import yarl

    if fake._runner is None:
        raise RuntimeError("start the FakeDiscord before patching discord.py's URLs")
    targets: List[Tuple[Any, str, Any]] = [(discord.http.Route, "BASE", fake.rest_url)]
    if hasattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY"):
        targets.append((discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url)))
    return targets


def patch_discord_urls(fake: FakeDiscord, monkeypatch: Any) -> None:
    """Point discord.py at ``fake`` for the rest of the test (pytest ``monkeypatch``).

    Patches ``discord.http.Route.BASE`` (all REST incl. interaction callbacks
    and webhooks) and ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY``
    (plain ``Client`` connects there without asking ``/gateway/bot``).
    """
    for obj, name, value in _targets(fake):
        monkeypatch.setattr(obj, name, value)


@contextlib.contextmanager
def discord_urls_patched(fake: FakeDiscord) -> Iterator[FakeDiscord]:
    """Same as :func:`patch_discord_urls` but as a plain context manager."""
    saved = []
    try:
        for obj, name, value in _targets(fake):
            saved.append((obj, name, obj.__dict__[name]))
            setattr(obj, name, value)
        yield fake
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


try:  # optional ready-made fixture: `from tests.fakes.discord_server import fake_discord`
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def fake_discord(monkeypatch):  # type: ignore[no-redef]
        """A started FakeDiscord (heartbeat 200 ms) with discord.py URLs patched."""
        async with FakeDiscord(heartbeat_interval=200) as fake:
            patch_discord_urls(fake, monkeypatch)
            yield fake
except ImportError:  # pragma: no cover
    fake_discord = None  # type: ignore[assignment]
