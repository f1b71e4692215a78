"""Foreign and damaged files, private permissions, stored values that must not break reading,
one-line errors instead of tracebacks, retried writes, and a full disk."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench import reliability
from bot.cli.main import main
from bot.llm.errors import OllamaError
from bot.memory import engine as engine_module
from bot.memory import errors as database_errors
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.errors import DatabaseBusy, DatabaseError
from bot.memory.scope import Viewer
from bot.memory.sql import repair, store
from bot.memory.sqlite import db, files
from bot.memory.sqlite.files import APPLICATION_ID

ROOT = Path(__file__).resolve().parents[2]
# Engine-level tests run on SQLite and PostgreSQL; those about SQLite's file say why they do not.
pytestmark = pytest.mark.usefixtures("backend")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def other_apps_file(path: Path, **pragmas: int) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (12.5)")
    for name, value in pragmas.items():
        conn.execute(f"PRAGMA {name} = {value}")
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "data" / "m.db"))
    monkeypatch.setenv("OLLAMA_URL", "")

    def run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


# -- whose file it is ------------------------------------------------------------------

@pytest.mark.sqlite_only("whose file it is: SQLite's header, application_id and WAL files")
@pytest.mark.parametrize("make, reason", [
    (lambda p: other_apps_file(p), "another program's SQLite database"),
    (lambda p: other_apps_file(p, application_id=0x1234), "belongs to another program"),
    (lambda p: p.write_bytes(b"just some text file\n" * 20), "not a SQLite database"),
    (lambda p: wal_mode(other_apps_file(p)), "another program's SQLite database"),
])
def test_a_file_that_is_not_muninns_is_refused_unchanged(cli, tmp_path, make, reason):
    path = tmp_path / "other.db"
    make(path)
    before = digest(path)
    code, out, err = cli("--db", path, "stats")
    assert code == 1 and reason in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert digest(path) == before
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()  # no litter, no WAL switch


def wal_mode(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    return path


@pytest.mark.sqlite_only("another program's tables in the same SQLite file")
def test_a_clashing_table_is_refused_unchanged(cli, tmp_path):
    path = tmp_path / "clash.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, note TEXT)")
    conn.commit()
    conn.close()
    before = digest(path)
    code, _, err = cli("--db", path, "stats")
    assert code == 1 and "another program" in err and digest(path) == before


@pytest.mark.sqlite_only("a SQLite file's user_version and a truncated file (PostgreSQL's newer schema: test_cli)")
def test_a_newer_schema_and_a_truncated_file_are_refused_unchanged(cli, tmp_path):
    code, _, _ = cli("remember", "a fact about otters", "--scope", "global")
    assert code == 0
    made = tmp_path / "data" / "m.db"
    newer = tmp_path / "newer.db"
    newer.write_bytes(made.read_bytes())
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = digest(newer)
    code, _, err = cli("--db", newer, "stats")
    assert code == 1 and "newer than this Muninn" in err and digest(newer) == before
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(made.read_bytes()[:5000])
    before = digest(truncated)
    code, _, err = cli("--db", truncated, "stats")
    assert code == 1 and "truncated" in err and "Traceback" not in err and digest(truncated) == before


@pytest.mark.sqlite_only("a SQLite file's header and size")
def test_a_file_mid_checkpoint_is_not_taken_for_truncated(tmp_path, monkeypatch):
    """Another process's checkpoint copies page 1 (the header, with the grown size) before the
    pages that grow the file: for that moment the file is shorter than its header says. Opening
    then waits for the copy to end instead of calling the database truncated; a file that stays
    short is still refused."""
    made = tmp_path / "m.db"
    conn = db.connect(made)
    conn.execute("CREATE TABLE filler (x BLOB); INSERT INTO filler VALUES (zeroblob(200000))")  # ~50 pages
    conn.close()
    whole = made.read_bytes()
    path = tmp_path / "mid.db"
    path.write_bytes(whole[:4096])
    Path(f"{path}-wal").write_bytes(b"")          # a WAL beside it: a checkpoint may be running
    monkeypatch.setattr(files, "CHECKPOINT_WAIT_S", 5.0)
    copy = threading.Timer(0.3, path.write_bytes, (whole,))
    copy.start()
    try:
        files.check_before_open(path)              # waited for the rest of the copy
    finally:
        copy.cancel()
    assert path.stat().st_size == len(whole)

    path.write_bytes(whole[:4096])                 # still short when the wait is over: truncated
    monkeypatch.setattr(files, "CHECKPOINT_WAIT_S", 0.2)
    with pytest.raises(DatabaseError, match="truncated"):
        files.check_before_open(path)


@pytest.mark.sqlite_only("SQLite's application_id header field")
def test_muninn_marks_its_files_and_still_opens_older_unmarked_ones(tmp_path):
    conn = db.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA application_id").fetchall()[0][0] == APPLICATION_ID
    conn.execute("PRAGMA application_id = 0")  # as made before the mark existed
    conn.close()
    conn = db.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA application_id").fetchall()[0][0] == APPLICATION_ID
    conn.close()


@pytest.mark.sqlite_only("scribbles over the SQLite file's pages")
def test_a_damaged_page_is_one_line_with_what_to_do(cli, tmp_path):
    cli("import", write_lines(tmp_path / "m.jsonl", 300))
    path = tmp_path / "data" / "m.db"
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(3 * page, len(data) - page, page):
        data[offset:offset + 64] = b"\xff" * 64  # scribble over every page header after the first three
    path.write_bytes(bytes(data))
    code, _, err = cli("recall", "otters", "--user", "1", "--dm")
    assert code == 1 and "damaged" in err and "Traceback" not in err


def write_lines(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"text": f"otter fact {i}", "scope": "global"}) + "\n" for i in range(n)))
    return path


# -- permissions ----------------------------------------------------------------------

@pytest.mark.sqlite_only("file modes of the SQLite file, WAL and folder (PostgreSQL: the server's roles)")
def test_new_database_files_and_folder_are_private(tmp_path):
    path = tmp_path / "fresh" / "m.db"
    old = os.umask(0o022)
    try:
        conn = db.connect(path)
        conn.execute("INSERT INTO meta(key, value) VALUES ('x', 'y')")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
        conn.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert modes == {"m.db": 0o600, "m.db-wal": 0o600, "m.db-shm": 0o600}


@pytest.mark.sqlite_only("file modes of the SQLite file (PostgreSQL: the server's roles)")
def test_doctor_warns_on_loose_modes_and_fix_tightens_them(cli, tmp_path):
    cli("remember", "a fact", "--scope", "global")
    path = tmp_path / "data" / "m.db"
    path.chmod(0o644)
    path.parent.chmod(0o755)
    code, out, _ = cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert not checks["permissions"]["ok"] and "644" in checks["permissions"]["detail"]
    assert ".env" in checks["permissions"]["fix"]
    cli("doctor", "--fix")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700



@pytest.mark.sqlite_only("file modes of the SQLite file (PostgreSQL: the server's roles)")
def test_a_fresh_clone_s_data_folder_becomes_private_with_its_first_database(cli, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)  # as git checks it out, whatever the umask
    (folder / ".gitkeep").touch()
    cli("remember", "a fact", "--scope", "global")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    code, out, _ = cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert checks["permissions"]["ok"], checks["permissions"]


@pytest.mark.sqlite_only("file modes of the SQLite file (PostgreSQL: the server's roles)")
def test_a_new_database_in_a_folder_holding_other_files_leaves_the_folder_alone(cli, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    (folder / "notes.txt").write_text("the operator's")
    cli("remember", "a fact", "--scope", "global")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755  # the operator's folder: doctor tells, --fix tightens

# -- stored values never break reading ---------------------------------------------------

async def test_poisoned_rows_still_recall_and_export_and_doctor_fixes_them(fts_engine):
    ids = [await fts_engine.remember(records.NewMemory(text=f"otters hold hands {i}", scope="personal", owner_id=5))
           for i in range(3)]

    postgres = fts_engine.storage.name == "postgresql"

    def poison(conn):
        conn.execute("UPDATE memories SET created_at = -1e11 WHERE id = ?", (ids[0],))
        conn.execute("UPDATE memories SET last_accessed = 1e300, updated_at = 1e300 WHERE id = ?", (ids[1],))
        conn.execute("UPDATE memories SET stability = 0 WHERE id = ?", (ids[2],))
        if not postgres:  # PostgreSQL's trigger on it refuses anything but a JSON list
            conn.execute("UPDATE memories SET source_message_ids = '5' WHERE id = ?", (ids[2],))
    await fts_engine.write(poison)
    viewer = Viewer(user_id=5, dm=True)
    result = await fts_engine.recall("otters hold hands", viewer, touch=False)
    assert sorted(r.memory.id for r in result.memories) == ids
    exported = [m.to_dict() for m in await fts_engine.write(store.memories_of, 5)]
    json.dumps(exported, ensure_ascii=False).encode()
    assert exported[0]["created_at"].endswith("?")  # clamped, and marked as such
    found = await fts_engine.write(repair.find_bad_rows)
    assert sorted({i for rows in found.values() for i in rows}) == ids
    await fts_engine.write(repair.fix_bad_rows)
    assert await fts_engine.write(repair.find_bad_rows) == {}
    result = await fts_engine.recall("otters hold hands", viewer)  # touching works on the repaired rows
    assert len(result.memories) == 3


# -- one line, not a traceback ---------------------------------------------------------------

def test_cli_bad_arguments_are_one_line_and_status_2(cli):
    for args in (["recall", "x", "--user", "1", "--limit", "2000"],
                 ["recall", "x", "--user", "99999999999999999999"],
                 ["recall", "x", "--user", "1", "--as-of", "2090-01-01"]):
        with pytest.raises(SystemExit) as exit_info:
            code, _, err = cli(*args)
            raise SystemExit(code)
        assert exit_info.value.code == 2, args
    code, out, _ = cli("recall", "x", "--user", "1", "--as-of", "2090-01-01", "--no-touch", "--json")
    assert code == 0 and json.loads(out)["memories"] == []


def test_invalid_bytes_on_the_command_line_are_one_line(tmp_path):
    env = reliability.cli_env(tmp_path / "m.db")
    env["PYTHONPATH"] = str(ROOT)
    remember = subprocess.run([sys.executable, "-m", "bot.cli.main", "remember", b"caf\xff", "--scope", "global"],
                              env=env, capture_output=True, cwd=ROOT)
    assert remember.returncode == 2 and b"invalid characters" in remember.stderr
    assert b"Traceback" not in remember.stderr
    recall = subprocess.run([sys.executable, "-m", "bot.cli.main", "recall", b"caf\xff", "--user", "1", "--json"],
                            env=env, capture_output=True, cwd=ROOT)
    assert recall.returncode == 0 and json.loads(recall.stdout)["memories"] == []


# -- writes are retried, and a write that still fails says why --------------------------------

@pytest.mark.sqlite_only("SQLite's whole-file write lock and busy timeout; PostgreSQL locks rows")
async def test_a_forget_waits_out_a_long_lock_and_one_that_never_ends_is_logged(make_settings, monkeypatch, caplog):
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(engine_module, "WRITE_RETRY_DELAYS_S", (0.2, 0.2, 0.2))
    settings = make_settings("")
    async with Engine(settings) as engine:
        memory_id = await engine.remember(records.NewMemory(text="a secret", scope="personal", owner_id=3))
        other = db.connect(settings.db_path)
        other.execute("BEGIN IMMEDIATE")
        threading.Timer(0.35, lambda: other.execute("COMMIT")).start()  # longer than one busy wait
        assert await engine.forget([memory_id]) == 1
        other.execute("BEGIN IMMEDIATE")  # and now it is never released
        with caplog.at_level(logging.DEBUG, logger="bot.memory"), pytest.raises(DatabaseBusy):
            await engine.remember(records.NewMemory(text="another", scope="personal", owner_id=3))
        other.execute("ROLLBACK")
        other.close()
    assert any("could not store 1 memories after 4 attempts" in r.getMessage() for r in caplog.records)
    # one retry policy, at one depth: each attempt waits one busy timeout on the database thread,
    # the waits between attempts happen off it (transactions' own re-waits are for other callers)
    assert not any("waiting again" in r.getMessage() for r in caplog.records)


# -- a full disk -------------------------------------------------------------------------------

@pytest.mark.sqlite_only("a SQLite file on a full tmpfs (a PostgreSQL server's disk is the operator's)")
@pytest.mark.skipif(reliability.can_mount() is not None, reason=f"no small tmpfs: {reliability.can_mount()}")
def test_disk_full_is_one_line_loses_nothing_committed_and_the_rerun_completes(tmp_path):
    rows = reliability.disk_full(tmp_path, lines=1500, size_kb=512)
    full, again = rows
    assert full.tracebacks == 0 and full.lost == 0 and "disk is full" in full.notes[0], full.row()
    assert (again.failed, again.lost, again.tracebacks) == (0, 0, 0), again.row()


def test_database_error_messages_are_single_lines():
    import apsw
    for error in (apsw.FullError("x"), apsw.CorruptError("x"), apsw.BusyError("x"), apsw.ReadOnlyError("x")):
        message = database_errors.explain(error)
        assert message and "\n" not in message
    assert database_errors.explain(ValueError("x")) is None
    assert isinstance(DatabaseBusy("x"), DatabaseError)


# -- the minor points ------------------------------------------------------------------------

async def test_a_first_embedding_wider_than_the_index_allows_still_stores_the_memory(fake_ollama, make_settings):
    fake_ollama.wrong_dim = 9000
    async with Engine(make_settings(fake_ollama.url)) as engine:
        memory_id = await engine.remember(records.NewMemory(text="otters are wide", scope="global"))
        memory = await engine.write(store.get, memory_id)
    assert memory.text == "otters are wide" and not memory.embedded


async def test_recall_says_partial_while_a_reindex_is_unfinished(fake_ollama, make_settings):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        await engine.remember_many([records.NewMemory(text=f"otter fact {i}", scope="global") for i in range(40)])
        viewer = Viewer(user_id=1, dm=True)
        assert (await engine.recall("otter", viewer, touch=False)).vector_status == "ok"
        calls = 0
        real_embed = fake_ollama.embed_text

        def embed_then_fail(text, dim=None):  # the re-index stops after its probe and first batch of 32
            nonlocal calls
            calls += 1
            if calls > 2:
                fake_ollama.mode = "down"
            return real_embed(text, dim)
        fake_ollama.embed_text = embed_then_fail
        with pytest.raises(OllamaError):
            await engine.reindex()
        fake_ollama.mode = "up"
        fake_ollama.embed_text = real_embed
        assert (await engine.recall("otter", viewer, touch=False)).vector_status == "partial"
        await engine.backfill()
        assert (await engine.recall("otter", viewer, touch=False)).vector_status == "ok"


def test_interaction_and_bot_tokens_never_reach_the_log(capsys):
    from bot import redact
    logger = logging.getLogger("test.redact")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    redact.install(logger)
    try:
        token = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OTpBQkNERUZHSElKS0xN"
        logger.debug("%s %s has returned %s", "POST",
                     f"https://discord.com/api/v10/interactions/123456789012345678/{token}/callback", 204)
        logger.debug("PATCH https://discord.com/api/v10/webhooks/42/%s/messages/@original", token)
        logger.debug("token MTA5ODc2NTQzMjEwOTg3NjU0Mw.GaBcDe.abcdefghijklmnopqrstuvwxyz0123456789")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert token not in err and "abcdefghijklmnopqrstuvwxyz0123456789" not in err
    assert err.count("<token>") == 3 and "/callback" in err


async def test_a_far_future_as_of_never_stamps_a_future_recall_time(fts_engine):
    """Validation refuses it at the boundary; the engine also never writes it (library callers)."""
    import time
    memory_id = await fts_engine.remember(records.NewMemory(text="otters sleep holding hands", scope="global"))
    await fts_engine.recall("otters", Viewer(user_id=1, dm=True), as_of=1e12, touch=True)
    memory = await fts_engine.write(store.get, memory_id)
    assert memory.access_count == 1 and memory.last_accessed <= time.time() + 86400


@pytest.mark.sqlite_only("SQLite stores bytes that are not UTF-8 in TEXT; PostgreSQL refuses them")
async def test_text_that_is_not_utf8_reads_with_replacement_and_doctor_repairs_it(fts_engine):
    memory_id = await fts_engine.remember(records.NewMemory(text="otters float", scope="global"))

    def scribble(conn):  # another program wrote bytes that are not UTF-8 into the TEXT column
        conn.execute("UPDATE memories SET text = CAST(X'6f7474657273ff20666c6f6174' AS TEXT) WHERE id = ?",
                     (memory_id,))
    await fts_engine.write(scribble)
    result = await fts_engine.recall("otters", Viewer(user_id=1, dm=True), touch=False)
    assert [r.memory.text for r in result.memories] == ["otters\ufffd float"]
    assert await fts_engine.write(repair.find_bad_rows) == {repair.BAD_UTF8: [memory_id]}
    await fts_engine.write(repair.fix_bad_rows)
    assert await fts_engine.write(repair.find_bad_rows) == {}
    assert (await fts_engine.recall("float", Viewer(user_id=1, dm=True), touch=False)).memories
    assert await fts_engine.write(lambda c: c.execute(
        "INSERT INTO memories_fts(memories_fts, rank) VALUES ('integrity-check', 1)")) is not None
