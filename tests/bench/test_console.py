"""A tiny run of bench/console.py: every page it times answers, over HTTP (the browser part is the browser test's)."""
from __future__ import annotations

import argparse

from bench.console import run


async def test_every_page_answers_at_a_small_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    result = await run(argparse.Namespace(size=300, repeat=1, browser=False, workdir=str(tmp_path), database_url=""))
    pages = {row["page"] for row in result["pages"]}
    assert {"busiest channel", "heaviest person", "a memory", "search", "stats (a year)"} <= pages
    assert all(row["http_p95_ms"] > 0 for row in result["pages"]) and result["browser"] == "off"
