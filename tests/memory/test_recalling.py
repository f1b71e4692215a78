"""Recall's jobs on the read connections (bot/memory/recalling.py, recall/steps.py `read_steps`): one
job for the keyword and the search step when the question's vector is ready, two when the
embedding is still under way, and the same memories either way."""
from __future__ import annotations

import pytest

from bot.memory.engine import Engine, read_threads
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

ME = Viewer(user_id=7, dm=True)
QUESTION = "where did the kayak trip go"

pytestmark = pytest.mark.usefixtures("backend")  # on both storage backends


async def _remember_some(engine) -> list[int]:
    texts = ("the kayak trip went down the river", "a kayak needs a paddle", "the trip to the lake was cold",
             "lunch was soup")
    return [await engine.remember(NewMemory(text, "personal", owner_id=7)) for text in texts]


async def _jobs_of(engine, **recall) -> tuple[int, list[int], str]:
    """Read jobs one recall ran, its memories and its vector status."""
    before = engine.read_jobs
    result = await engine.recall(QUESTION, ME, **recall)
    return engine.read_jobs - before, result.ids, result.vector_status


async def test_a_recall_with_its_vector_reads_in_one_job_and_finds_what_two_jobs_find(engine, fake_ollama):
    ids = await _remember_some(engine)
    vector = fake_ollama.embed_text(QUESTION)
    jobs, given, status = await _jobs_of(engine, query_vector=vector, touch=False)
    assert jobs == 1  # keyword step, search step and the memories, in one job
    assert status == "ok" and set(given) <= set(ids) and given
    jobs, touched, _ = await _jobs_of(engine, query_vector=vector)
    assert jobs == 1  # the touch (and the load after it) goes to the writer
    assert touched == given
    # the embedding slower than the keyword step: the search step waits for it in a job of its own
    fake_ollama.mode, fake_ollama.delay = "slow", 0.3
    jobs, embedded, status = await _jobs_of(engine, touch=False)
    assert jobs == 2 and status == "ok"
    assert embedded == given


async def test_a_failed_embedding_still_recalls_by_keywords(engine, fake_ollama):
    await _remember_some(engine)
    fake_ollama.mode = "error"
    _, found, status = await _jobs_of(engine, touch=False)  # in one job or two, as the failure comes
    assert status == "unreachable" and found  # the keyword hits, without the vector path


async def test_a_vector_the_index_cannot_take_is_dropped_in_the_same_job(engine, fake_ollama):
    await _remember_some(engine)
    jobs, found, status = await _jobs_of(engine, query_vector=[0.5] * 12, touch=False)
    assert (jobs, status) == (1, "wrong-size") and found


async def test_read_threads_follow_the_backend_unless_set(make_settings):
    default = make_settings("")
    assert read_threads(default) == (3 if default.database_url else 2)  # PostgreSQL's reads wait on the server
    one = make_settings("", MUNINN_DB_READERS="1")
    assert read_threads(one) == 1
    async with Engine(one) as engine:
        assert engine._readers is None or engine._readers._max_workers == 1


async def test_a_sqlite_process_serving_some_of_the_shards_reads_on_one_thread(make_settings):
    some = make_settings("", MUNINN_SHARD_COUNT="4", MUNINN_SHARD_IDS="1,2")
    # PostgreSQL's reads wait on the server: its default stays, shards or not
    assert read_threads(some) == (3 if some.database_url else 1)
    assert read_threads(make_settings("", MUNINN_SHARD_COUNT="2", MUNINN_SHARD_IDS="0,1")) == read_threads(
        make_settings(""))  # every shard in this process: as one process
    assert read_threads(make_settings("", MUNINN_SHARD_COUNT="2")) == read_threads(make_settings(""))
    assert read_threads(make_settings("", MUNINN_SHARD_COUNT="4", MUNINN_SHARD_IDS="3",
                                      MUNINN_DB_READERS="2")) == 2  # a setting wins
    async with Engine(some) as engine:
        assert engine._readers is None or engine._readers._max_workers == read_threads(some)
