"""The command line run in-process: `cli(*args)` gives (exit code, stdout, stderr), in a clean
environment on the backend under test, with a fake Ollama of the module's own."""
from __future__ import annotations

import os

import pytest

from bot.cli.main import main
from tests.fakes.ollama import FakeOllamaThread


@pytest.fixture(scope="module")
def ollama():
    """A fake Ollama shared by a module's tests (reset before each)."""
    with FakeOllamaThread() as fake:
        yield fake


@pytest.fixture
def cli(tmp_path, monkeypatch, ollama, capsys, database_env):
    """Run `muninn ARGS...` in a clean environment; returns (exit code, stdout, stderr)."""
    ollama.reset()
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_", "DISCORD_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DATABASE_URL", database_env)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "cli.db"))
    monkeypatch.setenv("OLLAMA_URL", ollama.url)
    monkeypatch.setenv("OLLAMA_COOLDOWN", "0")
    monkeypatch.setenv("OLLAMA_EMBED_TIMEOUT", "1")

    def run(*args, load_discord=None):
        code = main([str(a) for a in args], load_discord=load_discord)
        out = capsys.readouterr()
        return code, out.out, out.err
    return run
