"""A tiny run of bench/health.py: the real bot on the fake gateway, recalls in flight, a scraping child process."""
from __future__ import annotations

import argparse

from bench.health import run


async def test_pages_answer_while_recalls_are_in_flight(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    args = argparse.Namespace(size=300, in_flight=4, seconds=1.0, every=20.0, workdir=str(tmp_path), out=None)
    result = await run(args)
    assert result["statuses"].get(200, 0) >= 2 and set(result["statuses"]) == {200}
    assert result["/metrics"]["n"] >= 1 and result["/healthz"]["n"] >= 1
    assert result["recalls_per_s"] > 0
