"""The `muninn` command line, run in-process against a fake Ollama on 127.0.0.1, on each
storage backend (MUNINN_DATABASE_URL picks PostgreSQL, as in a real environment)."""
from __future__ import annotations

import json

import pytest

from bot.cli.main import main

pytestmark = pytest.mark.usefixtures("backend")


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_remember_then_recall_with_reasons(cli):
    code, out, _ = cli("remember", "the GPU server has 4x RTX 3090", "--scope", "room", "--channel", 7,
                       "--guild", 5, "--user", 1, "--json")
    assert code == 0 and json.loads(out) == {"id": 1, "embedded": True}
    code, out, _ = cli("remember", "Oz prefers dark mode", "--scope", "personal", "--user", 1, "--guild", 5)
    assert code == 0 and out.strip() == ("Remembered #2 (personal), visible to user 1 in server 5 and in their DMs "
                                         "with Muninn.")
    code, out, _ = cli("recall", "What GPU does the server have?", "--user", 2, "--channel", 7, "--guild", 5, "--json")
    data = json.loads(out)
    assert code == 0 and data["mode"] == "hybrid"
    assert [m["id"] for m in data["memories"]] == [1]  # user 2 never sees user 1's personal memory
    assert data["memories"][0]["reason"]["via"] == "both"
    code, out, _ = cli("recall", "dark mode", "--user", 1, "--dm", "--json", "--no-touch")
    assert [(m["text"], m["access_count"]) for m in json.loads(out)["memories"]] == [("Oz prefers dark mode", 0)]
    code, out, _ = cli("recall", "dark mode", "--user", 1, "--dm")
    assert out.startswith("hybrid recall (vectors: ok) as user 1 in a DM with Muninn: 1 memory\n")
    assert out.splitlines()[2].split() == ["1", "#2", "personal", "Oz", "prefers", "dark", "mode", "words", "#1,",
                                           "meaning", "0.71"]
    code, out, _ = cli("recall", "dark mode", "--user", 1, "--dm", "--json", "--no-touch")
    assert json.loads(out)["memories"][0]["access_count"] == 1  # only the recall without --no-touch counted


def test_recall_modes_are_reported(cli, ollama):
    cli("remember", "the GPU server has 4x RTX 3090", "--scope", "global")
    ollama.mode = "error"
    _, out, _ = cli("recall", "GPU", "--user", 1, "--dm", "--json")
    assert json.loads(out)["mode"] == "fts-only"
    ollama.mode = "up"
    ollama.synonyms = {"graphics": "gpu"}
    _, out, _ = cli("recall", "graphics?", "--user", 1, "--dm", "--json")
    assert json.loads(out)["mode"] == "vector-only"


@pytest.mark.sqlite_only("--db names a SQLite file")
def test_db_option_works_on_every_subcommand(cli, tmp_path):
    other = tmp_path / "other.db"
    assert cli("remember", "fact", "--scope", "global", "--db", other)[0] == 0
    assert cli("--db", other, "remember", "fact two", "--scope", "global")[0] == 0
    code, out, _ = cli("stats", "--db", other, "--json")
    assert json.loads(out)["memories"] == 2
    assert json.loads(cli("stats", "--json")[1])["memories"] == 0


def test_recall_batch_keeps_order_and_isolates_bad_lines(cli, tmp_path):
    cli("remember", "the GPU server has 4x RTX 3090", "--scope", "room", "--channel", 7, "--guild", 5)
    batch = tmp_path / "q.jsonl"
    batch.write_text("\n".join([
        json.dumps({"query": "GPU", "user_id": 1, "channel_id": 7, "guild_id": 5, "no_touch": True}),
        "{not json",
        json.dumps({"query": "GPU", "user_id": "bob"}),
        json.dumps({"query": "GPU", "user_id": 1, "dm": True, "limit": 3}),
        json.dumps({"query": "GPU", "user_id": 1, "as_of": "not a time"}),
        json.dumps({"query": "GPU", "user_id": 1, "colour": "red"}),
        json.dumps({"query": "GPU", "user_id": 1, "channel_id": 7, "guild_id": 5, "as_of": "2999-01-01T00:00:00"}),
        json.dumps({"query": "GPU", "user_id": 1, "channel_id": 7, "guild_id": 5}),
    ]) + "\n")
    code, out, _ = cli("recall", "--batch", batch, "--json")
    results = jsonl(out)
    assert code == 3 and [r["line"] for r in results] == [1, 2, 3, 4, 5, 6, 7, 8]  # 3: some lines were bad
    assert [(m["id"], m["access_count"]) for m in results[0]["memories"]] == [(1, 0)]  # no_touch
    assert "error" in results[1] and "error" in results[2] and "error" in results[4] and "colour" in results[5]["error"]
    assert results[3]["memories"] == []  # a room memory never shows in a DM
    assert "no_touch" in results[6]["error"]  # a far-future touch would pin the memory: refused
    assert [(m["id"], m["access_count"]) for m in results[7]["memories"]] == [(1, 1)]


def test_import_reports_bad_lines_and_is_idempotent(cli, tmp_path, ollama):
    source = tmp_path / "memories.jsonl"
    rows = [{"text": f"imported fact {i} about llamas", "scope": "personal", "user_id": 9, "external_id": f"x{i}",
             "created_at": "2024-05-01T10:00:00Z", "importance": 0.4} for i in range(70)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(3, "{broken")
    lines.insert(10, json.dumps({"text": "", "scope": "personal", "user_id": 9}))
    lines.insert(20, json.dumps({"text": "room with no channel", "scope": "room"}))
    source.write_text("\n".join(lines) + "\n")
    code, out, err = cli("import", source, "--json")
    report = json.loads(out)
    assert code == 3 and report["imported"] == 70  # 3: the good lines are in, some lines were bad
    assert [e["line"] for e in report["errors"]] == [4, 11, 21]
    assert "line 4:" in err and "importing" in err
    assert report["missing_vectors"] == 0
    assert len(ollama.embed_requests()) == 2  # embedded in batches, not one call a line
    code, out, _ = cli("import", source, "--json")
    assert json.loads(out)["imported"] == 0 and json.loads(out)["skipped_existing"] == 70
    _, out, _ = cli("recall", "llamas", "--user", 9, "--dm", "--json", "--limit", 3)
    assert len(json.loads(out)["memories"]) == 3


def test_import_while_ollama_is_down_stores_and_says_so(cli, tmp_path, ollama):
    source = tmp_path / "m.jsonl"
    source.write_text(json.dumps({"text": "a fact", "scope": "global"}) + "\n")
    with ollama.down():
        code, out, _ = cli("import", source)
    assert code == 0 and "imported 1" in out and "muninn maintain" in out


def test_reindex_after_a_model_change(cli, monkeypatch, ollama):
    cli("remember", "first fact", "--scope", "global")
    cli("remember", "second fact", "--scope", "global")
    ollama.models.append("mxbai-embed-large")
    monkeypatch.setenv("OLLAMA_EMBED_MODEL", "mxbai-embed-large")
    ollama.wrong_dim = 1024  # the new model has another dimension
    _, out, _ = cli("recall", "fact", "--user", 1, "--dm", "--json")
    assert json.loads(out)["vector_status"] == "model-mismatch"
    _, out, _ = cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert checks["vector index"]["fix"] == "muninn reindex"
    code, out, err = cli("reindex", "--json")
    assert code == 0 and json.loads(out) == {"reindexed": 2, "model": "mxbai-embed-large"}
    assert "2/2" in err
    stats = json.loads(cli("stats", "--json")[1])
    assert stats["embedding_model"] == "mxbai-embed-large" and stats["embedding_dim"] == 1024
    _, out, _ = cli("recall", "fact", "--user", 1, "--dm", "--json")
    assert json.loads(out)["mode"] == "hybrid"


def test_reindex_with_ollama_down_drops_nothing(cli, ollama):
    cli("remember", "first fact", "--scope", "global")
    with ollama.down():
        code, _, err = cli("reindex")
    assert code == 1 and "ollama serve" in err
    assert json.loads(cli("stats", "--json")[1])["embedded"] == 1


def test_doctor_names_the_fix_for_each_problem(cli, ollama):
    code, out, _ = cli("doctor")
    assert code == 0 and "FAIL" not in out
    ollama.missing = {"llama3.2"}
    code, out, _ = cli("doctor", "--json")
    failed = [c for c in json.loads(out)["checks"] if not c["ok"]]
    assert code == 1 and [c["fix"] for c in failed] == ["ollama pull llama3.2"]
    with ollama.down():
        code, out, _ = cli("doctor")
    assert code == 1 and "ollama serve" in out


@pytest.mark.parametrize("args, message", [
    (["recall", "x"], "--user"),
    (["recall", "x", "--user", 1, "--dm", "--guild", 2], "DM has no guild"),
    (["recall", "x", "--user", 1, "--as-of", "yesterday"], "ISO-8601"),
    (["remember", "", "--scope", "global"], "empty"),
    (["remember", "x", "--scope", "personal"], "owner"),
    (["recall", "--batch", "/nonexistent.jsonl"], "no file"),
    (["import", "/nonexistent.jsonl"], "no file"),
])
def test_bad_input_is_one_clear_line(cli, args, message):
    code, out, err = cli(*args)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("args", [["recall", "x", "--user", "bob"], ["recall", "x", "--user", 1, "--limit", 0],
                                  ["remember", "x", "--scope", "team"],
                                  ["remember", "x", "--scope", "global", "--importance", 2]])
def test_argument_errors_exit_2(cli, args):
    with pytest.raises(SystemExit) as exit_:
        cli(*args)
    assert exit_.value.code == 2


def run_sql(tmp_path, database_url: str, sql: str) -> None:
    """One statement on the database the CLI uses, as another program would run it."""
    if database_url:
        import psycopg
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.encode())
    else:
        from bot.memory.sqlite import db
        conn = db.connect(tmp_path / "cli.db")
        conn.execute(sql)
        conn.close()


def test_doctor_finds_a_broken_row_and_fix_clamps_it(cli, tmp_path, database_env):
    cli("remember", "otters hold hands", "--scope", "global")
    cli("remember", "otters sleep afloat", "--scope", "global")
    run_sql(tmp_path, database_env, "UPDATE memories SET last_accessed = 1e300, stability = 0 WHERE id = 2")
    code, out, _ = cli("doctor", "--json")
    [bad] = [c for c in json.loads(out)["checks"] if not c["ok"]]
    assert code == 1 and bad["check"] == "stored values" and "#2" in bad["detail"]
    assert bad["fix"].startswith("muninn doctor --fix")
    code, out, _ = cli("doctor", "--fix", "--json")
    values = next(c for c in json.loads(out)["checks"] if c["check"] == "stored values")
    assert code == 0 and values["ok"] and values["detail"].startswith("clamped 2 values")
    code, out, _ = cli("doctor")
    assert code == 0 and "FAIL" not in out
    _, out, _ = cli("recall", "otters", "--user", 1, "--dm", "--json", "--no-touch")
    assert {m["id"] for m in json.loads(out)["memories"]} == {1, 2}


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_doctor_on_postgresql_checks_without_migrating_and_says_what_to_run(cli, monkeypatch, postgres_server):
    import psycopg
    url = postgres_server.create_database("muninn_doctor_fresh")
    try:
        monkeypatch.setenv("MUNINN_DATABASE_URL", url)
        code, out, _ = cli("doctor", "--json")
        database = next(c for c in json.loads(out)["checks"] if c["check"] == "database")
        assert code == 1 and not database["ok"] and "schema 0/" in database["detail"]
        assert "no Muninn tables yet" in database["detail"] and database["fix"].startswith("muninn stats")
        gin = next(c for c in json.loads(out)["checks"] if c["check"] == "btree_gin")
        assert gin["ok"] and "available" in gin["detail"]  # migration 14 will create it
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('memories')").fetchone() == (None,)  # the check made nothing
        assert cli("stats")[0] == 0                                                        # what it said to run
        code, out, _ = cli("doctor")
        assert code == 0 and "FAIL" not in out and "btree_gin 1." in out
    finally:
        postgres_server.drop_database("muninn_doctor_fresh")


def test_doctor_says_what_to_install_for_a_server_without_btree_gin():
    from bot.cli.doctor import btree_gin_check
    missing = btree_gin_check(None, False)
    assert not missing.ok and "contrib" in missing.fix and "CREATE EXTENSION btree_gin" in missing.fix
    assert btree_gin_check(None, True).ok and btree_gin_check("1.3", False).ok


@pytest.mark.parametrize("argv, wrong", [
    (["recall", "x", "--limit", "100000"], "--limit: '100000' is more than"),
    (["recall", "x", "--user", "abc"], "--user: id 'abc' must be a numeric id"),
    (["remember"], "the following arguments are required: text"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
])
def test_a_bad_argument_is_one_line_on_stderr(argv, wrong, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert err.count("\n") == 1 and wrong in err and "--help)" in err and "usage:" not in err


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`muninn stats --json | head -c0`: the reader is gone before Muninn writes; no traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MUNINN_", "OLLAMA_", "DISCORD_"))}
    env.update(MUNINN_DB_PATH=str(tmp_path / "m.db"), OLLAMA_URL="")
    proc = subprocess.Popen([sys.executable, "-m", "cogs", "stats", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_recall_says_when_the_relevance_floor_leaves_the_prompt_nothing(cli, monkeypatch):
    monkeypatch.setenv("MUNINN_INJECT_MIN_COSINE", "0.4")  # the fake's cosines: 0.46 near, 0.19 far
    cli("remember", "the GPU server has 4x RTX 3090", "--scope", "global")
    _, out, _ = cli("recall", "What GPU does the server have?", "--user", 1, "--dm", "--json", "--no-touch")
    near = json.loads(out)
    assert near["relevance_floor"] == 0.4 and near["for_prompt"] == 1
    _, out, _ = cli("recall", "the capital of Peru", "--user", 1, "--dm", "--json", "--no-touch")
    far = json.loads(out)
    assert len(far["memories"]) == 1 and far["for_prompt"] == 0  # still listed, never put into a prompt
    _, out, _ = cli("recall", "the capital of Peru", "--user", 1, "--dm", "--no-touch")
    assert "none reaches the relevance floor (0.4): a reply's prompt gets none" in out
