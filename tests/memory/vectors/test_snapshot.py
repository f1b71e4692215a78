"""One copy of the vectors per machine (bot/memory/vectors/shared.py, snapshot.py): engines on one
database map one snapshot file and answer exactly like a private cache, follow each other's
writes, never serve a damaged, foreign or stale file, and a forget with its scrub leaves no copy of
the vector in any snapshot file. On both backends."""
from __future__ import annotations

import asyncio
import logging
import mmap
from pathlib import Path

import numpy as np
import pytest

from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.vectors import shared, snapshot
from bot.memory.vectors.arrays import KeyVectors, quantise

pytestmark = pytest.mark.usefixtures("backend")

DIM = 64  # a row's bytes are then unlikely to occur anywhere else in the file
KEYS = {"g": ("global", {}), "r:1": ("room", {"channel_id": 1}), "r:2": ("room", {"channel_id": 2}),
        "p:7:dm": ("personal", {}), "p:8:dm": ("personal", {})}


def unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def memory(key: str, i: int) -> NewMemory:
    scope, where = KEYS[key]
    owner = int(key.split(":")[1]) if key.startswith("p:") else 7
    made = NewMemory(f"memory {i}", scope, owner_id=owner, **where)
    assert made.vis_key == key
    return made


async def fill(settings, rng: np.random.Generator, count: int) -> list[int]:
    async with Engine(settings, warm=False) as engine:
        # the migration's instance token (the PostgreSQL fixture empties `meta` between tests)
        token = f"test-{rng.integers(1 << 40)}"
        await engine.write(lambda conn: conn.execute(
            "INSERT INTO meta(key, value) VALUES('instance', ?) ON CONFLICT(key) DO NOTHING", (token,)))
        keys = list(KEYS)
        memories = [memory(keys[i % len(keys)] if i % 3 else "r:1", i) for i in range(count)]
        return await insert(engine, memories, [unit(rng) for _ in memories])


async def insert(engine: Engine, memories: list[NewMemory], vecs: list[list[float]]) -> list[int]:
    return await engine.write(lambda conn: engine.storage.insert(
        conn, memories, base_stability_days=7, model="m", vecs=vecs, now=1000.0))


async def search(engine: Engine, q: list[float], keys: list[str], k: int = 10) -> list[tuple[int, float]]:
    def job(conn):
        return engine.vector_cache.knn(conn, engine.storage.index_info(conn), q, keys, k)
    return await engine.read(job)


async def cosines(engine: Engine, q: list[float], ids: list[int]) -> dict[int, float]:
    def job(conn):
        return engine.vector_cache.cosines(conn, engine.storage.index_info(conn), q, ids)
    return await engine.read(job)


def is_mapped(entry: KeyVectors) -> bool:
    base = entry.matrix
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


def folder_of(engine: Engine) -> Path:
    folder = engine.vector_cache._folder
    assert folder is not None
    return folder


async def started(settings) -> Engine:
    engine = await Engine(settings).start()
    await engine.warmed()
    return engine


async def until(check, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not reached in time")


@pytest.fixture
def settings(make_settings):
    return make_settings("", OLLAMA_EMBED_MODEL="m")


async def test_engines_share_one_snapshot_and_answer_like_a_private_cache(settings, make_settings):
    rng = np.random.default_rng(1)
    ids = await fill(settings, rng, 300)
    first = await started(settings)
    second = await started(settings)
    private = await started(make_settings("", OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_SNAPSHOT="off"))
    try:
        assert [generation for generation, _ in snapshot.generations(folder_of(first))] == [1]
        assert folder_of(second) == folder_of(first)
        for engine in (first, second):
            entries = list(engine.vector_cache._keys.values())
            assert set(engine.vector_cache.cached_keys()) == set(KEYS) and all(is_mapped(e) for e in entries)
        assert private.vector_cache._folder is None
        assert not any(is_mapped(e) for e in private.vector_cache._keys.values())
        for _ in range(30):
            q = unit(rng)
            keys = list(rng.choice(list(KEYS), size=int(rng.integers(1, 4)), replace=False))
            expected = await search(private, q, keys)
            assert len(expected) == 10
            for engine in (first, second):
                got = await search(engine, q, keys)
                assert [m for m, _ in got] == [m for m, _ in expected]
                assert np.allclose([d for _, d in got], [d for _, d in expected], atol=1e-6)
        # a write in one is seen by the others' next search; so is a forget
        q = unit(rng)
        new_id = (await insert(private, [memory("g", 1000)], [q]))[0]
        for engine in (first, second, private):
            assert (await search(engine, q, ["g"], 3))[0][0] == new_id
        some = [*ids[:40], new_id, 10 ** 9]  # the file's rows, a row appended since, an id never stored
        expected_cosines = await cosines(private, q, some)
        assert len(expected_cosines) == 41
        for engine in (first, second):
            assert await cosines(engine, q, some) == expected_cosines
        await second.forget([new_id])
        for engine in (first, second, private):
            assert new_id not in [m for m, _ in await search(engine, q, ["g"], 3)]
        assert set(ids) <= {m for m, _ in await search(first, q, list(KEYS), 400)}
    finally:
        for engine in (first, second, private):
            await engine.close()


async def test_a_viewer_gets_only_its_keys_rows_through_the_snapshot(settings):
    rng = np.random.default_rng(2)
    ids = await fill(settings, rng, 200)
    first = await started(settings)
    second = await started(settings)
    try:
        key_of = dict(await second.read(lambda conn: [tuple(row) for row in conn.execute(
            "SELECT id, vis_key FROM memories")]))
        assert len(key_of) == len(ids)
        for key in KEYS:
            for _ in range(5):
                found = await search(second, unit(rng), [key], 50)
                assert found and {key_of[m] for m, _ in found} == {key}
    finally:
        await first.close()
        await second.close()


def row_bytes(engine: Engine, memory_id: int) -> bytes:
    cache = engine.vector_cache
    entry = cache._keys[cache._key_of[memory_id]]
    return entry.matrix[entry.row_of[memory_id]].tobytes()


async def test_forget_and_scrub_leave_no_copy_of_the_vector_in_the_snapshot_file(settings):
    rng = np.random.default_rng(3)
    ids = await fill(settings, rng, 120)
    first = await started(settings)
    second = await started(settings)  # maps the file too: the scrub writes under its map
    try:
        gone = ids[4]
        row = row_bytes(first, gone)
        folder = folder_of(first)
        [(_, path)] = snapshot.generations(folder)
        assert row in path.read_bytes()
        kept = row_bytes(first, ids[5])
        await first.forget([gone], scrub=True)
        data = b"".join(p.read_bytes() for _, p in snapshot.generations(folder))
        assert row not in data and kept in data
        assert gone not in [m for m, _ in await search(second, unit(rng), list(KEYS), 200)]
        with snapshot.folder_lock(folder, exclusive=False):  # the scrubbed file still checks out
            assert snapshot.open_newest(folder, {"dim": DIM}) is not None
    finally:
        await first.close()
        await second.close()


def damage_truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 100)


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF
    path.write_bytes(bytes(data))


def damage_foreign(path: Path) -> None:
    """A snapshot written by another database (another instance token), put in this one's place."""
    with snapshot.folder_lock(path.parent, exclusive=False):
        mapped = snapshot.open_generation(path, 1, {})
    header = dict(mapped.header)
    parts = [(key, ids[:n], created[:n], matrix[:n], None if scales is None else scales[:n], None, n + 4)
             for key, (ids, created, matrix, scales, _, n) in mapped.keys()]
    del mapped
    about = {name: header[name] for name in ("epoch", "model", "dim", "form", "mark")} | {"instance": "another"}
    path.unlink()
    snapshot.write(path.parent, 1, about, parts)


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_foreign])
async def test_a_damaged_or_foreign_snapshot_is_rebuilt_never_served(settings, make_settings, damage, caplog):
    rng = np.random.default_rng(4)
    await fill(settings, rng, 150)
    first = await started(settings)
    folder = folder_of(first)
    await first.close()
    damage(folder / "vectors-1.snap")
    private = await started(make_settings("", OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_SNAPSHOT="off"))
    with caplog.at_level(logging.WARNING, logger="bot.memory.vectors"):
        again = await started(settings)
    try:
        warnings = [r for r in caplog.records if "vector snapshot" in r.getMessage()]
        assert len(warnings) == 1 and "rebuilt" in warnings[0].getMessage()
        assert [generation for generation, _ in snapshot.generations(folder)] == [1]  # written anew
        assert all(is_mapped(e) for e in again.vector_cache._keys.values())
        for _ in range(10):
            q = unit(rng)
            assert await search(again, q, list(KEYS)) == await search(private, q, list(KEYS))
    finally:
        await again.close()
        await private.close()


async def test_a_stale_snapshot_is_rebuilt(settings, make_settings, caplog, monkeypatch):
    rng = np.random.default_rng(5)
    await fill(settings, rng, 60)
    first = await started(settings)
    folder = folder_of(first)
    await first.close()
    writer = await Engine(make_settings("", OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_SNAPSHOT="off"), warm=False).start()
    added = await insert(writer, [memory("g", 500 + i) for i in range(3)], [unit(rng) for _ in range(3)])
    await writer.close()
    # the change log no longer reaches back to the snapshot's mark
    real_poll = type(first.vector_cache.source).poll

    def pruned(self, conn, mark):
        epoch, changed, now, complete, states = real_poll(self, conn, mark)
        return epoch, changed, now, complete and not (mark is not None and changed and added[0] in changed), states
    with caplog.at_level(logging.WARNING, logger="bot.memory.vectors"):
        monkeypatch.setattr(type(first.vector_cache.source), "poll", pruned)
        again = await Engine(settings).start()
        await again.warmed()
        monkeypatch.undo()
    try:
        warnings = [r for r in caplog.records if "vector snapshot" in r.getMessage()]
        assert len(warnings) == 1 and "stale" in warnings[0].getMessage()
        assert [generation for generation, _ in snapshot.generations(folder)] == [1]  # a new one in its place
        q = unit(rng)
        assert added[0] in [m for m, _ in await search(again, q, ["g"], 200)]
    finally:
        await again.close()


async def test_past_the_bound_one_engine_writes_a_new_generation_and_the_others_map_it(settings, monkeypatch):
    monkeypatch.setattr(shared, "DELTA_MIN", 5)
    monkeypatch.setattr(shared, "DELTA_SHARE", 0.0)
    rng = np.random.default_rng(6)
    await fill(settings, rng, 80)
    first = await started(settings)
    second = await started(settings)
    try:
        folder = folder_of(first)
        q = unit(rng)
        new_ids = await insert(first, [memory("r:2", 900 + i) for i in range(8)], [q] * 8)
        await search(first, q, ["r:2"])  # applies the changes: past the bound, the loader writes generation 2

        async def written() -> bool:  # (a search tries again while the loader was busy)
            await search(first, q, ["r:2"])
            return any(generation >= 2 for generation, _ in snapshot.generations(folder))
        await until(written)
        monkeypatch.setattr(shared, "DELTA_MIN", 10 ** 9)  # no further generation: let both settle on the newest

        async def renewed() -> bool:  # both map the newest generation, and the older ones, mapped by nobody, went
            await search(first, q, ["r:2"])
            await search(second, q, ["r:2"])
            newest = [generation for generation, _ in snapshot.generations(folder)]
            return (len(newest) == 1 and newest[0] >= 2 and first.vector_cache._mapped_generation == newest[0]
                    and second.vector_cache._mapped_generation == newest[0])
        try:
            await until(renewed)
        except AssertionError as late:  # what each engine maps, what is on disk, who is busy
            raise AssertionError((snapshot.generations(folder), first.vector_cache._mapped_generation,
                                  second.vector_cache._mapped_generation, first.vector_cache._sharing,
                                  second.vector_cache._sharing, first.vector_cache._delta, second.vector_cache._delta)) from late
        for engine in (first, second):
            assert set(new_ids) <= {m for m, _ in await search(engine, q, ["r:2"], 20)}
            assert all(is_mapped(e) for e in engine.vector_cache._keys.values())
    finally:
        await first.close()
        await second.close()


def test_quantised_rows_survive_the_file(tmp_path):
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((10, DIM)).astype(np.float32)
    matrix, scales = quantise(rows)
    ids = np.arange(10, 20, dtype=np.int64)
    folder = snapshot.make_folder(tmp_path / "s" / "int8")
    about = {"instance": "x", "epoch": "1", "model": "m", "dim": DIM, "form": "int8", "mark": 3}
    snapshot.write(folder, 1, about, [("g", ids, np.arange(10.0), matrix, scales, None, 14)])
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / "vectors-1.snap").stat().st_mode & 0o777) == "0o600"
    mapped = snapshot.open_generation(folder / "vectors-1.snap", 1, {k: v for k, v in about.items() if k != "mark"})
    [(key, arrays)] = list(mapped.keys())
    entry = KeyVectors.mapped(*arrays)
    assert key == "g" and entry.n == 10 and len(entry.ids) == 14 and mapped.mark == 3
    assert np.array_equal(entry.matrix[:10], matrix) and np.array_equal(entry.scales[:10], scales)
    entry.add(99, 5.0, rows[0])  # a free row of the private map: the file stays as written
    entry.discard(10)
    assert entry.row_of[99] == 10 and entry.ids[0] == -1
    again = snapshot.open_generation(folder / "vectors-1.snap", 1, {})
    assert list(next(again.keys())[1][0][:11]) == list(range(10, 20)) + [-1]


async def test_a_memory_moved_after_the_snapshot_never_shows_under_its_old_key(settings):
    rng = np.random.default_rng(8)
    ids = await fill(settings, rng, 90)
    first = await started(settings)
    try:
        key_of = dict(await first.read(lambda conn: [tuple(row) for row in conn.execute(
            "SELECT id, vis_key FROM memories")]))
        moved = next(m for m in ids if key_of[m] == "r:1")
        await first.write(lambda conn: conn.execute(
            "UPDATE memories SET scope = 'personal', owner_id = 7, vis_key = 'p:7:dm' WHERE id = ?", (moved,)))
        later = await started(settings)  # maps the file written before the move
        try:
            assert later.vector_cache._mapped_generation == 1
            for engine in (first, later):  # every row of r:1 (k is more than it holds), none of them the moved one
                found = [m for m, _ in await search(engine, unit(rng), ["r:1"], 100)]
                assert len(found) == sum(1 for m in ids if key_of[m] == "r:1") - 1 and moved not in found
        finally:
            await later.close()
    finally:
        await first.close()


async def test_with_the_setting_off_no_snapshot_is_written_or_read(make_settings, tmp_path):
    off = make_settings("", OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_SNAPSHOT="off")
    rng = np.random.default_rng(9)
    ids = await fill(off, rng, 40)
    engine = await started(off)
    try:
        assert engine.vector_cache.snapshot_place is None and engine.vector_cache._mapped_generation == 0
        assert set(engine.vector_cache.cached_keys()) == set(KEYS)
        assert not any(is_mapped(e) for e in engine.vector_cache._keys.values())
        await engine.forget([ids[0]], scrub=True)
        assert ids[0] not in [m for m, _ in await search(engine, unit(rng), list(KEYS), 100)]
    finally:
        await engine.close()
    assert not [p for p in tmp_path.rglob("*") if "vectors" in p.name]


def read(path: Path) -> bytes:
    return path.read_bytes()


def put_back(path: Path, older: bytes) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(older)


@pytest.mark.sqlite_only("a SQLite file put back from a copy (PostgreSQL is restored by its own tools)")
async def test_a_database_restored_from_an_older_copy_does_not_serve_the_newer_snapshot(settings, make_settings,
                                                                                      caplog):
    rng = np.random.default_rng(10)
    await fill(settings, rng, 60)
    path = Path(settings.db_path)
    older = read(path)  # the backup (no -wal: the filling engine closed and checkpointed)
    async with Engine(settings, warm=False) as writer:
        later = await insert(writer, [memory("g", 700 + i) for i in range(5)], [unit(rng) for _ in range(5)])
    first = await started(settings)  # writes the snapshot with the five newer memories
    assert first.vector_cache._mapped_generation == 1
    await first.close()
    put_back(path, older)
    private = await started(make_settings("", OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_SNAPSHOT="off"))
    with caplog.at_level(logging.WARNING, logger="bot.memory.vectors"):
        again = await started(settings)
    try:
        assert [r for r in caplog.records if "stale" in r.getMessage()]
        for _ in range(10):
            q = unit(rng)
            got = await search(again, q, list(KEYS), 100)
            assert got == await search(private, q, list(KEYS), 100) and not set(later) & {m for m, _ in got}
        assert all(is_mapped(e) for e in again.vector_cache._keys.values())  # a new file, of this state
    finally:
        await again.close()
        await private.close()
