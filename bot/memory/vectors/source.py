"""The storage reads of the vector cache, per backend, and what its read of the change log gives."""
from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from bot.memory.vectors import index as vectors

# A changed memory as the change log's read saw it: id -> (vis_key, created_at, its vector (None:
# not read with it)) for an active memory with a vector; id -> None for one without (removed).
Changed = dict[int, "tuple[str, float, np.ndarray | None] | None"]


class Overlay(set):
    """Ids changed since the cache's mark, seen inside a transaction (their changes may still
    roll back): scored for that search alone. `states`: what the log's read gave of them."""

    def __init__(self, ids: Iterable[int], states: Changed | None) -> None:
        super().__init__(ids)
        self.states = states


class VectorSource(Protocol):
    """The storage reads of the cache, per backend. A mark is opaque to the cache: where in the
    change log it has read up to. A source may say `inline_load_max`: the most vectors of a cold
    key a search loads itself (more go to the background loader; keys.INLINE_LOAD_MAX otherwise),
    and `admit_window_s`: such a key is loaded only when met again within that many seconds
    (admission.SecondHit; 0 or absent: on its first miss)."""

    def poll(self, conn: Any, mark: Any) -> tuple[str | None, list[int], Any, bool, Changed | None]:
        """(the index's epoch, ids changed since `mark` (None: none, just the current mark), the
        mark after them, False when the log was pruned past `mark`, and the changed memories as
        of that mark when the same read gives them (else None: `_apply` reads them))."""
    def changed_between(self, conn: Any, older: Any, newer: Any) -> set[int]:
        """The ids changed after mark `older` and up to mark `newer`."""
    def key_size_at_least(self, conn: Any, key: str, cap: int) -> int:
        """How many vectors `key` holds, counted only up to `cap` + 1."""
    def load_key(self, conn: Any, info: vectors.IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All vectors of one key: (ids, created_at, matrix)."""
    def read_vectors(self, conn: Any, info: vectors.IndexInfo, ids: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of those of `ids` that have one."""
    def search(self, conn: Any, info: vectors.IndexInfo, query: list[float], keys: list[str], k: int,
               as_of: float | None) -> list[tuple[int, float]]:
        """The store's own exact search (keys the cache does not hold)."""
    def similar_to_memory(self, conn: Any, info: vectors.IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """The k nearest under `keys` to a stored memory's own vector, itself left out: [(id, L2 distance)]."""


def read_with(states: Changed, memory_id: int, dim: int) -> np.ndarray | None:
    """The vector the log's read gave for `memory_id`, if it has the index's size."""
    state = states.get(memory_id)
    vector = state[2] if state is not None else None
    return vector if vector is not None and len(vector) == dim else None
