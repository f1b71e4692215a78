"""`muninn backup` (bot/cli/backup.py, bot/memory/sqlite/backup.py): taken while four processes
write, restored as docs/deployment.md says, checked by `muninn doctor`, nothing committed lost."""
from __future__ import annotations

import asyncio
import json
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from bot.cli.doctor import database_checks
from bot.cli.main import main
from bot.memory.engine import Engine
from bot.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 4


def settings_for(path: Path, ollama_url: str = ""):
    return load_settings({"MUNINN_DB_PATH": str(path), "OLLAMA_URL": ollama_url}, dotenv=False)


def logged(logs: list[Path]) -> set[int]:
    return {int(line) for log in logs if log.exists() for line in log.read_text().split("\n")[:-1]}


def check_backup_file(backup: Path) -> None:
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert not Path(f"{backup}-wal").exists()  # one self-contained file
    assert [p.name for p in backup.parent.iterdir()] == [backup.name]  # no partial file left


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MUNINN_DATABASE_URL", "")
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "live" / "muninn.db"))
    monkeypatch.setenv("OLLAMA_URL", "")
    return tmp_path


async def test_a_backup_under_four_writers_restores_with_no_committed_memory_lost(env, capsys, fake_ollama):
    live = env / "live" / "muninn.db"
    assert await asyncio.to_thread(main, ["stats"]) == 0  # the database exists, migrated, before the writers start
    stop = env / "stop"
    logs = [env / f"writer{n}.log" for n in range(WRITERS)]
    writers = [await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.cli.backup_writer", str(live), str(log),
                                                    str(stop), str(n), fake_ollama.url, cwd=ROOT)
               for n, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 60
        while len(logged(logs)) < 20 * WRITERS or not all(log.exists() for log in logs):
            assert time.monotonic() < deadline, "the writers did not get going"
            assert all(w.returncode is None for w in writers), "a writer died"
            await asyncio.sleep(0.05)
        committed_before = logged(logs)
        capsys.readouterr()
        (env / "backups").mkdir()
        assert await asyncio.to_thread(main, ["backup", str(env / "backups"), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        await asyncio.sleep(0.3)
        assert all(w.returncode is None for w in writers)  # still writing after the backup
    finally:
        stop.touch()
        for w in writers:
            await asyncio.wait_for(w.wait(), 30)
    assert [w.returncode for w in writers] == [0] * WRITERS
    committed = logged(logs)
    assert len(committed) > len(committed_before)  # writes went on during and after the backup

    backup = Path(report["path"])
    assert backup.parent == env / "backups" and backup.name.startswith("muninn-") and report["integrity"] == "ok"
    check_backup_file(backup)

    # Restore as docs/deployment.md says: stop the bot, put the file in place, start.
    restored = env / "restored" / "muninn.db"
    restored.parent.mkdir(mode=0o700)
    shutil.copy2(backup, restored)
    checks = database_checks(settings_for(restored, fake_ollama.url))
    assert all(c.ok for c in checks), [c.to_dict() for c in checks if not c.ok]

    async def ids_in(path: Path) -> set[int]:
        async with Engine(settings_for(path), warm=False) as engine:
            count = (await engine.stats())["memories"]
            found = set(await engine.get_many(sorted(committed)))
        assert count == len(found)  # nothing in the copy that no writer committed
        return found
    found = await ids_in(restored)
    assert committed_before <= found   # 0 lost committed memories
    assert len(found) == report["memories"] == report["active"]
    assert await asyncio.to_thread(main, ["--db", str(restored), "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memories"] == len(found)


def test_a_file_that_exists_is_never_overwritten(env, capsys):
    assert main(["stats"]) == 0
    target = env / "taken.db"
    target.write_bytes(b"precious")
    capsys.readouterr()
    assert main(["backup", str(target)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("muninn backup: ") and "exists" in err and len(err.splitlines()) == 1
    assert target.read_bytes() == b"precious"


def test_no_database_is_one_line(env, capsys):
    assert main(["--db", str(env / "none.db"), "backup", str(env / "b.db")]) == 1
    err = capsys.readouterr().err.strip()
    assert "no database at" in err and len(err.splitlines()) == 1


def test_on_postgresql_it_prints_the_pg_dump_command_without_the_password(env, monkeypatch, capsys):
    monkeypatch.setenv("MUNINN_DATABASE_URL", "postgresql://muninn:s3cr%40t@db.example:5433/muninn?sslmode=require")
    assert main(["backup", "/srv/backups/muninn.dump"]) == 2
    out = capsys.readouterr()
    assert "s3cr" not in out.out + out.err
    assert ("PGPASSWORD=*** pg_dump --format=custom --file=/srv/backups/muninn.dump "
            "'postgresql://muninn@db.example:5433/muninn?sslmode=require'") in out.err
    monkeypatch.setenv("MUNINN_DATABASE_URL", "postgresql://muninn@db.example/muninn?password=hunter2")
    assert main(["backup", "x.dump"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "PGPASSWORD=*** pg_dump --format=custom --file=x.dump postgresql://muninn@db.example/muninn" in err
