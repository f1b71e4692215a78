"""A tiny run of bench/scale.py: real writer processes on one file, real fake-Ollama hosts."""
from __future__ import annotations

from bench.scale import replies_per_second, writes_per_second


async def test_replies_spread_over_hosts_run():
    assert await replies_per_second(2, 8, 20.0) > 0


def test_two_writer_processes_on_one_file_both_finish():
    # Each writer stores 50 memories in 50 transactions; a BusyError in either fails the run.
    assert writes_per_second(2, 50) > 0
