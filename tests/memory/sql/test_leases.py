"""Where a lease holder runs (`leases._place`): read from /proc once per process; where /proc
cannot be read, a place of that process alone, so a holder of an unknown place is never judged
dead from here (two containers sharing the host name and kernel would otherwise match)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bot.memory.sql import leases

ROOT = Path(__file__).resolve().parents[3]
# A process that cannot read /proc (as on a system without it, or a sandbox hiding it) prints
# its place and the name it would hold a lease under, then exits.
WITHOUT_PROC = """
import os, pathlib
def refuse(*args, **kwargs):
    raise PermissionError("no /proc here")
pathlib.Path.read_text = refuse
os.stat = refuse
from bot.memory.sql import leases
print(leases._place(), leases.new_holder(), flush=True)
"""


def run_without_proc() -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", WITHOUT_PROC], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    return out[0], out[1]


def test_an_unreadable_place_matches_no_other_process_so_its_holder_is_never_taken_for_dead():
    (first, dead_holder), (second, _) = run_without_proc(), run_without_proc()
    assert first != second and leases._place() not in (first, second)
    assert dead_holder.endswith(f"@{first}")
    assert not leases.abandoned(dead_holder)   # that process has exited, but its place is not ours


def test_the_place_is_read_once_per_process(monkeypatch):
    place = leases._place()
    monkeypatch.setattr(os, "stat", lambda *args, **kwargs: (_ for _ in ()).throw(PermissionError("gone")))
    assert leases._place() == place   # cached: the same place for all of this process's holders
