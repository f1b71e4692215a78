"""Keep Python's full garbage collections from walking the warm vector cache.

A full (generation 2) collection visits every tracked object: with the cache of a big database
warm that is tens of thousands of objects, walked holding the GIL, so a recall that met one
waited for it. The cache lives as long as its engine and holds no garbage cycles, so once it is
warm everything alive is moved out of the collector's sight (`gc.freeze`); the last engine to
close gives it back (`gc.unfreeze`). Freezing is process-wide, hence the count of engines.

No `gc.collect()` before freezing: in a process that opens many engines (the tests) each one
would pay a full collection; the few cycles that are garbage at that moment are only kept until
the last engine closes.

`MUNINN_GC_FREEZE=off` (an A/B switch for bench/tail.py, not a setting) leaves the collector alone.
"""
from __future__ import annotations

import gc
import os
import threading

_lock = threading.Lock()
_holders = 0  # engines whose warm cache is frozen


def freeze_wanted() -> bool:
    """False when MUNINN_GC_FREEZE turns the freeze off (off, 0, false, no)."""
    return os.environ.get("MUNINN_GC_FREEZE", "").strip().lower() not in ("off", "0", "false", "no")


def holders() -> int:
    """How many engines hold the freeze now."""
    with _lock:
        return _holders


class FrozenWhileWarm:
    """One engine's share of the freeze: `warm()` once its cache is loaded, `release()` at close."""

    def __init__(self) -> None:
        self._holding = False

    def warm(self) -> None:
        """Freeze what is alive now (again, for an engine that holds already); does nothing when freezing is off."""
        global _holders
        if not freeze_wanted():
            return
        with _lock:
            gc.freeze()  # also for an engine that holds already: what it loaded since joins
            if not self._holding:
                self._holding = True
                _holders += 1

    def release(self) -> None:
        """Give this engine's share back; the last one to go unfreezes. Safe to call twice."""
        global _holders
        with _lock:
            if not self._holding:
                return
            self._holding = False
            _holders -= 1
            if _holders == 0:
                gc.unfreeze()
