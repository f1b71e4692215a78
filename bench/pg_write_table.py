"""Facts stored per second by 1 and by 4 PostgreSQL writer processes, own and shared keys, with the
embedding answering at once and a real model's time late, in one table (issue 13's goal: 4
writers >= 3x one):

    python -m bench.pg_write_table postgresql://HOST:PORT/DB [--rounds 2] [--facts 60]
                                   [--latencies 0,20] [--template muninn_bench_10000] [--json FILE]

DB's server must hold the template world (`bench.speed --sizes 10000 --database-url ...` leaves
`<db>_bench_10000` there). Each run gets a fresh copy of it (`<template>_wt`), so every run
stores new facts into the same world. The writers are bench/pg_speed.py's (`measure_writers`:
`fact_store.store_facts` as the bot stores an extracted fact, the embedding through the hash
embed server answering `latency` ms late). Per latency and round, the four runs (own and shared
keys, 1 and 4 writers) go in one order, the next round in the reverse one, so a load that drifts
during the run favours neither side of a ratio.

Why the latency: the hash server answers in ~2 ms of this machine's CPU, so with none 4 writers,
their PostgreSQL backends and the server saturate 2 cores and the ratio measures CPU per fact.
A real Ollama's embedding takes 10-50 ms on its own host, during which a writer holds no lock
and uses no CPU: 20 ms (pg_speed.EMBED_LATENCY_MS) is the realistic protocol.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from .embed_server import EmbedServerProcess
from .pg_speed import EMBED_LATENCY_MS, WRITER_MODES, create_database, measure_writers
from .world import EMBED_MODEL

WRITERS = (1, 4)


def runs_in_order(round_number: int) -> list[tuple[str, int]]:
    """(mode, writers) for one round: forward in even rounds, reversed in odd ones."""
    order = [(mode, writers) for mode in WRITER_MODES for writers in WRITERS]
    return order if round_number % 2 == 0 else order[::-1]


def one_run(server: str, template: str, embed_url: str, mode: str, writers: int, facts: int) -> dict:
    target = create_database(server, f"{template}_wt", template=template)
    env = {"MUNINN_DB_PATH": "/nonexistent.db", "MUNINN_DATABASE_URL": target, "OLLAMA_URL": embed_url,
           "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30",
           "MUNINN_MAINTENANCE_HOURS": "0"}
    result = measure_writers(env, writers, facts, mode=mode)
    result["load"] = round(os.getloadavg()[0], 2)
    return result


def measure(server: str, template: str, latencies: list[float], rounds: int, facts: int) -> dict:
    out: dict[str, Any] = {"template": template, "facts_per_writer": facts, "rounds": rounds, "runs": []}
    for latency in latencies:
        with EmbedServerProcess("hash", dim=768, latency_ms=latency) as embed_url:
            for round_number in range(rounds):
                for mode, writers in runs_in_order(round_number):
                    result = one_run(server, template, embed_url, mode, writers, facts)
                    result.update(latency_ms=latency, round=round_number + 1, mode=mode)
                    out["runs"].append(result)
                    print(f"  latency {latency:g} ms, round {round_number + 1}, {mode} keys, {writers} writer(s): "
                          f"{result['facts_per_s']} facts/s (load {result['load']})", flush=True)
    return out


def table(out: dict) -> list[str]:
    """Per latency and keys: each round's 1 -> 4 writers (4 / 1), and the ratio of the rounds' sums."""
    lines = ["| embed latency | keys | round: 1 writer -> 4 writers facts/s (4 / 1) | 4 / 1 over the rounds | load |",
             "|---|---|---|---|---|"]
    latencies = list(dict.fromkeys(r["latency_ms"] for r in out["runs"]))
    for latency in latencies:
        for mode in WRITER_MODES:
            runs = [r for r in out["runs"] if r["latency_ms"] == latency and r["mode"] == mode]
            rounds = sorted({r["round"] for r in runs})
            cells, ones, fours = [], [], []
            for number in rounds:
                one = next(r["facts_per_s"] for r in runs if r["round"] == number and r["writers"] == 1)
                four = next(r["facts_per_s"] for r in runs if r["round"] == number and r["writers"] == 4)
                ones.append(one)
                fours.append(four)
                cells.append(f"{number}: {one} -> {four} ({four / one:.2f}x)")
            loads = [r["load"] for r in runs]
            lines.append(f"| {latency:g} ms | {mode} | {'; '.join(cells)} | **{sum(fours) / sum(ones):.2f}x** | "
                         f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f}) |")
    return lines


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", help="postgresql://HOST:PORT/DB: a database on the server holding the template")
    parser.add_argument("--template", default="muninn_bench_10000", help="the world each run copies")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--facts", type=int, default=60, help="facts per writer process")
    parser.add_argument("--latencies", default=f"0,{EMBED_LATENCY_MS:g}", help="embed latencies in ms, comma-separated")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    out = measure(args.server, args.template, [float(x) for x in args.latencies.split(",")], args.rounds, args.facts)
    print("\n" + "\n".join(table(out)))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
