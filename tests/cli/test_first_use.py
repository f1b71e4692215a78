"""The first hour: a fresh clone's `muninn doctor`, the project's `.env` found from any folder,
and one line saying which database a command created and which `.env` it read."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bot import settings as settings_module
from bot.cli.main import main
from bot.settings import SettingsError, find_env_file, load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_env(monkeypatch):
    """An environment without any of Muninn's settings, and a private copy of it: loading a `.env`
    writes into os.environ, which must not leak into other tests."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MUNINN_", "OLLAMA_", "DISCORD_"))}
    monkeypatch.setattr(os, "environ", clean)
    return clean


def project(folder: Path, **settings: str) -> Path:
    """A Muninn folder: a `.env` as the quick start makes it (copied from .env.example), plus `settings`."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / ".env.example").read_text()
    text += "".join(f"{name}={value}\n" for name, value in settings.items())
    (folder / ".env").write_text(text)
    return folder


def test_a_command_run_below_the_project_finds_its_env_and_database(tmp_path, monkeypatch, bare_env, capsys):
    home = project(tmp_path / "muninn", OLLAMA_URL="")
    deeper = home / "notes" / "today"
    deeper.mkdir(parents=True)
    monkeypatch.chdir(deeper)
    assert main(["remember", "the kettle is blue", "--scope", "global"]) == 0
    err = capsys.readouterr().err
    database = home / "data" / "muninn.db"
    assert err == f"muninn: created a new database {database} (settings from {home / '.env'})\n"
    assert stat.S_IMODE(database.parent.stat().st_mode) == 0o700 and not (deeper / "data").exists()
    monkeypatch.chdir(tmp_path)  # beside the project, not in it: the checkout's own .env is found
    monkeypatch.setattr(settings_module, "PROJECT_ROOT", home)
    assert main(["recall", "kettle", "--user", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["memories"][0]["text"] == "the kettle is blue"


def test_another_program_s_env_above_is_skipped(tmp_path, monkeypatch, bare_env):
    (tmp_path / ".env").write_text("SECRET_KEY=not-ours\nDEBUG=1\n")
    home = project(tmp_path / "elsewhere" / "muninn")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(settings_module, "PROJECT_ROOT", home)
    assert find_env_file() == home / ".env"
    assert load_settings().db_path == home / "data" / "muninn.db"


def test_a_relative_path_from_the_environment_is_the_working_directory_s(tmp_path, monkeypatch, bare_env):
    home = project(tmp_path / "muninn", MUNINN_DB_PATH="from-env-file.db")
    monkeypatch.chdir(home)
    assert load_settings().db_path == home / "from-env-file.db"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(settings_module, "PROJECT_ROOT", home)
    bare_env["MUNINN_DB_PATH"] = "typed.db"
    loaded = load_settings()
    assert loaded.db_path == elsewhere / "typed.db" and loaded.env_file == home / ".env"


def test_no_env_anywhere_and_nothing_set_is_refused_in_one_line(tmp_path, monkeypatch, bare_env, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert ".env.example" in str(refused.value) and str(tmp_path) in str(refused.value)
    assert main(["stats"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "copy .env.example to .env" in err and not (tmp_path / "data").exists()


def test_settings_from_the_environment_alone_say_so_when_a_database_is_made(tmp_path, monkeypatch, bare_env, capsys):
    monkeypatch.chdir(tmp_path)
    bare_env.update(MUNINN_DB_PATH="m.db", OLLAMA_URL="")
    assert main(["stats"]) == 0 and main(["stats"]) == 0
    err = capsys.readouterr().err
    assert err == f"muninn: created a new database {tmp_path / 'm.db'} (no .env: settings from the environment)\n"


@pytest.mark.sqlite_only("the database folder's file mode (PostgreSQL: the server's roles)")
def test_doctor_passes_its_permission_check_on_a_fresh_clone(tmp_path):
    """What the next commit ships (git's index), laid out as a clone lays it out, set up as the
    quick start says; doctor is run from another folder with the clone's own code."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = [name for name in listed.decode().split("\0") if name]
    assert not [name for name in tracked if name.startswith("data/")], "data/ must be made private at first use"
    clone = tmp_path / "clone"
    for name in tracked:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, clone / name)
    shutil.copyfile(clone / ".env.example", clone / ".env")
    (clone / ".env").chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MUNINN_", "OLLAMA_", "DISCORD_"))}
    env.update(OLLAMA_URL="", PYTHONPATH=str(clone))  # Ollama's check fails here; the others must not
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "cogs", "doctor", "--json"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120)
    checks = {check["check"]: check for check in json.loads(proc.stdout)["checks"]}
    assert checks["permissions"]["ok"], checks["permissions"]
    assert all(check["ok"] for name, check in checks.items() if name != "ollama"), checks
    assert stat.S_IMODE((clone / "data").stat().st_mode) == 0o700
    assert proc.stderr == f"muninn: created a new database {clone / 'data' / 'muninn.db'} (settings from {clone / '.env'})\n"
