"""Old and new code side by side on one fact write, interleaved (bench/README.md, issue 13):

    python -m bench.pg_write_ab postgresql://HOST:PORT/DB OLD_TREE NEW_TREE [--rounds 2] [--facts 60]
                                [--writers 1,4] [--modes own,shared] [--latencies 0]
                                [--template muninn_bench_10000]

Each tree is a checkout of this repository (`git archive COMMIT | tar -x -C DIR`): its
bench/pg_write_profile.py `run()` profiles the writers (1 or 4 processes, `fact_store.store_facts`,
the embed server answering `latency` ms late) on a fresh copy of the template world, in a
process started in that tree, so each side runs its own code (a latency other than 0 needs this
branch's bench/embed_server.py and bench/pg_write_profile.py in both trees). Runs alternate old,
new, new, old, ... per (latency, mode, writers); prints facts/s, CPU per fact (writer, server) and
the round trips of planning and of the write, per run and as the two sides' medians, and each
side's facts/s 1 -> 4 writers (the ratio of its runs' sums).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from .pg_speed import create_database

FIELDS = ("facts_per_s", "client_cpu_ms", "server_cpu_ms", "plan_trips", "write_trips", "lock_held", "load")


def profile_in(tree: str, url: str, facts: int, mode: str, writers: int, latency: float = 0.0) -> dict:
    more = f", embed_latency_ms={latency!r}" if latency else ""
    code = ("import json; from bench.pg_write_profile import run; "
            f"print('JSON', json.dumps(run({url!r}, {facts}, {mode!r}, {writers}, False{more})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tree,
                          env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("JSON"))[5:])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server")
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--template", default="muninn_bench_10000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--facts", type=int, default=60)
    parser.add_argument("--writers", default="1,4")
    parser.add_argument("--modes", default="own,shared")
    parser.add_argument("--latencies", default="0", help="embed latencies in ms, comma-separated")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    trees = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    results: list[dict] = []
    modes, counts = args.modes.split(","), [int(w) for w in args.writers.split(",")]
    latencies = [float(x) for x in args.latencies.split(",")]
    for latency in latencies:
        for mode in modes:
            for writers in counts:
                for round_number in range(args.rounds):
                    for side in (("old", "new") if round_number % 2 == 0 else ("new", "old")):
                        url = create_database(args.server, f"{args.template}_ab", template=args.template)
                        out = profile_in(trees[side], url, args.facts, mode, writers, latency)
                        row = {"side": side, "latency_ms": latency, "mode": mode, "writers": writers,
                               "round": round_number + 1, **{key: out.get(key) for key in FIELDS}}
                        results.append(row)
                        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    print("\n| latency | keys | writers | side | facts/s per run | writer CPU ms | server CPU ms | plan round trips | "
          "write round trips | lock held ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for latency in latencies:
        for mode in modes:
            for writers in counts:
                for side in ("old", "new"):
                    rows = [r for r in results if (r["latency_ms"], r["mode"], r["writers"], r["side"])
                            == (latency, mode, writers, side)]
                    med = {key: statistics.median(float(r[key] or 0) for r in rows) for key in FIELDS}
                    print(f"| {latency:g} ms | {mode} | {writers} | {side} | "
                          f"{' / '.join(str(r['facts_per_s']) for r in rows)} | {med['client_cpu_ms']:.2f} | "
                          f"{med['server_cpu_ms']:.2f} | {med['plan_trips']:.2f} | {med['write_trips']:.2f} | "
                          f"{med['lock_held']:.2f} |")
    if len(counts) > 1:
        print(f"\n| latency | keys | side | facts/s {counts[0]} -> {counts[-1]} writers (sums over the rounds) | ratio |")
        print("|---|---|---|---|---|")
        for latency in latencies:
            for mode in modes:
                for side in ("old", "new"):
                    sums = [sum(float(r["facts_per_s"]) for r in results if (r["latency_ms"], r["mode"], r["side"],
                                r["writers"]) == (latency, mode, side, n)) for n in (counts[0], counts[-1])]
                    print(f"| {latency:g} ms | {mode} | {side} | {sums[0] / args.rounds:.1f} -> {sums[1] / args.rounds:.1f} "
                          f"| **{sums[1] / sums[0]:.2f}x** |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
