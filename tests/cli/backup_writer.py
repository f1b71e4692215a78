"""One writer process for tests/cli/test_backup.py: remembers memories through the Engine until
told to stop, logging each id once its transaction has committed.

python -m tests.cli.backup_writer DB_PATH LOG_FILE STOP_FILE WRITER_NUMBER OLLAMA_URL"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bot.memory import records
from bot.memory.engine import Engine
from bot.settings import load_settings


def asked_to_stop(stop: Path) -> bool:
    return stop.exists()


async def write(db: str, log: Path, stop: Path, number: int, ollama_url: str) -> None:
    settings = load_settings({"MUNINN_DB_PATH": db, "OLLAMA_URL": ollama_url, "MUNINN_MAINTENANCE_HOURS": "0"},
                             dotenv=False)
    async with Engine(settings, warm=False) as engine:
        with log.open("a") as out:
            n = 0
            while not asked_to_stop(stop):
                memory_id = await engine.remember(records.NewMemory(
                    f"writer {number} note {n} about the harbour", "personal", owner_id=1000 + number))
                out.write(f"{memory_id}\n")  # only now: remember() returned, the transaction committed
                out.flush()
                n += 1


if __name__ == "__main__":
    asyncio.run(write(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
