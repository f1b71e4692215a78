"""The benchmarks' synthetic communities (`Shape`, `SkewShape`): their memories, viewers and queries, built into a database.

Worlds are deterministic (seeded) and built once through the product's own writes; the
benchmarks keep them in bench/results/ (git-ignored, made on demand).
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench.speed: one core, like one SQLite thread
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sql import queries, store
from bot.memory.sqlite import vec0 as vectors
from bot.memory.storage import storage_of
from bot.settings import load_settings

RESULTS = Path(__file__).resolve().parent / "results"  # git-ignored: worlds, caches, JSON; made on demand
DIM = 768
EMBED_MODEL = "hash-embed"
DAY = 86400.0
NOW = 1_767_225_600.0  # 2026-01-01: a fixed clock, so every run ranks alike
FILLER = ("the a is was to and of in my i we it for on with that at this so just".split())


@dataclass
class Shape:
    """Who owns what: many users with a few personal memories each, a few hundred busy
    channels (Zipf-like activity), a small share of global memories."""
    size: int
    guilds: int = 20
    channels: int = 300
    personal_share: float = 0.60
    global_share: float = 0.01
    dm_share: float = 0.10          # personal memories learned in a DM
    personal_per_user: float = 4.0  # mean
    vocab: int = 20000


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "p95": round(percentile(values, 95), 4),
            "mean": round(statistics.fmean(values), 4), "n": len(values)}


class World:
    """The synthetic population and its deterministic memories, texts and vectors."""

    def __init__(self, shape: Shape, seed: int = 7):
        self.shape = shape
        rng = np.random.default_rng(seed)
        self.rng = rng
        syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "gu", "ber", "tin", "mar", "zel", "qu"]
        words = set()
        while len(words) < shape.vocab:
            words.add("".join(rng.choice(syll, size=rng.integers(2, 5))))
        self.words = np.array(sorted(words))
        ranks = np.arange(1, shape.vocab + 1, dtype=np.float64)
        self.word_p = (1 / ranks ** 1.07) / (1 / ranks ** 1.07).sum()
        self.channel_guild = rng.integers(0, shape.guilds, size=shape.channels)
        activity = 1 / np.arange(1, shape.channels + 1) ** 0.8
        self.channel_p = activity / activity.sum()
        n_personal = int(shape.size * shape.personal_share)
        self.users = max(1, int(n_personal / shape.personal_per_user))
        self.user_guild = rng.integers(0, shape.guilds, size=self.users)

    def sentence(self, lo: int = 5, hi: int = 14) -> str:
        n = int(self.rng.integers(lo, hi))
        content = self.rng.choice(self.words, size=n, p=self.word_p)
        filler = self.rng.choice(FILLER, size=n // 2)
        return " ".join(list(content) + list(filler))

    def memories(self):
        """Yield (NewMemory, vector) in a deterministic order."""
        s, rng = self.shape, self.rng
        for _ in range(s.size):
            roll = rng.random()
            created = NOW - float(rng.random()) * 365 * DAY
            importance = float(np.round(rng.beta(2, 3), 2))
            if roll < s.global_share:
                mem = records.NewMemory(self.sentence(), "global", owner_id=1, importance=importance,
                                      created_at=created)
            elif roll < s.global_share + s.personal_share:
                user = int(rng.integers(0, self.users))
                guild = None if rng.random() < s.dm_share else int(self.user_guild[user]) + 1
                mem = records.NewMemory(self.sentence(), "personal", owner_id=user + 1000, guild_id=guild,
                                      importance=importance, created_at=created)
            else:
                ch = int(rng.choice(s.channels, p=self.channel_p))
                mem = records.NewMemory(self.sentence(), "room", owner_id=int(rng.integers(0, self.users)) + 1000,
                                      channel_id=ch + 100_000, guild_id=int(self.channel_guild[ch]) + 1,
                                      importance=importance, created_at=created)
            vec = rng.standard_normal(DIM, dtype=np.float32)
            yield mem, vec / np.linalg.norm(vec)

    def viewer(self) -> Viewer:
        """A random user speaking in a channel of their guild, busy channels more often."""
        user = int(self.rng.integers(0, self.users))
        guild = int(self.user_guild[user])
        chans = np.flatnonzero(self.channel_guild == guild)
        if len(chans) == 0:
            return Viewer(user + 1000, dm=True)
        p = self.channel_p[chans] / self.channel_p[chans].sum()
        ch = int(self.rng.choice(chans, p=p))
        return Viewer(user + 1000, channel_id=ch + 100_000, guild_id=guild + 1)

    def query(self) -> tuple[str, np.ndarray]:
        vec = self.rng.standard_normal(DIM, dtype=np.float32)
        return self.sentence(6, 10), vec / np.linalg.norm(vec)


@dataclass
class SkewShape:
    """The shape a real community has: 2,000 active users by Zipf, 200 channels in 10
    guilds, one busy channel holding 30 % of all memories, 2 % global, half personal (some
    learned in DMs, some in private channels)."""
    size: int
    users: int = 2000
    guilds: int = 10
    channels: int = 200
    busy_share: float = 0.30
    global_share: float = 0.02
    personal_share: float = 0.50
    dm_share: float = 0.20          # of personal memories: learned in a DM
    private_share: float = 0.10     # of personal memories: learned in a private channel
    user_zipf: float = 1.0
    vocab: int = 20000


VIEWER_CLASSES = ("typical", "busy", "dm_heavy", "global_only")


class SkewWorld(World):
    """Memories and viewers of a SkewShape. Channel 0 is the busy one (in guild 0)."""

    def __init__(self, shape: SkewShape, seed: int = 7):
        self.shape = shape  # type: ignore[assignment]
        rng = np.random.default_rng(seed)
        self.rng = rng
        syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "gu", "ber", "tin", "mar", "zel", "qu"]
        words: set[str] = set()
        while len(words) < shape.vocab:
            words.add("".join(rng.choice(syll, size=rng.integers(2, 5))))
        self.words = np.array(sorted(words))
        ranks = np.arange(1, shape.vocab + 1, dtype=np.float64)
        self.word_p = (1 / ranks ** 1.07) / (1 / ranks ** 1.07).sum()
        self.channel_guild = np.concatenate([[0], rng.integers(0, shape.guilds, size=shape.channels - 1)])
        activity = 1 / np.arange(1, shape.channels) ** 0.8       # the other channels, Zipf-like
        self.other_channel_p = activity / activity.sum()
        user_activity = 1 / np.arange(1, shape.users + 1) ** shape.user_zipf
        self.user_p = user_activity / user_activity.sum()
        self.users = shape.users
        self.user_guild = rng.integers(0, shape.guilds, size=shape.users)
        self.user_guild[:50] = 0  # the busiest people talk in the busy channel's guild

    def _channel_of_guild(self, guild: int) -> int:
        chans = np.flatnonzero(self.channel_guild == guild)
        return int(self.rng.choice(chans)) if len(chans) else 0

    def memories(self):
        s, rng = self.shape, self.rng
        for _ in range(s.size):
            roll = rng.random()
            created = NOW - float(rng.random()) * 365 * DAY
            importance = float(np.round(rng.beta(2, 3), 2))
            user = int(rng.choice(s.users, p=self.user_p))
            if roll < s.global_share:
                mem = records.NewMemory(self.sentence(), "global", owner_id=1, importance=importance, created_at=created)
            elif roll < s.global_share + s.busy_share:
                mem = records.NewMemory(self.sentence(), "room", owner_id=user + 1000, channel_id=100_000, guild_id=1,
                                      importance=importance, created_at=created)
            elif roll < s.global_share + s.busy_share + s.personal_share:
                origin = rng.random()
                guild = int(self.user_guild[user])
                if origin < s.dm_share:
                    mem = records.NewMemory(self.sentence(), "personal", owner_id=user + 1000, importance=importance,
                                          created_at=created)
                elif origin < s.dm_share + s.private_share:
                    mem = records.NewMemory(self.sentence(), "personal", owner_id=user + 1000, guild_id=guild + 1,
                                          channel_id=self._channel_of_guild(guild) + 100_000, private=True,
                                          importance=importance, created_at=created)
                else:
                    mem = records.NewMemory(self.sentence(), "personal", owner_id=user + 1000, guild_id=guild + 1,
                                          importance=importance, created_at=created)
            else:
                ch = 1 + int(rng.choice(s.channels - 1, p=self.other_channel_p))
                mem = records.NewMemory(self.sentence(), "room", owner_id=user + 1000, channel_id=ch + 100_000,
                                      guild_id=int(self.channel_guild[ch]) + 1, importance=importance,
                                      created_at=created)
            vec = rng.standard_normal(DIM, dtype=np.float32)
            yield mem, vec / np.linalg.norm(vec)

    def viewer_of(self, kind: str) -> Viewer:
        """typical: a user drawn uniformly among the active ones, in a channel of their guild other
        than the busy one (busy channels more often); busy: a user drawn by activity, in the busy
        channel; dm_heavy: one of the 5 most active users, in a DM (all their personal memories);
        global_only: someone with no memories at all, in a DM."""
        rng = self.rng
        if kind == "typical":
            user = int(rng.integers(0, self.users))
            guild = int(self.user_guild[user])
            chans = [c for c in np.flatnonzero(self.channel_guild == guild) if c != 0]
            if not chans:
                return Viewer(user + 1000, dm=True)
            p = self.other_channel_p[np.asarray(chans) - 1]
            ch = int(rng.choice(chans, p=p / p.sum()))
            return Viewer(user + 1000, channel_id=ch + 100_000, guild_id=guild + 1)
        if kind == "busy":
            user = int(rng.choice(self.users, p=self.user_p))
            return Viewer(user + 1000, channel_id=100_000, guild_id=1)
        if kind == "dm_heavy":
            return Viewer(int(rng.integers(0, 5)) + 1000, dm=True)
        if kind == "global_only":
            return Viewer(10_000_000 + int(rng.integers(0, 1000)), dm=True)
        raise ValueError(kind)

    def viewer(self) -> Viewer:
        return self.viewer_of(VIEWER_CLASSES[int(self.rng.integers(0, 3))])


def make_world(shape, seed: int = 7) -> World:
    return SkewWorld(shape, seed) if isinstance(shape, SkewShape) else World(shape, seed)


# Settings a benchmark takes from the environment (beside every MUNINN_VECTOR_*), to compare budgets,
# paths and thread counts: `MUNINN_DB_READERS=1 .venv/bin/python -m bench.concurrency ...`
PASSED_THROUGH = ("MUNINN_DB_READERS", "MUNINN_SHARD_COUNT", "MUNINN_SHARD_IDS")


def bench_settings(path: Path, ollama_url: str = "", **env: str):
    """The product's settings for a benchmark's engine on `path` (no Ollama unless given); the
    environment's MUNINN_VECTOR_* and PASSED_THROUGH apply, `env` over them."""
    chosen = {key: value for key, value in os.environ.items()
              if key.startswith("MUNINN_VECTOR_") or key in PASSED_THROUGH}
    return load_settings({"MUNINN_DB_PATH": str(path), "OLLAMA_URL": ollama_url, "OLLAMA_EMBED_MODEL": EMBED_MODEL,
                          "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30", **chosen, **env})


async def build(path: Path, shape: Shape | SkewShape, chunk_size: int = vectors.DEFAULT_CHUNK_SIZE,
                batch: int = 2000) -> dict:
    """Bulk-build through the product's store.insert_many (memory + FTS + vec0 rows)."""
    world = make_world(shape)
    started = time.perf_counter()
    async with Engine(bench_settings(path)) as engine:
        await engine.write(lambda conn: vectors.create_index(conn, EMBED_MODEL, DIM, chunk_size=chunk_size))
        info = await engine.write(vectors.index_info)
        pending: list = []

        def flush(conn, rows):
            store.insert_many(conn, [m for m, _ in rows], base_stability_days=engine.settings.base_stability_days,
                              vector_info=info, vectors_=[v.tolist() for _, v in rows], now=NOW)
        for item in world.memories():
            pending.append(item)
            if len(pending) >= batch:
                await engine.write(flush, pending)
                pending = []
        if pending:
            await engine.write(flush, pending)
        await engine.write(lambda conn: queries.set_meta(conn, "bench_built", "1"))
        await engine.write(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    return {"build_s": round(time.perf_counter() - started, 2)}


def query_of(world: "World") -> tuple[str, list[float]]:
    """world.query() with the vector as the list recall takes."""
    text, qvec = world.query()
    return text, qvec.tolist()


def busy_channel_message(chatter: "SkewWorld", dim: int) -> tuple[str, list[float]]:
    """What said_in_busy_channel stores: a sentence and a unit vector (made ahead of a timed run,
    so that making them does not count as the product's work)."""
    vec = chatter.rng.standard_normal(dim, dtype=np.float32)
    return chatter.sentence(), (vec / np.linalg.norm(vec)).tolist()


def said_in_busy_channel(conn: Any, info: vectors.IndexInfo, chatter: "SkewWorld",
                         said: tuple[str, list[float]] | None = None) -> None:
    """The busy channel stores a new memory (text and vector), through the backend of `conn`: the
    class recalls of every bench run after one, as in a live community (the vector cache has
    changes to apply, the keyword index and the readers' pages change). `said`: made ahead
    (busy_channel_message); else made here."""
    text, vec = said if said is not None else busy_channel_message(chatter, info.dim)
    storage_of(conn).insert(conn, [records.NewMemory(text, "room", owner_id=1000, channel_id=100_000,
                                                   guild_id=1)], base_stability_days=7.0, model=info.model,
                            vecs=[vec], now=None)


def world_path(args, size: int) -> Path:
    return Path(args.workdir) / f"skew-{size}-{args.label}.db"
