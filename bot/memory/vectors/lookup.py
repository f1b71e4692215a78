"""Which row, and which cached key, holds a memory's vector, for keys mapped from a snapshot.

A dict of a memory id to its row (per key) and one to its key (per cache) took more memory per
vector than the int8 row itself, in every process, never shared. For a key mapped from a
snapshot both are sorted copies of its ids instead (a binary search over a few bytes a vector),
with a small dict for the rows a process appended since. The answers are the dicts' own: a row
removed since (its id -1 in this process's copy) is found in neither.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator

import numpy as np

_NO_IDS = np.zeros(0, dtype=np.int64)


def _rows(order: np.ndarray) -> np.ndarray:
    return order.astype(np.int32) if len(order) < 2 ** 31 else order


class FileRows:
    """A mapped key's `row_of`: the row of each memory id among the file's rows [0, count) of
    `ids` (this process's view: a removed row reads -1), and `added`, those appended since."""
    __slots__ = ("ids", "count", "sorted", "rows", "added")

    def __init__(self, ids: np.ndarray, count: int) -> None:
        self.ids = ids
        self.count = count
        order = np.argsort(ids[:count], kind="stable")
        self.sorted = np.ascontiguousarray(ids[:count][order])
        self.rows = _rows(order)
        self.added: dict[int, int] = {}

    def get(self, memory_id: int, default: int | None = None) -> int | None:
        """The row holding `memory_id`, else `default`."""
        row = self.added.get(memory_id)
        if row is not None:
            return row
        at = int(np.searchsorted(self.sorted, memory_id))
        if at < len(self.sorted) and self.sorted[at] == memory_id:
            row = int(self.rows[at])
            if self.ids[row] == memory_id:
                return row
        return default

    def pop(self, memory_id: int, default: int | None = None) -> int | None:
        """The row holding `memory_id` (the caller then marks it removed: its id -1), else `default`."""
        row = self.get(memory_id)
        if row is None:
            return default
        self.added.pop(memory_id, None)
        return row

    def __getitem__(self, memory_id: int) -> int:
        row = self.get(memory_id)
        if row is None:
            raise KeyError(memory_id)
        return row

    def __setitem__(self, memory_id: int, row: int) -> None:
        self.added[memory_id] = row

    def __contains__(self, memory_id: object) -> bool:
        return isinstance(memory_id, (int, np.integer)) and self.get(int(memory_id)) is not None

    def __iter__(self) -> Iterator[int]:
        ids = self.ids[:self.count]
        yield from ids[ids >= 0].tolist()
        yield from list(self.added)

    def __len__(self) -> int:
        return int((self.ids[:self.count] >= 0).sum()) + len(self.added)


def listed(row_of: "dict[int, int] | FileRows") -> Iterable[int]:
    """The ids of a key that the cache's KeyIndex holds in its dict (a mapped key's: those appended)."""
    return list(row_of.added) if isinstance(row_of, FileRows) else row_of


class KeyIndex:
    """The cache's `_key_of` (memory id -> the cached key holding its vector): a dict, and for
    the keys mapped from a snapshot (`map`) a sorted array of their ids. A mapped key's answer
    holds while that key's entry is still the one mapped and the row is not removed."""

    def __init__(self, keys: "OrderedDict[str, Any]") -> None:
        self._cached = keys
        self._own: dict[int, str] = {}
        self._sorted = _NO_IDS
        self._key_at = _NO_IDS
        self._row_at = _NO_IDS  # each id's row when mapped (its key's arrays may be regrown since)
        self._names: list[str] = []
        self._entries: list[Any] = []

    def map(self, installed: dict[str, Any]) -> dict[int, str]:
        """Index the keys just mapped (those of an older generation are gone). Their ids no
        longer answer from the dict: returns those the dict gave another key (displaced: the
        caller settles them from the database; one of the two keys is behind)."""
        self._names, self._entries = list(installed), list(installed.values())
        parts = [(entry.ids[:entry.n], index) for index, entry in enumerate(self._entries)]
        ids = np.concatenate([part for part, _ in parts]) if parts else _NO_IDS
        where = (np.concatenate([np.full(len(part), index, dtype=np.int32) for part, index in parts])
                 if parts else _NO_IDS)
        rows = np.concatenate([np.arange(len(part), dtype=np.int32) for part, _ in parts]) if parts else _NO_IDS
        order = np.argsort(ids, kind="stable")
        self._sorted, self._key_at, self._row_at = np.ascontiguousarray(ids[order]), where[order], rows[order]
        displaced: dict[int, str] = {}
        if self._own:
            present = np.isin(np.fromiter(self._own, dtype=np.int64, count=len(self._own)), self._sorted)
            kept: dict[int, str] = {}
            for (memory_id, key), hit in zip(self._own.items(), present.tolist(), strict=True):
                (displaced if hit else kept)[memory_id] = key
            self._own = kept  # a new dict: one emptied keeps the table it had at its largest
        return displaced

    def _mapped(self, memory_id: int) -> str | None:
        at = int(np.searchsorted(self._sorted, memory_id))
        if at >= len(self._sorted) or self._sorted[at] != memory_id:
            return None
        found = self._at(memory_id, at)
        return found[0] if found is not None else None

    def _at(self, memory_id: int, at: int) -> tuple[str, int] | None:
        """(key, row) of `memory_id`, found at `at` in the sorted ids, if its key still holds it."""
        index = int(self._key_at[at])
        name = self._names[index]
        entry: Any = self._entries[index]
        if id(self._cached.get(name)) != id(entry):  # evicted, or mapped anew since
            return None
        mapped_row = int(self._row_at[at])
        if mapped_row < len(entry.ids) and entry.ids[mapped_row] == memory_id:
            return name, mapped_row
        row = entry.row_of.get(memory_id)  # removed, or its arrays regrown since
        return None if row is None else (name, int(row))

    def locate(self, ids: list[int]) -> dict[int, tuple[str, int]]:
        """(key, row) of each of `ids` that a cached key holds: those of mapped keys in one
        binary search (a search's cosines ask for dozens at a time)."""
        out: dict[int, tuple[str, int]] = {}
        rest = []
        for memory_id in ids:
            key = self._own.get(memory_id)
            if key is None:
                rest.append(memory_id)
                continue
            entry = self._cached.get(key)
            row = entry.row_of.get(memory_id) if entry is not None else None
            if row is not None:
                out[memory_id] = (key, row)
        if rest and len(self._sorted):
            wanted = np.asarray(rest, dtype=np.int64)
            at = np.minimum(np.searchsorted(self._sorted, wanted), len(self._sorted) - 1)
            for memory_id, place, hit in zip(rest, at.tolist(), (self._sorted[at] == wanted).tolist(), strict=True):
                found = self._at(memory_id, place) if hit else None
                if found is not None:
                    out[memory_id] = found
        return {memory_id: out[memory_id] for memory_id in ids if memory_id in out}  # in the order asked

    def get(self, memory_id: int, default: str | None = None) -> str | None:
        """The key holding `memory_id`, else `default`."""
        key = self._own.get(memory_id)
        if key is None:
            key = self._mapped(memory_id)
        return default if key is None else key

    def pop(self, memory_id: int, default: str | None = None) -> str | None:
        """The key holding `memory_id`, forgotten here (the caller removes the row from that key)."""
        key = self._own.pop(memory_id, None)
        if key is None:
            key = self._mapped(memory_id)
        return default if key is None else key

    def __getitem__(self, memory_id: int) -> str:
        key = self.get(memory_id)
        if key is None:
            raise KeyError(memory_id)
        return key

    def __setitem__(self, memory_id: int, key: str) -> None:
        self._own[memory_id] = key

    def __contains__(self, memory_id: object) -> bool:
        return isinstance(memory_id, (int, np.integer)) and self.get(int(memory_id)) is not None

    def clear(self) -> None:
        """Forget every key (the cache starts over)."""
        self._own.clear()
        self._sorted = self._key_at = self._row_at = _NO_IDS
        self._names, self._entries = [], []
