"""Retrieval quality on the LoCoMo development split.

    .venv/bin/python -m bench.quality

Each conversation's turns become one user's personal memories ("Speaker: utterance",
stamped with the session date), written through the `muninn import` code (bot/importer.py,
which embeds and stores through `Engine.remember_many`) with embeddings
from the product's `OllamaClient` talking to `bench.embed_server` (all-MiniLM-L6-v2).
Each question is asked through `Engine.recall` as that user (touch=False, so asking
does not change the ranking of later questions). Reports R@5, R@10, All@10 and MRR
overall (categories 1-4) and per category, adversarial (5) apart, for FTS-only,
vector-only and hybrid. Prints a table and saves JSON to bench/results/.

The three modes run through the same engine and settings, changing only what a user
could change: FTS-only = OLLAMA_URL empty; vector-only = MUNINN_RRF_WEIGHT_FTS=0.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bot.cli import importer
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.settings import SETTINGS, load_settings

from .embed_server import MINILM_NAME, EmbedServerProcess

DATA = Path(__file__).resolve().parents[2] / "shared" / "eval" / "locomo-dev" / "locomo-dev.json"
RESULTS = Path(__file__).resolve().parent / "results"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
DIA_ID = re.compile(r"D\d+:\d+")
MODES = ("fts", "vector", "hybrid")


def session_time(text: str) -> float:
    """'1:56 pm on 8 May, 2023' -> unix seconds (UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc).timestamp()


def import_records(conv: dict, owner_id: int) -> list[dict]:
    """The conversation as `muninn import` JSON records, one per turn, in order."""
    c = conv["conversation"]
    sessions = sorted((int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k)))
    out = []
    for n in sessions:
        when = session_time(c[f"session_{n}_date_time"])
        for i, turn in enumerate(c[f"session_{n}"]):
            out.append({"text": f"{turn['speaker']}: {turn['text']}", "scope": "personal", "user_id": owner_id,
                        "created_at": when + i, "external_id": f"{conv['sample_id']}:{turn['dia_id']}"})
    return out


def questions(conv: dict, known: set[str]) -> list[dict]:
    out = []
    for qa in conv["qa"]:
        evidence = {f"{conv['sample_id']}:{d}" for e in qa.get("evidence", []) for d in DIA_ID.findall(str(e))}
        evidence &= known
        if evidence:
            out.append({"question": qa["question"], "category": qa["category"], "evidence": evidence})
    return out


def score(ranked: list[str], evidence: set[str]) -> dict:
    hits5 = len(evidence & set(ranked[:5]))
    hits10 = len(evidence & set(ranked[:10]))
    first = next((i for i, eid in enumerate(ranked[:10], start=1) if eid in evidence), None)
    return {"r5": hits5 / len(evidence), "r10": hits10 / len(evidence), "all10": float(hits10 == len(evidence)),
            "mrr": 1.0 / first if first else 0.0}


def aggregate(rows: list[dict]) -> dict:
    if not rows:
        return {}
    return {m: round(sum(r[m] for r in rows) / len(rows), 4) for m in ("r5", "r10", "all10", "mrr")} | {
        "n": len(rows)}


def mode_settings(base: dict, mode: str, url: str):
    env = dict(base)
    if mode == "fts":
        env["OLLAMA_URL"] = ""
    else:
        env["OLLAMA_URL"] = url
    if mode == "vector":
        env["MUNINN_RRF_WEIGHT_FTS"] = "0"
    return load_settings(env)


async def evaluate(data: list[dict], url: str, env: dict, modes: tuple[str, ...], limit: int) -> dict:
    owners = {conv["sample_id"]: i + 1 for i, conv in enumerate(data)}
    asks: list[dict] = []
    async with Engine(load_settings(dict(env, OLLAMA_URL=url))) as engine:
        for conv in data:
            records = import_records(conv, owners[conv["sample_id"]])
            report = await importer.import_lines(engine, [json.dumps(r) for r in records])
            if report.errors or report.imported != len(records):
                raise RuntimeError(f"import of {conv['sample_id']} failed: {report}")
            known = {r["external_id"] for r in records}
            for q in questions(conv, known):
                asks.append(q | {"owner": owners[conv["sample_id"]]})
        missing = (await engine.stats())["missing_vectors"]
        if missing:
            raise RuntimeError(f"{missing} memories have no vector: is the embed server answering?")
    results: dict = {}
    per_question: dict = {}
    for mode in modes:
        async with Engine(mode_settings(env, mode, url)) as engine:
            rows = []
            for q in asks:
                result = await engine.recall(q["question"], Viewer(q["owner"], dm=True), limit=limit, touch=False)
                expected_mode = {"fts": "fts-only", "vector": "hybrid", "hybrid": "hybrid"}[mode]
                if result.mode not in (expected_mode, "vector-only") or (mode != "fts" and result.vector_status != "ok"):
                    raise RuntimeError(f"{mode}: recall ran as {result.mode}/{result.vector_status}")
                ranked = [r.memory.external_id for r in result.memories if r.candidate.link is None]
                rows.append(score(ranked, q["evidence"]) | {"category": q["category"]})
            per_question[mode] = rows
            out = {"overall": aggregate([r for r in rows if r["category"] != 5])}
            for cat, name in CATEGORIES.items():
                out[name] = aggregate([r for r in rows if r["category"] == cat])
            results[mode] = out
    return results


def print_table(results: dict) -> None:
    groups = ["overall", "single-hop", "multi-hop", "temporal", "open-domain", "adversarial"]
    print(f"\n{'mode':<8} {'group':<12} {'n':>4} {'R@5':>6} {'R@10':>6} {'All@10':>7} {'MRR':>6}")
    for group in groups:
        for mode, out in results.items():
            a = out.get(group)
            if a:
                print(f"{mode:<8} {group:<12} {a['n']:>4} {a['r5']:>6.3f} {a['r10']:>6.3f} {a['all10']:>7.3f} "
                      f"{a['mrr']:>6.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Muninn retrieval quality on LoCoMo (dev split)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--conversations", type=int, default=0, help="use only the first N (0 = all)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--set", action="append", default=[], metavar="ENV=VALUE",
                        help="a setting for this run, e.g. --set MUNINN_RRF_K=20 (repeatable)")
    parser.add_argument("--url", default=None, help="an Ollama-compatible server to use instead of starting one")
    parser.add_argument("--label", default="quality")
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/<label>.json)")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    if args.conversations:
        data = data[: args.conversations]
    overrides = dict(item.split("=", 1) for item in args.set)
    known_env = {spec.env for spec in SETTINGS.values()}
    for name in overrides:
        if name not in known_env:
            parser.error(f"unknown setting {name}")
    modes = tuple(m for m in args.modes.split(",") if m)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"MUNINN_DB_PATH": str(Path(tmp) / "locomo.db"), "OLLAMA_EMBED_MODEL": MINILM_NAME,
               "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "60", "MUNINN_GRAPH_LIMIT": "0"} | overrides
        if args.url:
            results = asyncio.run(evaluate(data, args.url, env, modes, 10))
        else:
            with EmbedServerProcess("minilm") as url:
                results = asyncio.run(evaluate(data, url, env, modes, 10))
    print_table(results)
    out = Path(args.out) if args.out else RESULTS / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": overrides, "conversations": len(data), "results": results,
                               "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    print(f"saved {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
