"""Secrets never printed: a password planted in every URL setting (OLLAMA_URL, MUNINN_CHAT_URL and
MUNINN_EMBED_URL, with a host that is down and the fake Ollama or OpenAI-compatible server;
MUNINN_DATABASE_URL, the embedded PostgreSQL accepts it), in the API keys (MUNINN_LLM_API_KEY,
MUNINN_EMBED_API_KEY, also when a server quotes a refused key back) and a token in DISCORD_TOKEN
must appear in no log record, no error line, no `muninn doctor` and no `--json` output, on both
backends: the engine and the pipeline with the LLM servers up and down, the command line
in-process, a bad setting, a database that is down, and the bot itself on the fake gateway."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
import textwrap
import time
import traceback
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from bot import redact
from bot.cli.doctor import run_doctor
from bot.cli.main import main
from bot.conversation.outlets import Sent
from bot.conversation.pipeline import Incoming, Pipeline
from bot.lifecycle.extractor import Extractor
from bot.llm.errors import OllamaError
from bot.llm.ollama import OllamaClient, OllamaHosts
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.settings import SETTINGS, SettingsError, load_settings
from tests.fakes.ollama import FakeOllamaThread
from tests.fakes.openai import FakeOpenAI
from tests.postgres_server import free_port

PASSWORD = "Pl4ntedPassw0rdXyzzy"          # in every URL setting
TOKEN = "Pl4ntedT0kenNotShapedLikeDiscords"  # DISCORD_TOKEN: not a real token's shape, so only our redaction hides it
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("backend")  # the tests that open a database run on both backends


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch):
    """Each test starts with no remembered secret: what it sees is what its own paths print."""
    monkeypatch.setattr(redact, "_remembered", set(), raising=False)


def assert_clean(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text, f"the planted password was printed:\n{text}"
        assert TOKEN not in text, f"the planted token was printed:\n{text}"


def with_password(url: str, user: str = "muninn") -> str:
    """`url` with the planted password (and its user, or `user`); "" (SQLite) stays ""."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    name = parts.username or user
    return urlunsplit(parts._replace(netloc=f"{name}:{PASSWORD}@{host}"))


def dead_url() -> str:
    return f"http://muninn:{PASSWORD}@127.0.0.1:{free_port()}"


def logged(caplog) -> str:
    """Every record caplog saw, with its traceback, as the handlers would print it."""
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


# -- the table, and the one function -----------------------------------------------------------

def test_every_url_or_secret_setting_is_marked():
    suspicious = ("URL", "TOKEN", "KEY", "PASSWORD", "SECRET", "DSN")
    for spec in SETTINGS.values():
        if spec.env.rsplit("_", 1)[-1] in suspicious or "url" in spec.parse.__name__:
            assert spec.kind in ("url", "secret"), f"{spec.env} looks secret: give it kind='url' or 'secret'"
    assert {k: s.kind for k, s in SETTINGS.items() if s.kind} == {
        "discord_token": "secret", "database_url": "url", "ollama_url": "url", "chat_url": "url",
        "embed_url": "url", "llm_api_key": "secret", "embed_api_key": "secret",
        "web_token": "secret"}


def test_shown_keeps_where_and_hides_who_and_how():
    assert redact.redact_url(f"http://muninn:{PASSWORD}@gpu1:11434/ollama,https://{TOKEN}@gpu2") == \
        "http://***@gpu1:11434/ollama,https://***@gpu2"
    assert redact.redact_url(f"postgresql://muninn:{PASSWORD}@db:5432/muninn?sslmode=require&password={PASSWORD}") \
        == "postgresql://***@db:5432/muninn?sslmode=require&password=***"
    assert redact.redact_url("http://localhost:11434") == "http://localhost:11434"
    settings = load_settings({"OLLAMA_URL": dead_url(), "DISCORD_TOKEN": TOKEN, "MUNINN_DB_PATH": "x.db",
                              "MUNINN_DATABASE_URL": f"postgresql://muninn:{PASSWORD}@db/muninn",
                              "MUNINN_CHAT_URL": dead_url(), "MUNINN_EMBED_URL": dead_url(),
                              "MUNINN_LLM_API_KEY": PASSWORD, "MUNINN_EMBED_API_KEY": TOKEN})
    assert settings.shown("discord_token") == "***" and settings.shown("chat_model") == "llama3.2"
    assert settings.shown("llm_api_key") == settings.shown("embed_api_key") == "***"
    assert settings.shown("database_url") == "postgresql://***@db/muninn"
    assert_clean(*(settings.shown(key) for key in SETTINGS))
    assert {PASSWORD, TOKEN} <= settings.secrets()
    assert load_settings({"MUNINN_DB_PATH": "x.db"}).shown("discord_token") == ""  # "no token" still shows


def test_the_log_filter_removes_the_configured_secrets_wherever_they_appear(capsys):
    settings = load_settings({"OLLAMA_URL": "http://muninn:p%40ss-" + PASSWORD + "@gpu1:11434",
                              "DISCORD_TOKEN": TOKEN, "MUNINN_DB_PATH": "x.db"})
    redact.remember(settings.secrets())
    logger = logging.getLogger("test.secrets")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    redact.install(logger)
    try:
        logger.debug("Authorization: Bot %s", TOKEN)
        logger.info("decoded p@ss-%s and raw %s", PASSWORD, settings.ollama_url)
        logger.warning("another URL: postgresql://someone:%s@db/x?password=%s", "Other1pw", "Other2pw")
        try:
            raise RuntimeError(f"failed with {TOKEN} and p@ss-{PASSWORD}")
        except RuntimeError:
            logger.exception("a failure")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert_clean(err)
    assert "Other1pw" not in err and "Other2pw" not in err and "http://***@gpu1:11434" in err
    assert "RuntimeError: failed with *** and ***" in err and "Bot ***" in err


# -- the engine, the pipeline and the Ollama client --------------------------------------------

class Outlet:
    """Where the pipeline posts: kept, so the test can grep what a person would read."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    @asynccontextmanager
    async def typing(self):
        yield

    async def send(self, text: str) -> list[Sent]:
        self.texts.append(text)
        return [Sent(len(self.texts), time.time())]


def said(text: str, n: int) -> Incoming:
    return Incoming(channel_id=50, guild_id=900, author_id=7, author_name="Alice", content=text,
                    created_at=time.time(), message_id=10**17 + n, dm=False)


async def test_engine_and_pipeline_with_ollama_down_and_up_never_log_the_password(
        make_settings, fake_ollama, backend, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    live = with_password(fake_ollama.url)
    settings = make_settings(f"{dead_url()},{live}", MUNINN_DATABASE_URL=with_password(backend, "postgres"),
                             DISCORD_TOKEN=TOKEN, OLLAMA_CHAT_TIMEOUT="2")
    outlet, errors = Outlet(), []
    viewer = Viewer(user_id=7, channel_id=50, guild_id=900)
    async with Engine(settings) as engine:
        extractor = Extractor(engine, batch_delay=0.05)
        pipeline = Pipeline(engine, extractor)
        for n, text in enumerate(["hello there", "what is new?"]):   # one host down, the other answers
            await pipeline.respond(said(text, n), outlet)
        await engine.recall("new", viewer, touch=False)
        assert fake_ollama.chat_requests(), "the fake Ollama (with the password in its URL) answered"
        await fake_ollama.go_down()                                    # every host down
        await pipeline.respond(said("anyone there?", 3), outlet)
        await engine.recall("anyone", viewer, touch=False)
        try:
            await engine.reindex()
        except OllamaError as exc:
            errors.append(str(exc))
        await asyncio.sleep(0.3)                                       # extraction fails in the background
        await fake_ollama.come_up()
        await pipeline.respond(said("back again?", 4), outlet)
        await extractor.close()
    assert any(record.levelno >= logging.WARNING for record in caplog.records), "the failures were logged"
    out = capsys.readouterr()
    assert_clean(logged(caplog), out.out, out.err, *outlet.texts, *errors)


@pytest.mark.parametrize("mode", ["dead", "down", "error", "slow"])
async def test_every_ollama_error_names_the_host_without_its_password(fake_ollama, caplog, mode):
    caplog.set_level(logging.DEBUG)
    url = dead_url() if mode == "dead" else with_password(fake_ollama.url)
    if mode == "down":
        await fake_ollama.go_down()
    else:
        fake_ollama.mode = "up" if mode == "dead" else mode
    fake_ollama.delay = 1.0
    errors: list[str] = []
    hi = [{"role": "user", "content": "hi"}]
    for client in (OllamaClient(url, embed_timeout=0.3, chat_timeout=0.3, cooldown=5),
                   OllamaHosts([url, dead_url()], embed_timeout=0.3, chat_timeout=0.3, cooldown=5)):
        async with client:
            calls = (client.embed(["x"]), client.chat(hi), client.chat(hi),   # the second one: cooling down
                     client.model_names(), _drain(client.chat_stream(hi)))
            for call in calls:
                try:
                    await call
                except OllamaError as exc:
                    errors.append(str(exc))
            if isinstance(client, OllamaHosts):
                errors += [str(v) for v in (await client.models_per_host()).items()]
    assert errors and any("***@127.0.0.1" in error for error in errors), errors
    assert_clean(logged(caplog), *errors)


@pytest.mark.parametrize("secret_in", ["key", "url"])
async def test_an_openai_compatible_server_never_shows_its_key_or_password(
        make_settings, fake_ollama, backend, caplog, capsys, secret_in):
    """Chat on the OpenAI-compatible stand-in (the key, or a password in its URL: one Authorization per
    request), embeddings on Ollama with a password in its URL; up, down, and with the key refused."""
    caplog.set_level(logging.DEBUG)
    outlet, errors, reports = Outlet(), [], []
    async with FakeOpenAI(api_key=PASSWORD if secret_in == "key" else "") as server:
        chat_url = server.base_url if secret_in == "key" else with_password(server.base_url)
        settings = make_settings(with_password(fake_ollama.url), MUNINN_CHAT_KIND="openai",
                                 MUNINN_CHAT_URL=f"{chat_url},http://127.0.0.1:{free_port()}",
                                 MUNINN_LLM_API_KEY=PASSWORD if secret_in == "key" else "",
                                 MUNINN_EMBED_API_KEY=PASSWORD, MUNINN_DATABASE_URL=with_password(backend, "postgres"),
                                 DISCORD_TOKEN=TOKEN, OLLAMA_CHAT_TIMEOUT="2")
        viewer = Viewer(user_id=7, channel_id=50, guild_id=900)
        async with Engine(settings) as engine:
            extractor = Extractor(engine, batch_delay=0.05)
            pipeline = Pipeline(engine, extractor)
            await pipeline.respond(said("hello there", 0), outlet)
            assert server.chat_requests() and fake_ollama.embed_requests(), "both servers answered"
            reports.append(json.dumps([check.to_dict() for check in await run_doctor(settings)]))
            server.api_key = "a key Muninn does not have"                   # refused, and quoted back
            await pipeline.respond(said("still there?", 1), outlet)
            reports.append(json.dumps([check.to_dict() for check in await run_doctor(settings)]))
            server.api_key = PASSWORD if secret_in == "key" else ""
            await server.go_down()
            await fake_ollama.go_down()
            await pipeline.respond(said("anyone there?", 2), outlet)
            await engine.recall("anyone", viewer, touch=False)
            reports.append(json.dumps([check.to_dict() for check in await run_doctor(settings)]))
            try:
                await engine.reindex()
            except OllamaError as exc:
                errors.append(str(exc))
            await server.come_up()
            await fake_ollama.come_up()
            await pipeline.respond(said("back again?", 3), outlet)
            await extractor.close()
    assert "***@127.0.0.1" in reports[0] and "refused" not in reports[0] and "key" in reports[1], reports
    out = capsys.readouterr()
    assert_clean(logged(caplog), out.out, out.err, *outlet.texts, *errors, *reports)


def test_an_api_key_and_a_password_in_the_same_servers_url_are_one_line(tmp_path):
    with pytest.raises(SettingsError, match="keep only one of them") as caught:
        load_settings({"MUNINN_DB_PATH": str(tmp_path / "x.db"), "MUNINN_CHAT_KIND": "openai",
                       "MUNINN_CHAT_URL": with_password("http://vllm:8000/v1"), "MUNINN_LLM_API_KEY": PASSWORD})
    assert_clean(str(caught.value))


async def _drain(stream) -> None:
    async for _ in stream:
        pass


async def test_doctor_shows_ollama_without_its_password(fake_ollama, make_settings, backend):
    live = with_password(fake_ollama.url)
    for url in (live, f"{live},{dead_url()}", dead_url()):
        settings = make_settings(url, MUNINN_DATABASE_URL=with_password(backend, "postgres"), DISCORD_TOKEN=TOKEN)
        checks = await run_doctor(settings)
        report = json.dumps([check.to_dict() for check in checks])
        assert "***@127.0.0.1" in report, report
        assert_clean(report)


# -- the command line --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ollama():
    with FakeOllamaThread() as fake:
        yield fake


@pytest.fixture
def planted(tmp_path, monkeypatch, database_env, ollama):
    """A clean environment with the password in every URL setting and the token set."""
    ollama.reset()
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_", "DISCORD_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DATABASE_URL", with_password(database_env, "postgres"))
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "cli.db"))
    monkeypatch.setenv("OLLAMA_URL", f"{with_password(ollama.url)},{dead_url()}")
    monkeypatch.setenv("DISCORD_TOKEN", TOKEN)
    monkeypatch.setenv("MUNINN_EMBED_URL", with_password(ollama.url))   # embeddings apart: a second client
    monkeypatch.setenv("MUNINN_LLM_API_KEY", PASSWORD)                 # set, never sent to Ollama-kind servers
    monkeypatch.setenv("MUNINN_EMBED_API_KEY", PASSWORD)
    monkeypatch.setenv("OLLAMA_COOLDOWN", "0")
    monkeypatch.setenv("OLLAMA_EMBED_TIMEOUT", "1")
    monkeypatch.setenv("OLLAMA_CHAT_TIMEOUT", "2")
    return tmp_path


def run_all(commands, capsys, caplog) -> str:
    """Run each `muninn` command in-process; everything it printed and logged, as one text."""
    said = []
    for command in commands:
        try:
            main([str(part) for part in command])
        except Exception as exc:  # with -v a failure is raised: Python prints its traceback, chain included
            said.append("".join(traceback.format_exception(exc)))
        out = capsys.readouterr()
        said += [out.out, out.err]
    return "\n".join(said) + logged(caplog)


def test_no_command_prints_a_password_ollama_up_or_down(planted, ollama, capsys, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    lines = planted / "memories.jsonl"
    lines.write_text(json.dumps({"text": "the GPU server has 4x RTX 3090", "scope": "global"}) + "\n")
    commands = [["doctor"], ["doctor", "--json"], ["-v", "stats", "--json"], ["stats"],
                ["remember", "Oz prefers dark mode", "--scope", "global", "--json"], ["import", lines, "--json"],
                ["-v", "recall", "dark mode", "--user", 1, "--dm", "--json"], ["-v", "reindex", "--json"],
                ["maintain", "--json"], ["maintain", "--archived", "--json"]]
    text = run_all(commands, capsys, caplog)
    assert '"ok": true' in text and "***@127.0.0.1" in text, text   # it ran, and named the hosts
    ollama.mode = "down"
    text += run_all(commands, capsys, caplog)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello?\n"))
    text += run_all([["-v", "chat", "--log-file", planted / "chat.log"]], capsys, caplog)
    text += (planted / "chat.log").read_text()
    assert "can't think right now" in text and "cannot reach Ollama at http://***@127.0.0.1" in text
    assert_clean(text)


def test_bad_settings_and_a_database_that_is_down_print_no_password(tmp_path, monkeypatch, capsys, caplog):
    pytest.importorskip("psycopg")
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_", "DISCORD_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "bad.db"))
    monkeypatch.setenv("DISCORD_TOKEN", TOKEN)
    down = f"postgresql://muninn:{PASSWORD}@127.0.0.1:{free_port()}/muninn"
    cases = [("OLLAMA_URL", f"ftp://muninn:{PASSWORD}@gpu1"),                      # not http(s)
             ("OLLAMA_URL", f"http://muninn:{PASSWORD}@gpu1,,http://gpu2"),        # an empty entry
             ("OLLAMA_URL", f"http://muninn:{PASSWORD}@gpu1 http://gpu2"),         # a space: not a usable URL
             ("MUNINN_DATABASE_URL", down),                                         # the server is down
             ("MUNINN_DATABASE_URL", f"postgresql://muninn:{PASSWORD}%zz@127.0.0.1:{free_port()}/muninn"),
             ("MUNINN_DATABASE_URL", f"postgresql://muninn:{PASSWORD}@127.0.0.1:notaport/muninn")]
    text = ""
    for name, value in cases:
        monkeypatch.setenv("OLLAMA_URL", "")
        monkeypatch.delenv("MUNINN_DATABASE_URL", raising=False)
        monkeypatch.setenv(name, value)
        text += run_all([["stats"], ["-v", "stats", "--json"], ["doctor", "--json"], ["doctor"]], capsys, caplog)
        text += run_all([["-v", "recall", "x", "--user", 1, "--dm", "--json"]], capsys, caplog)
    monkeypatch.delenv("MUNINN_DATABASE_URL")
    text += run_all([["migrate", "--to", down], ["migrate", "--to", down, "--json"]], capsys, caplog)
    assert "setting error: OLLAMA_URL='ftp://***@gpu1'" in text and "cannot connect to PostgreSQL" in text, text
    assert "not a usable PostgreSQL URL" in text or "invalid percent-encoded" in text, text
    assert_clean(text)


# -- the bot on the fake gateway ---------------------------------------------------------------

LAUNCHER = textwrap.dedent("""
    import sys
    import discord.gateway, discord.http, yarl
    discord.http.Route.BASE = sys.argv[1]
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(sys.argv[2])
    from cogs.launch import main
    sys.exit(main(sys.argv[3:]))
""")


async def test_the_running_bot_logs_no_secret_even_at_debug(discord_world, fake_ollama, make_settings, tmp_path):
    fake, alice, _ = discord_world
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    database_url = with_password(make_settings().database_url, "postgres")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISCORD_TOKEN": TOKEN,
           "OLLAMA_URL": f"{with_password(fake_ollama.url)},{dead_url()}", "MUNINN_DATABASE_URL": database_url,
           "MUNINN_DB_PATH": str(tmp_path / "bot.db"), "MUNINN_MAINTENANCE_HOURS": "0",
           "MUNINN_STREAM_REPLIES": "false", "OLLAMA_COOLDOWN": "0", "MUNINN_LLM_API_KEY": PASSWORD,
           "MUNINN_EMBED_API_KEY": PASSWORD}
    fake_ollama.chat_replies.append("Hello Alice.")

    async def muninn(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(launcher), fake.rest_url, fake.gateway_url, *args, cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            if args[-1] == "run" and not fake.rejected_tokens:
                await fake.wait_until_ready(timeout=30)
                dm = fake.dm_channel(alice)
                await fake.send_message(dm["id"], alice, "hi Muninn, are you there?")
                await fake.wait_for_sent_message(dm["id"], timeout=15)
                await fake_ollama.go_down()
                await fake.send_message(dm["id"], alice, "and now?")
                await fake.wait_for(lambda: len([m for m in fake.sent_messages if m["channel_id"] == dm["id"]]) >= 2,
                                    timeout=15)
                await fake_ollama.come_up()
                proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 40)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return proc.returncode or 0, out.decode() + err.decode()

    code, text = await muninn("-v", "run")
    assert code == 0 and "Ollama at http://***@127.0.0.1" in text, text[-3000:]
    fake.rejected_tokens.add(TOKEN)
    code, rejected = await muninn("-v", "run")
    assert code != 0, rejected[-3000:]
    assert_clean(text, rejected)
