"""The stats page's view of the running bot: read from its real /metrics, absent or unreachable said in one line."""
from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot.memory.engine import Engine
from bot.memory.recall.retrieval import RecallResult, VectorStatus
from bot.metrics import Metrics
from bot.web import live
from bot.web.app import create_app
from tests.web.conftest import TOKEN, log_in, seed

pytestmark = pytest.mark.usefixtures("backend")


def bot_metrics() -> Metrics:
    """The bot's own metrics after a few recalls and answers."""
    metrics = Metrics()
    for ms, status in ((3.0, VectorStatus.OK), (40.0, VectorStatus.OK), (900.0, VectorStatus.UNREACHABLE)):
        metrics.recalled(RecallResult("q", "hybrid" if status == VectorStatus.OK else "fts", status, timings_ms={"total": ms}))
    metrics.answered(True, 2.5)
    metrics.answered(False, 61.0)
    metrics.skipped("rate")
    return metrics


def test_the_bots_text_format_parses_into_what_the_page_draws():
    found = live.parse("http://127.0.0.1:9/metrics", bot_metrics().render().decode())
    assert sum(count for _, count in found.recall_buckets) == 3
    assert found.recalls == {"hybrid / ok": 2, "fts / unreachable": 1}
    assert found.answered == {"ok": 1, "fallback": 1} and found.skipped["rate"] == 1


async def stats_page(make_settings, fake_ollama, **env) -> str:
    async with Engine(make_settings(fake_ollama.url, **env)) as engine:
        await seed(engine)
        client = TestClient(TestServer(create_app(engine, token=TOKEN)))
        await client.start_server()
        try:
            await log_in(client)
            return await (await client.get("/stats")).text()
        finally:
            await client.close()


async def test_the_stats_page_shows_the_running_bots_recalls(make_settings, fake_ollama):
    metrics = bot_metrics()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")
    app = web.Application()
    app.router.add_get("/metrics", serve)
    bot = TestServer(app, host="127.0.0.1")
    await bot.start_server()
    try:
        text = await stats_page(make_settings, fake_ollama, MUNINN_METRICS_PORT=str(bot.port))
    finally:
        await bot.close()
    assert "recall latency" in text and "hybrid / ok" in text and "fts / unreachable" in text


async def test_without_metrics_or_with_the_bot_down_the_page_says_so(make_settings, fake_ollama, unused_tcp_port):
    assert "set MUNINN_METRICS_PORT" in await stats_page(make_settings, fake_ollama)
    text = await stats_page(make_settings, fake_ollama, MUNINN_METRICS_PORT=str(unused_tcp_port))
    assert "did not answer" in text and "is the bot running?" in text
    assert "Memories by kind" in text, "the rest of the page is there"
