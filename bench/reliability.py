"""Reliability scenarios with figures: what was tried, what failed, what was lost.

  concurrent   two `muninn import`s and a `muninn maintain` loop (real processes) while the
               bot's engine stores extracted facts, remembers and forgets in this process
  bad-input    an import file and a recall batch mixing good lines with every kind of bad one
  kill         kill -9 during import, maintain and reindex, then run again: exact counts,
               integrity_check and the FTS integrity-check
  disk-full    an import onto a small tmpfs until the disk is full, then again with space

    PYTHONPATH=$PWD .venv/bin/python -m bench.reliability [--scenario NAME] [--json]

The tests (tests/scenarios/test_concurrency.py, tests/scenarios/test_reliability.py) run the same functions at a
small size. Point PYTHONPATH at another checkout to measure that code instead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import apsw

import bot

ROOT = Path(bot.__file__).resolve().parent.parent   # the checkout whose code is measured


@dataclass
class Figures:
    scenario: str
    tried: int = 0
    failed: int = 0        # refused or errored, and said so (an error line, a non-zero exit)
    lost: int = 0          # should be stored (or gone) and is not, with nothing said
    tracebacks: int = 0    # a Python traceback where one line was promised
    notes: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"{self.scenario:<44} tried {self.tried:>6}  failed {self.failed:>5}  lost {self.lost:>5}  "
                f"tracebacks {self.tracebacks:>2}" + (f"  ({'; '.join(self.notes)})" if self.notes else ""))


def cli_env(db_path: Path, ollama_url: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MUNINN_", "OLLAMA_"))}
    env.update({"PYTHONPATH": str(ROOT), "MUNINN_DB_PATH": str(db_path), "OLLAMA_URL": ollama_url,
                "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "5", "OLLAMA_RETRIES": "0",
                "MUNINN_MAINTENANCE_HOURS": "0"})
    return env


def muninn(env: dict[str, str], *args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bot.cli.main", *args], env=env, cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def import_file(path: Path, prefix: str, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{prefix} imported fact number {i} about the {prefix} archive",
                                "scope": "personal", "user_id": 4242, "external_id": f"{prefix}-{i}",
                                "importance": 0.5}) + "\n")
    return path


def count(db_path: Path, sql: str, params: tuple = ()) -> int:
    if not db_path.exists():
        return 0
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    # Wait as Muninn's own connections do: a checkpoint of a maintain still running can make a
    # reader wait a moment (with no busy timeout, BusyError at once: the flaky "two imports" test).
    conn.set_busy_timeout(5000)
    try:
        return conn.execute(sql, params).fetchall()[0][0]
    finally:
        conn.close()


def integrity(db_path: Path) -> list[str]:
    """Problems found by integrity_check and the FTS5 integrity-check (empty = healthy)."""
    from bot.memory.sqlite import db
    conn = db.connect(db_path)
    problems = []
    try:
        result = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        if result != ["ok"]:
            problems.append(f"integrity_check: {result[:3]}")
        try:
            conn.execute("INSERT INTO memories_fts(memories_fts, rank) VALUES ('integrity-check', 1)")
        except apsw.Error as exc:
            problems.append(f"fts integrity-check: {exc}")
        fts_rows = conn.execute("SELECT count(*) FROM memories_fts").fetchall()[0][0]
        active = conn.execute("SELECT count(*) FROM memories WHERE archived_at IS NULL").fetchall()[0][0]
        if fts_rows != active:
            problems.append(f"fts rows {fts_rows} != active memories {active}")
        if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'vec_memories'").fetchall()[0][0]:
            vec_rows = conn.execute("SELECT count(*) FROM vec_memories").fetchall()[0][0]
            embedded = conn.execute("SELECT count(*) FROM memories WHERE embedded = 1").fetchall()[0][0]
            if vec_rows != embedded:
                problems.append(f"vectors {vec_rows} != embedded flags {embedded}")
    finally:
        conn.close()
    return problems


def has_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" in text


# -- concurrent writers ----------------------------------------------------------

async def _bot_writes(db_path: Path, ollama_url: str, ops: int, stop_after: float) -> dict[str, Figures]:
    """What the bot does while the CLI runs: store extracted facts, /memory remember, /memory forget."""
    from bot.lifecycle.fact_store import store_facts
    from bot.lifecycle.facts import Fact
    from bot.memory.engine import Engine
    from bot.memory.records import NewMemory
    from bot.settings import load_settings

    settings = load_settings({k: v for k, v in cli_env(db_path, ollama_url).items()
                              if k.startswith(("MUNINN_", "OLLAMA_"))}, dotenv=False)
    facts, remembers, forgets = Figures("bot: extracted facts"), Figures("bot: /memory remember"), \
        Figures("bot: /memory forget")
    stored_facts: list[int] = []
    remembered: list[int] = []
    forgotten: list[int] = []
    started = time.monotonic()
    async with Engine(settings) as engine:
        for i in range(ops):
            facts.tried += 1
            try:
                fact = Fact(text=f"Alice owns {i + 1000} llamas named Fluffy{i}", about="Alice", scope="personal",
                            importance=0.6, owner_id=777, channel_id=70, guild_id=7, source_message_ids=(i,))
                stored_facts += await store_facts(engine, [fact])
            except Exception as exc:
                facts.failed += 1
                facts.notes = [f"{type(exc).__name__}: {str(exc)[:80]}"]
            remembers.tried += 1
            try:
                remembered.append(await engine.remember(
                    NewMemory(text=f"Bob's locker code is {5000 + i}", scope="personal", owner_id=888)))
            except Exception as exc:
                remembers.failed += 1
                remembers.notes = [f"{type(exc).__name__}: {str(exc)[:80]}"]
            if remembered and i % 2 == 1:
                forgets.tried += 1
                victim = remembered.pop(0)
                try:
                    if await engine.forget([victim]) == 1:
                        forgotten.append(victim)
                    else:
                        forgets.lost += 1
                except Exception as exc:
                    forgets.failed += 1
                    remembered.insert(0, victim)
                    forgets.notes = [f"{type(exc).__name__}: {str(exc)[:80]}"]
            if time.monotonic() - started > stop_after:
                break
            await asyncio.sleep(0.01)
    present = lambda ids: count(db_path, f"SELECT count(*) FROM memories WHERE id IN ({','.join(map(str, ids)) or 0})")  # noqa: E731
    facts.lost = (facts.tried - facts.failed) - present(sorted(set(stored_facts)))
    remembers.lost = len(remembered) - present(remembered)
    forgets.lost += present(forgotten)   # "forgotten" and still there
    return {"facts": facts, "remember": remembers, "forget": forgets}


def concurrent_writers(work: Path, *, lines: int = 1500, ops: int = 100, ollama_url: str = "") -> list[Figures]:
    """Two imports and a maintain loop in their own processes, the bot's writes in this one."""
    db_path = work / "concurrent.db"
    env = cli_env(db_path, ollama_url)
    code, _, err = finished(muninn(env, "stats"))
    assert code == 0, err
    files = [import_file(work / f"import-{name}.jsonl", name, lines) for name in ("alpha", "beta")]
    imports = [muninn(env, "import", str(f)) for f in files]
    maintains: list[subprocess.Popen] = []
    maintain = Figures("cli: maintain (loop)")

    def keep_maintaining() -> None:
        if all(p.poll() is not None for p in imports):
            return
        if not maintains or maintains[-1].poll() is not None:
            maintains.append(muninn(env, "maintain", "--no-llm", "--json"))

    async def run_all() -> dict[str, Figures]:
        bot_task = asyncio.create_task(_bot_writes(db_path, ollama_url, ops, stop_after=600))
        while not bot_task.done() or any(p.poll() is None for p in imports):
            keep_maintaining()
            await asyncio.sleep(0.05)
        return await bot_task

    bot_figures = asyncio.run(run_all())
    out = []
    for name, proc in zip(("alpha", "beta"), imports, strict=True):
        figures = Figures(f"cli: import {name}", tried=lines)
        code, _, err = finished(proc)
        figures.tracebacks = int(has_traceback(err))
        if code != 0:
            figures.failed = lines - count(db_path, "SELECT count(*) FROM memories WHERE external_id LIKE ?",
                                           (f"{name}-%",))
            figures.notes.append(f"exit {code}: {err.strip().splitlines()[-1][:100] if err.strip() else ''}")
        figures.lost = lines - figures.failed - count(
            db_path, "SELECT count(*) FROM memories WHERE external_id LIKE ?", (f"{name}-%",))
        out.append(figures)
    for proc in maintains:
        code, _, err = finished(proc)
        maintain.tried += 1
        maintain.failed += int(code != 0)
        maintain.tracebacks += int(has_traceback(err))
        if code != 0:
            maintain.notes = [err.strip().splitlines()[-1][:100] if err.strip() else f"exit {code}"]
    out.append(maintain)
    out += bot_figures.values()
    problems = integrity(db_path)
    if problems:
        out[0].notes.append("; ".join(problems))
    return out


# -- bad input -------------------------------------------------------------------

BAD_IMPORT_LINES: list[tuple[str, bytes]] = [
    ("id >= 2^63", json.dumps({"text": "x", "scope": "personal", "user_id": 2**63}).encode()),
    ("importance NaN", b'{"text": "x", "scope": "global", "importance": NaN}'),
    ("importance 1e400", b'{"text": "x", "scope": "global", "importance": 1e400}'),
    ("created_at NaN", b'{"text": "x", "scope": "global", "created_at": NaN}'),
    ("created_at 400 digits", b'{"text": "x", "scope": "global", "created_at": ' + b"9" * 400 + b"}"),
    ("created_at -1e11", b'{"text": "x", "scope": "global", "created_at": -1e11}'),
    ("created_at year 3000", b'{"text": "x", "scope": "global", "created_at": "3000-01-01T00:00:00Z"}'),
    ("lone surrogate in text", b'{"text": "bad \\ud800 text", "scope": "global"}'),
    ("lone surrogate in external_id", b'{"text": "x", "scope": "global", "external_id": "e\\udc00"}'),
    ("source_message_ids: 5", b'{"text": "x", "scope": "global", "source_message_ids": 5}'),
    ("invalid UTF-8", b'{"text": "caf\xe9 au lait", "scope": "global"}'),
    ("private: \"false\"", b'{"text": "x", "scope": "personal", "user_id": 1, "private": "false"}'),
    ("not JSON", b"{broken"),
    ("deeply nested", b"[" * 100000 + b"]" * 100000),
]


def bad_input(work: Path, *, good: int = 200) -> list[Figures]:
    """Every bad line of BAD_IMPORT_LINES among good ones, twice (the re-run must not stop either)."""
    db_path = work / "bad-input.db"
    env = cli_env(db_path)
    finished(muninn(env, "stats"))
    source = work / "mixed.jsonl"
    rng = random.Random(9)
    lines = [json.dumps({"text": f"good line {i} about otters", "scope": "global", "external_id": f"good-{i}"})
             .encode() for i in range(good)]
    bad_at: dict[int, str] = {}
    for _, raw in BAD_IMPORT_LINES:
        position = rng.randrange(len(lines) + 1)
        lines.insert(position, raw)
    for number, raw in enumerate(lines, start=1):
        for what, bad in BAD_IMPORT_LINES:
            if raw is bad:
                bad_at[number] = what
    source.write_bytes(b"\n".join(lines) + b"\n")
    out = []
    for run in ("first run", "re-run"):
        figures = Figures(f"import: {len(BAD_IMPORT_LINES)} bad in {good} good, {run}", tried=len(lines))
        code, stdout, err = finished(muninn(env, "import", str(source), "--json"))
        figures.tracebacks = int(has_traceback(err))
        stored = count(db_path, "SELECT count(*) FROM memories WHERE external_id LIKE 'good-%'")
        figures.lost = good - stored
        try:
            report = json.loads(stdout)
            reported = {e["line"] for e in report["errors"]}
            figures.failed = len(reported)
            if reported != set(bad_at):
                figures.notes.append(f"reported lines {sorted(reported)} != bad lines {sorted(bad_at)}")
        except (ValueError, KeyError):
            figures.failed = len(lines) - stored
            figures.notes.append(f"no report (exit {code})")
        figures.notes.append(f"exit {code}")
        out.append(figures)
    # stored values that poison reading, written directly as an older Muninn (or an old import) could have
    for i in range(3):
        finished(muninn(env, "remember", f"otters hold hands while sleeping {i}", "--scope", "global"))
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE memories SET created_at = -1e11, last_accessed = 1e300 WHERE text LIKE 'otters hold%'")
    conn.close()
    figures = Figures("recall of poisoned rows (touch, no-touch)", tried=2)
    for extra in ([], ["--no-touch"]):
        code, stdout, err = finished(muninn(env, "recall", "otters hold hands", "--user", "1", "--dm", "--json", *extra))
        figures.failed += int(code != 0)
        figures.tracebacks += int(has_traceback(err))
        try:
            figures.lost += 3 - sum("hold hands" in m["text"] for m in json.loads(stdout)["memories"])
        except (ValueError, KeyError):
            figures.lost += 3
    out.append(figures)
    out += bad_line_kinds(work)
    batch = work / "batch.jsonl"
    batch_lines = [
        json.dumps({"query": "otters", "user_id": 1, "dm": True, "no_touch": True}).encode(),
        b'{"query": "ott\\ud800ers", "user_id": 1, "dm": true, "no_touch": true}',
        json.dumps({"query": "otters", "user_id": 1, "dm": "false"}).encode(),
        json.dumps({"query": "otters", "user_id": 1, "no_touch": "no"}).encode(),
        json.dumps({"query": "otters", "user_id": 1, "as_of": 1e300}).encode(),
        json.dumps({"query": "otters", "user_id": 1, "limit": 2000}).encode(),
        json.dumps({"query": "otters", "user_id": 99999999999999999999}).encode(),
        b'{"query": "caf\xe9", "user_id": 1}',
        json.dumps({"query": "otters", "user_id": 1, "dm": True, "no_touch": True}).encode(),
    ]
    batch.write_bytes(b"\n".join(batch_lines) + b"\n")
    figures = Figures("recall --batch: 6 bad in 3 good", tried=len(batch_lines))
    code, stdout, err = finished(muninn(env, "recall", "--batch", str(batch), "--json"))
    figures.tracebacks = int(has_traceback(err))
    results = []
    for line in stdout.splitlines():
        try:
            results.append(json.loads(line))
        except ValueError:
            pass
    answered = {r["line"] for r in results if "memories" in r}
    figures.failed = sum(1 for r in results if "error" in r)
    figures.lost = len({1, 2, 9} - answered)
    figures.notes.append(f"exit {code}, {len(results)} result lines")
    out.append(figures)
    return out


def bad_line_kinds(work: Path, *, around: int = 40) -> list[Figures]:
    """Each kind of bad line alone, with `around` good lines before and after it (so it shares a
    64-line batch with good ones): how many good lines are stored, and what the run says."""
    out = []
    for index, (what, raw) in enumerate(BAD_IMPORT_LINES):
        db_path = work / f"kind-{index}.db"
        env = cli_env(db_path)
        finished(muninn(env, "stats"))
        good = [json.dumps({"text": f"good line {i}", "scope": "global", "external_id": f"k{i}"}).encode()
                for i in range(2 * around)]
        source = work / f"kind-{index}.jsonl"
        source.write_bytes(b"\n".join([*good[:around], raw, *good[around:]]) + b"\n")
        figures = Figures(f"  one bad line: {what}", tried=2 * around + 1)
        code, _, err = finished(muninn(env, "import", str(source)))
        figures.tracebacks = int(has_traceback(err))
        stored = count(db_path, "SELECT count(*) FROM memories WHERE external_id LIKE 'k%'")
        figures.lost = 2 * around - stored
        figures.failed = 2 * around + 1 - stored
        figures.notes.append(f"exit {code}")
        if count(db_path, "SELECT count(*) FROM memories") > stored:
            figures.failed -= 1
            figures.notes.append("the bad value was STORED")
        out.append(figures)
    return out


# -- kill -9 and run again -----------------------------------------------------------

def kill_and_rerun(work: Path, *, lines: int = 3000, ollama_url: str, seed: int = 1) -> list[Figures]:
    """kill -9 each of import, maintain and reindex at a random moment, then run it again."""
    rng = random.Random(seed)
    db_path = work / "kill.db"
    env = cli_env(db_path, ollama_url)
    source = import_file(work / "kill.jsonl", "kill", lines)
    out = []
    for command in (["import", str(source)], ["maintain", "--no-llm"], ["reindex"]):
        figures = Figures(f"kill -9 during {command[0]}, re-run", tried=1)
        proc = muninn(env, *command)
        _wait_until_working(db_path, command[0], proc)
        time.sleep(rng.uniform(0.0, 0.3))
        killed = proc.poll() is None
        if killed:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        code, _, err = finished(muninn(env, *command))
        figures.tracebacks = int(has_traceback(err))
        figures.failed = int(code != 0)
        stored = count(db_path, "SELECT count(*) FROM memories WHERE external_id LIKE 'kill-%'")
        figures.lost = lines - stored
        problems = integrity(db_path)
        if command[0] == "reindex":
            missing = count(db_path, "SELECT count(*) FROM memories WHERE embedded = 0 AND archived_at IS NULL")
            if missing:
                problems.append(f"{missing} memories without a vector")
        figures.notes.append(("killed" if killed else "finished before the kill") + f", re-run exit {code}")
        if problems:
            figures.lost += 1
            figures.notes.append("; ".join(problems))
        out.append(figures)
    return out


def _wait_until_working(db_path: Path, command: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Until the command has written something (so the kill lands mid-work, not at start-up)."""
    deadline = time.monotonic() + timeout
    before = count(db_path, "SELECT count(*) FROM memory_links") if command == "maintain" else 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if command == "import" and count(db_path, "SELECT count(*) FROM memories") > 0:
                return
            if command == "reindex" and count(db_path, "SELECT count(*) FROM memories WHERE embedded = 0") > 0:
                return
            if command == "maintain" and count(db_path, "SELECT count(*) FROM memory_links") != before:
                return
        except apsw.Error:
            pass  # the file is being created or migrated
        time.sleep(0.02)


# -- disk full ------------------------------------------------------------------------

def can_mount() -> str | None:
    """None if a tmpfs can be mounted here, else why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    probe = Path(tempfile.mkdtemp(prefix="muninn-mount-"))
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return f"mount failed: {done.stderr.strip()[:80]}"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    except FileNotFoundError:
        return "no mount command"
    finally:
        probe.rmdir()


def disk_full(work: Path, *, lines: int = 4000, size_kb: int = 768) -> list[Figures]:
    """Import onto a tmpfs too small for it: one line saying the disk is full, nothing corrupt,
    and after making room the re-run stores every line."""
    mount = work / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)], check=True)
    try:
        db_path = mount / "data" / "muninn.db"
        env = cli_env(db_path)
        source = work / "full.jsonl"
        with source.open("w") as f:
            for i in range(lines):
                f.write(json.dumps({"text": f"disk filler {i} " + "lorem ipsum dolor sit amet " * 8,
                                    "scope": "global", "external_id": f"full-{i}"}) + "\n")
        figures = Figures(f"import onto a {size_kb} KiB tmpfs", tried=lines)
        code, _, err = finished(muninn(env, "import", str(source)))
        figures.tracebacks = int(has_traceback(err))
        stored = count(db_path, "SELECT count(*) FROM memories")
        figures.failed = lines - stored
        last = err.strip().splitlines()[-1] if err.strip() else ""
        figures.notes.append(f"exit {code}: {last[:90]}")
        problems = integrity(db_path) if stored or db_path.exists() else []
        if problems:
            figures.notes.append("; ".join(problems))
            figures.lost += 1
        out = [figures]
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        again = Figures("... re-run after making room", tried=lines)
        code, _, err = finished(muninn(env, "import", str(source)))
        again.tracebacks = int(has_traceback(err))
        again.failed = int(code != 0)
        again.lost = lines - count(db_path, "SELECT count(*) FROM memories WHERE external_id LIKE 'full-%'")
        problems = integrity(db_path)
        if problems:
            again.notes.append("; ".join(problems))
        out.append(again)
        return out
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# -- command line ---------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["concurrent", "bad-input", "kill", "disk-full", "all"], default="all")
    parser.add_argument("--lines", type=int, default=1500)
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.fakes.ollama import FakeOllamaThread  # embeddings without a model: deterministic, local

    rows: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="muninn-reliability-") as tmp, FakeOllamaThread() as ollama:
        work = Path(tmp)
        chosen = args.scenario
        if chosen in ("concurrent", "all"):
            rows += concurrent_writers(work, lines=args.lines, ops=args.ops, ollama_url=ollama.url)
        if chosen in ("bad-input", "all"):
            rows += bad_input(work)
        if chosen in ("kill", "all"):
            rows += kill_and_rerun(work, lines=args.lines * 2, ollama_url=ollama.url)
        if chosen in ("disk-full", "all"):
            reason = can_mount()
            if reason is None:
                rows += disk_full(work)
            else:
                rows.append(Figures("disk full", notes=[f"skipped: {reason}"]))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(f"code measured: {ROOT}")
        for row in rows:
            print(row.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
