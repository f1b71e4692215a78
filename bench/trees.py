"""Modules of the memory layer in this tree or in an older copy of it (the A/B benchmarks load both)."""
from __future__ import annotations

import importlib
from types import ModuleType

# where each module of the old flat layout lives now
MOVED = {
    "fts": "sqlite.fts", "store": "sql.store", "touches": "recall.touches", "retrieval": "recall.retrieval",
    "subqueries": "recall.subqueries", "dates": "recall.dates", "ranking": "recall.ranking",
}


def memory_module(package: str, name: str) -> ModuleType:
    """`package`.memory.`name` in the flat layout, or where that module lives now."""
    try:
        return importlib.import_module(f"{package}.memory.{MOVED.get(name, name)}")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package}.memory.{name}")
