"""Old and new code side by side on one fact write, interleaved (bench/README.md, issue 13):

    python -m bench.pg_write_ab postgresql://HOST:PORT/DB OLD_TREE NEW_TREE [--rounds 2] [--facts 60]
                                [--writers 1,4] [--modes own,shared] [--template muninn_bench_10000]

Each tree is a checkout of this repository (`git archive COMMIT | tar -x -C DIR`): its
bench/pg_write_profile.py `run()` profiles the writers (1 or 4 processes, `fact_store.store_facts`,
the embed server answering at once: the database path alone) on a fresh copy of the template
world, in a process started in that tree, so each side runs its own code. Runs alternate old,
new, new, old, ... per (mode, writers); prints facts/s, CPU per fact (writer, server) and the
round trips of planning and of the write, per run and as the two sides' medians.
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


def profile_in(tree: str, url: str, facts: int, mode: str, writers: int) -> dict:
    code = ("import json; from bench.pg_write_profile import run; "
            f"print('JSON', json.dumps(run({url!r}, {facts}, {mode!r}, {writers}, False)))")
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
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    trees = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    results: list[dict] = []
    for mode in args.modes.split(","):
        for writers in [int(w) for w in args.writers.split(",")]:
            for round_number in range(args.rounds):
                for side in (("old", "new") if round_number % 2 == 0 else ("new", "old")):
                    url = create_database(args.server, f"{args.template}_ab", template=args.template)
                    out = profile_in(trees[side], url, args.facts, mode, writers)
                    row = {"side": side, "mode": mode, "writers": writers, "round": round_number + 1,
                           **{key: out.get(key) for key in FIELDS}}
                    results.append(row)
                    print("  " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    print("\n| keys | writers | side | facts/s per run | writer CPU ms | server CPU ms | plan round trips | "
          "write round trips | lock held ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        for writers in [int(w) for w in args.writers.split(",")]:
            for side in ("old", "new"):
                rows = [r for r in results if r["mode"] == mode and r["writers"] == writers and r["side"] == side]
                med = {key: statistics.median(float(r[key] or 0) for r in rows) for key in FIELDS}
                print(f"| {mode} | {writers} | {side} | {' / '.join(str(r['facts_per_s']) for r in rows)} | "
                      f"{med['client_cpu_ms']:.2f} | {med['server_cpu_ms']:.2f} | {med['plan_trips']:.2f} | "
                      f"{med['write_trips']:.2f} | {med['lock_held']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
