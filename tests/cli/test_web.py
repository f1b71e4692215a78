"""`muninn web`: the console as a command: where it listens, the token it prints (or keeps
quiet), read-only by default, bad input in one line, a clean stop."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from bot.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MUNINN_", "OLLAMA_", "DISCORD_"))}
    clean.update(MUNINN_DB_PATH=str(tmp_path / "m.db"), OLLAMA_URL="", **env)
    # Ctrl-C is what stops it: a test run started in the background (a shell's `&`) ignores SIGINT,
    # and a child would inherit that and never stop
    return subprocess.Popen([sys.executable, "-m", "cogs", "web", "--port", "0", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, env=clean, cwd=ROOT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def banner(proc: subprocess.Popen, last: str = "token") -> str:
    """What `muninn web` prints up to the line holding `last` (its token, or its address)."""
    assert proc.stderr is not None
    lines = [proc.stderr.readline()]
    while last not in lines[-1] and lines[-1] and len(lines) < 5:
        lines.append(proc.stderr.readline())
    return "".join(lines)


async def test_it_listens_on_loopback_prints_a_token_and_stops_on_ctrl_c(tmp_path):
    proc = start(tmp_path)
    try:
        text = banner(proc)
        address = re.search(r"at (http://127\.0\.0\.1:\d+/)", text)
        token = re.search(r"token \(new at each start; set MUNINN_WEB_TOKEN to keep one\): (\S+)", text)
        assert address and token and "read-only" in text, text
        async with aiohttp.ClientSession() as http:
            async with http.get(address.group(1), allow_redirects=False) as answer:
                assert answer.status == 303 and answer.headers["Location"].startswith("/login")
            async with http.get(address.group(1) + "login") as answer:
                assert "Log in" in await answer.text()
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    assert "Traceback" not in err, err


def test_a_configured_token_is_never_printed(tmp_path):
    secret = "a-configured-console-token-XYZ"
    proc = start(tmp_path, MUNINN_WEB_TOKEN=secret, MUNINN_WEB_CHANGES="true")
    try:
        line = banner(proc, "Ctrl-C")
        assert "changes allowed" in line and secret not in line
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    assert secret not in err


@pytest.mark.parametrize(("argv", "expected"), [
    (["web", "--port", "70000"], "not a port number"),
    (["web", "--port", "x"], "not a port number"),
    (["web", "--json"], "--json is not for this command"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "m.db"))
    monkeypatch.setenv("OLLAMA_URL", "")
    try:
        code = main(argv)
    except SystemExit as stopped:
        code = stopped.code
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1, err


def test_a_short_token_setting_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "m.db"))
    monkeypatch.setenv("MUNINN_WEB_TOKEN", "short")
    assert main(["web"]) == 2
    err = capsys.readouterr().err
    assert "MUNINN_WEB_TOKEN" in err and "16 characters" in err and "short" not in err.replace("16 characters", "")
