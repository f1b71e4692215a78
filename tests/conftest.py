"""Shared fixtures: real engine on a temporary database, a fake Ollama on 127.0.0.1."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from bot.memory.engine import Engine
from bot.settings import load_settings
from tests.fakes.discord_server import FakeDiscord, patch_discord_urls
from tests.fakes.ollama import FakeOllama
from tests.fakes.servers import SETUPS, llm_servers
from tests.helpers import Script
from tests.postgres_fixtures import postgres_server, postgres_test_database, postgres_url  # noqa: F401  (fixtures)

BACKENDS = ("sqlite", "postgresql")
# Fixtures that open a database on the backend under test: an engine's settings, or the
# environment of the `muninn` command line (MUNINN_DATABASE_URL) for in-process CLI runs.
STORAGE_FIXTURES = ("make_settings", "database_env")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "sqlite_only(reason): the test is about SQLite itself (its file, WAL, "
                                       "vec0, FTS5, the vector cache): it runs on SQLite only, for that reason")


def pytest_generate_tests(metafunc):
    """Both storage backends for each test that takes `backend` as an argument, and for each
    test of a module marked `pytest.mark.usefixtures("backend")` that opens a database (uses
    `make_settings`, which `engine` and `fts_engine` do, or `database_env`); the module's other
    tests, pure logic, run once. `@pytest.mark.sqlite_only("why")` or an explicit
    `@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)` keeps a test on SQLite."""
    if "backend" not in metafunc.fixturenames:
        return
    if any("backend" in str(marker.args[0]) for marker in metafunc.definition.iter_markers("parametrize")):
        return
    only = metafunc.definition.get_closest_marker("sqlite_only")
    if only is not None:
        assert only.args and str(only.args[0]).strip(), "sqlite_only needs its reason"
        return  # `backend` defaults to SQLite
    own_arguments = inspect.signature(metafunc.function).parameters
    if "backend" in own_arguments or any(name in metafunc.fixturenames for name in STORAGE_FIXTURES):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture(autouse=True)
def _no_project_env_file(monkeypatch):
    """Muninn finds its checkout's `.env` from any folder: tests never read the developer's own."""
    monkeypatch.setattr("bot.settings.PROJECT_ROOT", Path(__file__).resolve().parent)


@pytest.fixture
def backend(request) -> str:
    """The storage backend under test, as MUNINN_DATABASE_URL ("" = SQLite): engines from
    `make_settings` / `engine` / `fts_engine` use it, on a fresh PostgreSQL database each time."""
    return request.getfixturevalue("postgres_url") if getattr(request, "param", "sqlite") == "postgresql" else ""


@pytest.fixture
def make_settings(tmp_path, request):
    """Settings from an explicit environment (the real one and .env are ignored); on the
    `backend` under test when the test asks for one."""
    database_url = request.getfixturevalue("backend") if "backend" in request.fixturenames else ""

    def make(ollama_url: str = "", **env):
        base = {"MUNINN_DB_PATH": str(tmp_path / "muninn.db"), "MUNINN_DATABASE_URL": database_url, "OLLAMA_URL": ollama_url,
                "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "1.0", "OLLAMA_RETRIES": "0",
                "MUNINN_MAINTENANCE_HOURS": "0"}
        base.update({k: str(v) for k, v in env.items()})
        return load_settings(base)
    return make


@pytest.fixture
def database_env(monkeypatch, request) -> str:
    """MUNINN_DATABASE_URL in the process environment for the backend under test ("" = SQLite at
    MUNINN_DB_PATH), for tests that run the `muninn` command line; returns it."""
    database_url = request.getfixturevalue("backend") if "backend" in request.fixturenames else ""
    monkeypatch.setenv("MUNINN_DATABASE_URL", database_url)
    return database_url


@pytest.fixture
async def fake_ollama():
    async with FakeOllama() as fake:
        yield fake


@pytest.fixture(params=SETUPS)
async def llm(request):
    """The LLM servers of each setup in turn (tests/fakes/servers.py): Ollama, an OpenAI-compatible
    server, chat on the OpenAI one with embeddings on Ollama. Only modules that ask for it run so."""
    async with llm_servers(request.param) as servers:
        yield servers


@pytest.fixture
async def engine(fake_ollama, make_settings):
    """An engine whose Ollama is the fake (up, 768-dim nomic-embed-text)."""
    async with Engine(make_settings(fake_ollama.url)) as eng:
        yield eng


@pytest.fixture
async def fts_engine(make_settings):
    """An engine with no OLLAMA_URL: keyword recall only."""
    async with Engine(make_settings("")) as eng:
        yield eng


@pytest.fixture
async def script(fake_ollama):
    """Scripted LLM answers per kind of request (extract / update / merge) on the fake Ollama."""
    return Script(fake_ollama)


@pytest.fixture
async def discord_world(monkeypatch):
    """A fake Discord (gateway + REST on 127.0.0.1) with Alice in the guild Asgard."""
    async with FakeDiscord(heartbeat_interval=200) as fake:
        patch_discord_urls(fake, monkeypatch)
        alice = fake.add_user("alice", global_name="Alice")
        guild = fake.add_guild("Asgard", members=[alice])
        yield fake, alice, guild
        assert fake.unhandled_requests == [], fake.unhandled_requests


@pytest.fixture
def pair(tmp_path):
    """Two connections to one file: one searching through a vector cache, one plain (another process)."""
    from bot.memory.sqlite import db
    from bot.memory.sqlite import vec0 as vectors
    from bot.memory.vectors.cache import VectorCache
    cached, plain = db.connect(tmp_path / "v.db"), db.connect(tmp_path / "v.db")
    vectors.attach_cache(cached, VectorCache(64 << 20))
    yield cached, plain
    cached.close()
    plain.close()
