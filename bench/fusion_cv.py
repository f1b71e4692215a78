"""Choosing the fusion's parameters and the relevance floor by cross-validation, never on one data set.

    .venv/bin/python -m bench.fusion_cv --url http://127.0.0.1:11435     # an embed server already running
    .venv/bin/python -m bench.fusion_cv --grid 'MUNINN_FUSION_VECTOR_SHARE=0.4,0.5,0.6;MUNINN_KEYWORD_LEAD=0,1.1'

Imports the LoCoMo dev split and BEAM's development chats once each (bench/quality.py's
protocol: `muninn import` with the real dates, asked the day after through `Engine.recall`
with touch on), then asks every question once per setting of the grid (hybrid mode). Each
conversation's score is (R@10 + MRR) / 2 over its questions with evidence; a setting's score
on a set of conversations is the mean over data sets of the mean over their conversations
(each data set counts the same, however many conversations it has).

- Leave one conversation out: for each conversation, the setting best on all the others,
  scored on the one left out.
- Leave one data set out: the setting best on the other data set, scored on the one left out.
- The setting best on everything, which the defaults should be when the held-out scores
  agree with it.

Then the relevance floor (MUNINN_INJECT_MIN_COSINE) for the chosen setting: for each floor, the
share of questions without evidence (BEAM's abstention questions, and each data set's
conversations asked the other data set's questions) that would get no memory injected, and
the R@10 lost on questions with evidence, per data set and left out one data set at a time.
Prints tables and saves JSON to bench/results/fusion-cv.json.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import json
import tempfile
import time
from pathlib import Path

from . import beam, quality
from .embed_server import EmbedServerProcess

DEFAULT_GRID = ("MUNINN_FUSION_VECTOR_SHARE=0.5,0.6;@fusion.AGREEMENT=0,2,4;@fusion.RANK_SHARE=0,0.15,0.3,0.5;"
                "MUNINN_KEYWORD_LEAD=0,1.1|MUNINN_FUSION=ranks")
FLOORS = tuple(round(0.05 * i, 2) for i in range(2, 13))


def grid(spec: str) -> list[dict[str, str]]:
    """'A=1,2;B=x' -> [{A: 1, B: x}, {A: 2, B: x}]; grids joined by '|' one after the other."""
    if "|" in spec:
        return [setting for part in spec.split("|") for setting in grid(part)]
    axes = [(name, values.split(",")) for name, values in (part.split("=", 1) for part in spec.split(";") if part)]
    return [dict(zip([a for a, _ in axes], combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]


def conversation_scores(rows: list[dict], asks: list[dict]) -> dict[str, float]:
    """(R@10 + MRR) / 2 per conversation, over its questions with evidence (LoCoMo's adversarial apart)."""
    by: dict[str, list[float]] = {}
    for row, q in zip(rows, asks, strict=False):  # the evidence questions come first
        if "injected" in row or row["category"] == 5:
            continue
        by.setdefault(q["conversation"], []).append((row["r10"] + row["mrr"]) / 2)
    return {sid: sum(v) / len(v) for sid, v in by.items()}


def objective(scores: dict[str, float], dataset_of: dict[str, str], keep) -> float:
    """Mean over data sets of the mean over their conversations that `keep` takes."""
    sets: dict[str, list[float]] = {}
    for sid, value in scores.items():
        if keep(sid):
            sets.setdefault(dataset_of[sid], []).append(value)
    return sum(sum(v) / len(v) for v in sets.values()) / len(sets) if sets else 0.0


def cross_validate(per_setting: list[dict[str, float]], dataset_of: dict[str, str]) -> dict:
    """Leave-one-conversation-out and leave-one-dataset-out choices, with their held-out scores."""
    def best(keep) -> int:
        return max(range(len(per_setting)), key=lambda i: objective(per_setting[i], dataset_of, keep))
    loco = {}
    for sid in dataset_of:
        chosen = best(lambda s, sid=sid: s != sid)
        loco[sid] = {"chosen": chosen, "held_out": round(per_setting[chosen][sid], 4),
                     "best_possible": round(max(p[sid] for p in per_setting), 4)}
    lodo = {}
    for name in set(dataset_of.values()):
        chosen = best(lambda s, name=name: dataset_of[s] != name)
        lodo[name] = {"chosen": chosen,
                      "held_out": round(objective(per_setting[chosen], dataset_of, lambda s, n=name: dataset_of[s] == n), 4)}
    overall = best(lambda s: True)
    return {"leave_one_conversation_out": loco, "leave_one_dataset_out": lodo, "chosen_on_all": overall}


def floor_table(rows: dict[str, list[dict]], limit: int = 5) -> dict:
    """Per data set and floor: the share of questions without evidence left with nothing to inject,
    and the R@10 of questions with evidence once what is under the floor is dropped (and its loss)."""
    out: dict = {}
    for name, found in rows.items():
        asked = [r for r in found if "injected" not in r and r["category"] != 5]
        absent = [r for r in found if "injected" in r]
        base = sum(r["r10"] for r in asked) / len(asked)
        out[name] = {}
        for floor in FLOORS:
            none = [all(c is not None and c < floor for c in r["cosines"][:limit]) for r in absent]
            kept = [quality.score([t for t, c in zip(r["ranked"], r["cosines"], strict=True) if c is None or c >= floor],
                                  set(r["evidence"]))["r10"] for r in asked]
            kinds = {k: [n for n, r in zip(none, absent, strict=True) if r["category"] == k]
                     for k in dict.fromkeys(r["category"] for r in absent)}
            out[name][str(floor)] = {"none_injected": {k: round(sum(v) / len(v), 4) for k, v in kinds.items()},
                                     "r10": round(sum(kept) / len(kept), 4),
                                     "r10_lost": round(base - sum(kept) / len(kept), 4)}
    return out


def constant_module(name: str):
    """The module of bot/memory/recall/ that an '@module.NAME' grid axis sets."""
    return importlib.import_module(f"bot.memory.recall.{name[1:].split('.')[0]}")


def constant_defaults(settings: list[dict[str, str]]) -> dict:
    """The current value of every '@module.NAME' constant that some setting of the grid sets."""
    return {name: getattr(constant_module(name), name.split(".")[1])
            for setting in settings for name in setting if name.startswith("@")}


def apply_constants(setting: dict[str, str], defaults: dict) -> None:
    """Every constant of the grid back to its default, then this setting's '@module.NAME' values."""
    for name, value in defaults.items():
        setattr(constant_module(name), name.split(".")[1], value)
    for name, value in setting.items():
        if name.startswith("@"):
            setattr(constant_module(name), name.split(".")[1], type(defaults[name])(value))


async def run(corpora: dict[str, quality.Corpus], settings: list[dict[str, str]], url: str, base_env: dict) -> dict:
    results: dict = {"settings": settings, "rows": {name: [] for name in corpora}}
    with tempfile.TemporaryDirectory() as tmp:
        templates = {}
        for name, corpus in corpora.items():
            templates[name] = Path(tmp) / f"{name}.db"
            await quality.import_all(corpus, templates[name], url, base_env)
        # '@module.NAME': a constant of bot/memory/recall/<module>.py; each setting starts from the
        # defaults (a grid joined by '|' must not inherit a constant the part before it set)
        defaults = constant_defaults(settings)
        for i, setting in enumerate(settings):
            started = time.perf_counter()
            apply_constants(setting, defaults)
            env_setting = {k: v for k, v in setting.items() if not k.startswith("@")}
            for name, corpus in corpora.items():
                path = Path(tmp) / f"{name}-{i}.db"
                quality.copy_database(templates[name], path)
                rows = await quality.ask_engine(corpus, path, base_env | env_setting, "hybrid", url, 1.0, True, 10)
                results["rows"][name].append(rows)
                path.unlink()
            print(f"{i + 1}/{len(settings)} {setting} {time.perf_counter() - started:.0f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the fusion's parameters and the floor, cross-validated")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--grid", default=DEFAULT_GRID, help="NAME=v1,v2;NAME=... (every combination)")
    parser.add_argument("--foreign", type=int, default=20)
    parser.add_argument("--url", default=None)
    parser.add_argument("--rows", default=None, help="also save the chosen setting's rows (JSON) here")
    parser.add_argument("--out", default=str(quality.RESULTS / "fusion-cv.json"))
    args = parser.parse_args(argv)
    locomo = quality.Corpus(json.loads(Path(args.data).read_text()))
    beam_corpus = quality.Corpus.beam(beam.folder(args.beam))
    locomo.foreign(beam_corpus, args.foreign)
    beam_corpus.foreign(quality.Corpus(json.loads(Path(args.data).read_text())), args.foreign)
    corpora = {"locomo": locomo, "beam": beam_corpus}
    settings = grid(args.grid)
    env = quality.ENGINE_ENV | {"MUNINN_INJECT_MIN_COSINE": "-1"}
    if args.url:
        found = asyncio.run(run(corpora, settings, args.url, env))
    else:
        with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
            found = asyncio.run(run(corpora, settings, url, env))
    dataset_of = {sid: name for name, corpus in corpora.items() for sid in corpus.records}
    per_setting = []
    for i in range(len(settings)):
        scores: dict[str, float] = {}
        for name, corpus in corpora.items():
            scores |= conversation_scores(found["rows"][name][i], corpus.asks)
        per_setting.append(scores)
    cv = cross_validate(per_setting, dataset_of)
    print("\nsetting: objective on all / LoCoMo / BEAM")
    for i, setting in enumerate(settings):
        print(f"{i:>2} {setting}  {objective(per_setting[i], dataset_of, lambda s: True):.4f}  "
              + "  ".join(f"{objective(per_setting[i], dataset_of, lambda s, n=n: dataset_of[s] == n):.4f}"
                          for n in corpora))
    print("\nleave one conversation out:", json.dumps(cv["leave_one_conversation_out"]))
    print("leave one data set out:", json.dumps(cv["leave_one_dataset_out"]))
    chosen = cv["chosen_on_all"]
    print("chosen on all:", chosen, settings[chosen])
    floors = floor_table({name: found["rows"][name][chosen] for name in corpora})
    print("\nfloor: share of no-evidence questions with nothing injected; R@10 lost")
    for name, table in floors.items():
        for floor, cell in table.items():
            print(f"{name:<7} {floor:>5} {json.dumps(cell['none_injected'])}  "
                  f"R@10 {cell['r10']:.4f} lost {cell['r10_lost']:+.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"settings": settings, "per_setting": per_setting, "cv": cv,
                                          "floors": floors}, indent=1))
    if args.rows:
        Path(args.rows).write_text(json.dumps({name: rows[chosen] for name, rows in found["rows"].items()}))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
