"""Spread over sessions: a patch for measuring whether recall's top list should hold fewer memories of one sitting.

    .venv/bin/python -m bench.quality --protocols +1d --worlds '' --spread 2:21600
    .venv/bin/python -m bench.spread --grid 0,1,2,4 --window 21600   # both sets, SQLite or --database-url

Evidence spread over sessions (BEAM's multi-session reasoning and event ordering) loses top-10
places to runs of memories from one sitting (the neighbour loan lifts them together). `install`
re-orders the final list, best first, as maximal marginal relevance over time: each next place
goes to the candidate whose place, pushed down `penalty` places for each memory already placed
that was stored within `window` seconds of it, is best (the first `depth` candidates; the rest
follow as they were). Nothing of it is in the product: a patch of newer.newer_first's output
(the last step before the cut) for one run (bench/patches.py) (docs/performance.md, "A per-question vector share").
"""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from . import beam, quality
from .embed_server import EmbedServerProcess
from .patches import install_spread


async def ask(corpora: dict[str, quality.Corpus], grid: list[float], window: float, url: str, env: dict,
              database_url: str | None) -> dict:
    import tempfile
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, corpus in corpora.items():
            template = Path(tmp) / f"{name}.db"
            place = quality.postgres_place(database_url, f"spread_{name}")
            await quality.import_all(corpus, template, url, env | place)
            out[name] = {}
            for i, penalty in enumerate(grid):
                install_spread(f"{penalty}:{window}")
                path = Path(tmp) / f"{name}-{i}.db"
                if database_url:
                    place = quality.postgres_place(database_url, f"spread_{name}_{i}", f"spread_{name}")
                else:
                    quality.copy_database(template, path)
                rows = await quality.ask_engine(corpus, path, env | place, "hybrid", url, 1.0, True, 10)
                out[name][str(penalty)] = quality.by_group(rows[:len(corpus.asks)], corpus.groups)
                path.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="spread over sessions in recall's top list, measured")
    parser.add_argument("--grid", default="0,1,2,4")
    parser.add_argument("--window", type=float, default=21600.0, help="seconds: memories this close count as one sitting")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--out", default=str(quality.RESULTS / "spread.json"))
    args = parser.parse_args(argv)
    corpora = {"locomo": quality.Corpus(json.loads(Path(quality.DATA).read_text())),
               "beam": quality.Corpus.beam(beam.folder(None))}
    env = dict(quality.ENGINE_ENV)
    with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
        found = asyncio.run(ask(corpora, [float(x) for x in args.grid.split(",")], args.window, url, env,
                                args.database_url))
    Path(args.out).write_text(json.dumps(found, indent=1))
    for name, by in found.items():
        for penalty, groups in by.items():
            print(f"{name} penalty {penalty}: " + "  ".join(
                f"{g} {v['r10']:.3f}/{v['mrr']:.3f}" for g, v in groups.items() if v))


if __name__ == "__main__":
    main()
