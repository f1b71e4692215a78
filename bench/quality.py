"""Retrieval quality on the LoCoMo development split, asked the way the bot asks.

    .venv/bin/python -m bench.quality

Each conversation's turns become one user's personal memories ("Speaker: utterance",
stamped with the session's real date + turn index seconds), written through the
`muninn import` code (bot/cli/importer.py: embeds and stores through
`Engine.remember_many`) with embeddings from the product's `OllamaClient` talking to
`bench.embed_server` (all-MiniLM-L6-v2; vectors cached on disk in bench/results/).

Each question is asked through `Engine.recall` as that user, in question order, with
touch on (as in the bot: what is recalled is strengthened, which changes later
rankings), at `as_of` = the day after the conversation's last session, and again at
+30 days, +365 days and with no `as_of` (now), each from a fresh copy of the imported
database. Modes, through the same engine: FTS-only (OLLAMA_URL empty), vector-only
(MUNINN_RRF_WEIGHT_FTS=0), hybrid (defaults); plus `bm25`, plain porter BM25 over the
same turns (an FTS5 table of its own, no decay, no touch) as the baseline to beat.
Reports R@5, R@10, All@10 and MRR overall (categories 1-4) and per category,
adversarial (5) apart, R@10 by the age of the evidence, and the cosine of recalled
memories (evidence or not) for choosing the touch floor. Prints tables, saves JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bot.cli import importer
from bot.memory.engine import Engine
from bot.memory.recall import ranking
from bot.memory.records import clean_text
from bot.memory.scope import Viewer
from bot.settings import SETTINGS, load_settings

from . import beam, shared_world
from .bm25 import Bm25Index
from .embed_server import MINILM_NAME, EmbedServerProcess
from .shared_world import WorldSpec

DATA = Path(__file__).resolve().parents[2] / "shared" / "eval" / "locomo-dev" / "locomo-dev.json"
RESULTS = Path(__file__).resolve().parent / "results"  # git-ignored: the embedding cache and the JSON; made on demand
# The last full run (every mode, protocol and world), kept to compare a new run with: bench/README.md.
REFERENCE = Path(__file__).resolve().parent / "reference" / "quality.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
DIA_ID = re.compile(r"D\d+:\d+")
MODES = ("bm25", "cosine", "fts", "vector", "hybrid")
ENGINE_MODES = ("fts", "vector", "hybrid")
DAY = 86400.0
PROTOCOLS: dict[str, float | None] = {"+1d": 1.0, "+30d": 30.0, "+365d": 365.0, "none": None}
# The hard protocols (bench/shared_world.py): all conversations in one database with a busy
# room and other people's memories. The crowded ones add CROWD copies of every conversation
# as other users' newer memories (~100k memories in all) and are asked now, as the product
# asks: compared with the same world uncrowded, asked now.
CROWD = 66
WORLDS: dict[str, WorldSpec] = {
    "shared-dm": WorldSpec("dm"), "shared-room": WorldSpec("room"),
    "shared-room-names": WorldSpec("room", same_names=True),
    "shared-dm-now": WorldSpec("dm", days_after=None),
    "crowded-dm-now": WorldSpec("dm", crowd=CROWD, days_after=None)}
AGE_BUCKETS = ((0, 14, "<=14d"), (14, 60, "15-60d"), (60, 10**9, ">60d"))
GROUPS = ("overall", "single-hop", "multi-hop", "temporal", "open-domain", "adversarial")
EMBED_CACHE = RESULTS / "embeddings-minilm.npz"


def session_time(text: str) -> float:
    """'1:56 pm on 8 May, 2023' -> unix seconds (UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def import_records(conv: dict, owner_id: int) -> list[dict]:
    """The conversation as `muninn import` JSON records, one per turn, in order."""
    c = conv["conversation"]
    sessions = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k))
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


def turns(ranked: list[str]) -> list[str]:
    """External ids as the turns they belong to (a long BEAM message is stored in parts), first seen first."""
    return list(dict.fromkeys(beam.turn_of(eid) for eid in ranked))


def score(ranked: list[str], evidence: set[str]) -> dict:
    hits5 = len(evidence & set(ranked[:5]))
    hits10 = len(evidence & set(ranked[:10]))
    first = next((i for i, eid in enumerate(ranked[:10], start=1) if eid in evidence), None)
    return {"r5": hits5 / len(evidence), "r10": hits10 / len(evidence), "all10": float(hits10 == len(evidence)),
            "mrr": 1.0 / first if first else 0.0}


def aggregate(rows: list[dict]) -> dict:
    if not rows:
        return {}
    metrics = ("r5", "r10", "all10", "mrr") + (("r10_floor",) if "r10_floor" in rows[0] else ())
    return {m: round(sum(r[m] for r in rows) / len(rows), 4) for m in metrics} | {"n": len(rows)}


def by_group(rows: list[dict], groups: dict | None = None) -> dict:
    """Scores overall (every category but LoCoMo's adversarial) and per category."""
    out = {"overall": aggregate([r for r in rows if r["category"] != 5])}
    for cat, name in (CATEGORIES if groups is None else groups).items():
        out[name] = aggregate([r for r in rows if r["category"] == cat])
    return out


def update_order(rows: list[dict]) -> dict:
    """Knowledge-update questions where both the original and the updated turn are in the top
    10: the share with the updated one ranked above the original."""
    both = above = 0
    for row in rows:
        if not row.get("updated") or not row.get("original"):
            continue
        top = row["ranked"][:10]
        first = {kind: min((top.index(e) for e in row[kind] if e in top), default=None) for kind in ("original", "updated")}
        if first["original"] is not None and first["updated"] is not None:
            both += 1
            above += first["updated"] < first["original"]
    return {"updated_first": round(above / both, 4) if both else None, "both_found": both,
            "questions": sum(1 for r in rows if r.get("updated"))}


def abstention(rows: list[dict]) -> dict:
    """Questions without evidence: the share that would get no memory injected into the prompt
    (nothing above the relevance floor among the memories the bot injects)."""
    if not rows:
        return {}
    return {"none_injected": round(sum(r["injected"] == 0 for r in rows) / len(rows), 4),
            "mean_injected": round(sum(r["injected"] for r in rows) / len(rows), 3), "n": len(rows)}


ABSTAIN_SHARE = 0.5  # the goal: questions without evidence that get nothing


def abstention_frontier(asked: list[dict], absent: list[dict], share: float = ABSTAIN_SHARE) -> dict:
    """What a floor on each question's recalled cosines would cost, per kind of question without
    evidence: the floor at which `share` of that kind get nothing (on the best cosine, and on the
    mean of the best three), and on the questions with evidence the share it empties and the
    R@10 it loses. A floor that honest recall could use must empty few evidence questions."""
    def signals(cosines: list) -> dict[str, float]:
        known = sorted((c for c in cosines if c is not None), reverse=True) or [0.0]
        return {"best": known[0], "top3": float(np.mean(known[:3]))}
    evidence = [(signals(r["cosines"]), r["r10"]) for r in asked if r["category"] != 5]
    out: dict = {}
    for kind in dict.fromkeys(r["category"] for r in absent):
        mine = [signals(r["cosines"]) for r in absent if r["category"] == kind]
        if not mine or not evidence:
            continue
        out[kind] = {}
        for name in ("best", "top3"):
            values = sorted(s[name] for s in mine)
            floor = values[max(0, int(np.ceil(share * len(values))) - 1)]  # at or under it: nothing injected
            emptied = [r10 for s, r10 in evidence if s[name] <= floor]
            out[kind][name] = {"floor": round(floor, 4), "evidence_emptied": round(len(emptied) / len(evidence), 4),
                               "r10_lost": round(sum(emptied) / len(evidence), 4)}
    return out


def mode_settings(base: dict, mode: str, url: str):
    env = dict(base)
    env["OLLAMA_URL"] = "" if mode == "fts" else url
    if mode == "vector":  # the keyword path without weight, in either fusion
        env["MUNINN_RRF_WEIGHT_FTS"], env["MUNINN_FUSION_VECTOR_SHARE"] = "0", "1"
    return load_settings(env)


class Corpus:
    """One data set as imported: records, questions in order (with evidence), the questions
    without evidence (`absent`), each conversation's owner and last session. `Corpus(data)`
    is the LoCoMo dev split; `Corpus.beam(folder)` BEAM's chats (bench/beam.py)."""

    def __init__(self, data: list[dict], name: str = "locomo"):
        self.name = name
        self.groups: dict = dict(CATEGORIES)
        self.records: dict[str, list[dict]] = {}
        self.asks: list[dict] = []
        self.absent: list[dict] = []
        self.created: dict[str, float] = {}
        self.conversations: list[dict] = []
        for i, conv in enumerate(data):
            sid = conv["sample_id"]
            records = import_records(conv, i + 1)
            self.conversations.append({"sid": sid, "owner": i + 1, "speakers": (
                conv["conversation"]["speaker_a"], conv["conversation"]["speaker_b"])})
            self.add(sid, i + 1, records, questions(conv, {r["external_id"] for r in records}))

    def add(self, sid: str, owner: int, records: list[dict], asks: list[dict]) -> None:
        """One conversation: its records and its questions (those without evidence go to `absent`)."""
        self.records[sid] = records
        self.created.update((beam.turn_of(r["external_id"]), r["created_at"]) for r in records)
        last = max(r["created_at"] for r in records)
        for q in asks:
            (self.asks if q["evidence"] else self.absent).append(
                q | {"owner": owner, "conversation": sid, "last_session": last})

    @classmethod
    def beam(cls, path: Path, limit: int = 0) -> Corpus:
        """BEAM's chats under `path` (bench/beam.py), owners 1, 2, ... in chat order."""
        corpus = cls([], "beam")
        for i, chat in enumerate(beam.chats(path, limit)):
            sid, records, asks = beam.load(chat, i + 1)
            corpus.add(sid, i + 1, records, asks)
        corpus.groups = {name: name for name in dict.fromkeys(q["category"] for q in corpus.asks)}
        return corpus

    def foreign(self, other: Corpus, per_conversation: int) -> None:
        """Add `per_conversation` of the other data set's questions to each conversation's questions
        without evidence: asked where that was never discussed (spread evenly over its questions)."""
        pool = [q["question"] for q in other.asks]
        if not pool:
            return
        for n, sid in enumerate(self.records):
            owner = next(q["owner"] for q in self.asks + self.absent if q["conversation"] == sid)
            last = max(r["created_at"] for r in self.records[sid])
            step = max(1, len(pool) // per_conversation)
            picked = [pool[(n + i * step) % len(pool)] for i in range(per_conversation)]
            self.absent += [{"question": q, "category": "foreign", "evidence": set(), "owner": owner,
                             "conversation": sid, "last_session": last} for q in picked]


def as_of_for(ask: dict, days_after: float | None) -> float | None:
    """The day after the conversation's last session (+ more days), or None = now."""
    return None if days_after is None else ask["last_session"] + days_after * DAY


async def import_all(corpus: Corpus, path: Path, url: str, env: dict) -> None:
    await import_groups(corpus.records, path, url, env)


async def import_groups(groups: dict[str, list[dict]], path: Path, url: str, env: dict, *, warm: bool = True) -> None:
    """Import each group of records through the product's importer; every record must land, with its vector."""
    async with Engine(load_settings(dict(env, MUNINN_DB_PATH=str(path), OLLAMA_URL=url)), warm=warm) as engine:
        for name, records in groups.items():
            report = await importer.import_lines(engine, [json.dumps(r) for r in records])
            if report.errors or report.imported != len(records):
                raise RuntimeError(f"import of {name} failed: {report}")
        missing = (await engine.stats())["missing_vectors"]
        if missing:
            raise RuntimeError(f"{missing} memories have no vector: is the embed server answering?")


# The engine's settings in every quality run: MiniLM from the local embed server (bench/embed_server.py),
# no cool-down after a failed call, a minute for an embedding, and no graph links in the top list
# (the data sets score ranked turns; linked memories would take their places).
ENGINE_ENV = {"OLLAMA_EMBED_MODEL": MINILM_NAME, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "60",
              "MUNINN_GRAPH_LIMIT": "0"}


def set_constants(pairs: dict[str, str]) -> dict[str, str]:
    """Apply the '@module.NAME' pairs to bot/memory/recall/<module>.py (each value cast to the
    constant's type); the settings that remain."""
    env = {}
    for name, value in pairs.items():
        if name.startswith("@"):
            module, attr = name[1:].split(".")
            target = importlib.import_module(f"bot.memory.recall.{module}")
            setattr(target, attr, type(getattr(target, attr))(value))
        else:
            env[name] = value
    return env


def postgres_place(server_url: str | None, name: str, template: str | None = None) -> dict[str, str]:
    """The setting that puts an engine on a new PostgreSQL database `name` (a copy of `template`)
    on the server of `server_url`; nothing (SQLite) without a server."""
    if not server_url:
        return {}
    from .pg_speed import create_database
    return {"MUNINN_DATABASE_URL": create_database(server_url, name, template)}


def copy_database(template: Path, target: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        source = Path(str(template) + suffix)
        if source.exists():
            shutil.copyfile(source, str(target) + suffix)


async def ask_engine(corpus: Corpus, path: Path, env: dict, mode: str, url: str, days_after: float | None,
                     touch: bool, limit: int, view: str | None = None) -> list[dict]:
    """Every question in order through `Engine.recall`; one row per question. `view` (the
    shared world's 'dm' or 'room'): ask there and fail on any memory the asker may not see.
    Then the questions without evidence (touch off: they never change what later questions
    find), rows with `injected`: how many memories would reach the prompt past the floor."""
    rows = []
    async with Engine(mode_settings(dict(env, MUNINN_DB_PATH=str(path)), mode, url)) as engine:
        for q in corpus.asks + corpus.absent:
            as_of = as_of_for(q, days_after)
            viewer = Viewer(q["owner"], dm=True) if view is None else shared_world.viewer_for(q["owner"], view)
            result = await engine.recall(q["question"], viewer, limit=limit, as_of=as_of,
                                         touch=touch and bool(q["evidence"]))
            if view is not None:
                shared_world.check_scope([r.memory for r in result.memories], viewer, q["question"])
            expected_mode = {"fts": "fts-only", "vector": "hybrid", "hybrid": "hybrid"}[mode]
            if result.mode not in (expected_mode, "vector-only") or (mode != "fts" and result.vector_status != "ok"):
                raise RuntimeError(f"{mode}: recall ran as {result.mode}/{result.vector_status}")
            chosen = [r for r in result.memories if r.candidate.link is None]
            kept = {id(r) for r in result.relevant()}
            if not q["evidence"]:  # what the bot injects: its recall limit's worth, past the floor
                top = chosen[:engine.settings.recall_limit]
                rows.append({"category": q["category"], "injected": sum(id(r) in kept for r in top),
                             "cosines": [r.candidate.cosine for r in top]})
                continue
            first: dict[str, float | None] = {}  # each turn once, with its best-ranked part's cosine
            for r in chosen:
                first.setdefault(beam.turn_of(r.memory.external_id or ""), r.candidate.cosine)
            ranked, cosines = list(first), list(first.values())
            floored = turns([r.memory.external_id for r in chosen if id(r) in kept])
            rows.append(score(ranked, q["evidence"]) | {
                "r10_floor": score(floored, q["evidence"])["r10"],
                "category": q["category"], "ranked": ranked, "evidence": sorted(q["evidence"]),
                "cosines": cosines, "as_of": as_of if as_of is not None else time.time()}
                | {k: sorted(q[k]) for k in ("original", "updated") if k in q})
    return rows


def baseline_row(q: dict, ranked: list[str], days_after: float | None = 1.0) -> dict:
    """A baseline's row (no touch, no floor: it injects what it ranks)."""
    return score(ranked, q["evidence"]) | {"category": q["category"], "ranked": ranked, "cosines": [],
                                           "evidence": sorted(q["evidence"]), "as_of": q["last_session"] + DAY} | {
        k: sorted(q[k]) for k in ("original", "updated") if k in q}


def ask_bm25(corpus: Corpus, limit: int) -> list[dict]:
    """Plain porter BM25 over the same turns (no decay, no scope machinery): the baseline."""
    index = Bm25Index((sid, r["external_id"], 0.0, r["text"]) for sid, records in corpus.records.items()
                      for r in records)
    rows = [baseline_row(q, turns(index.ask(q["question"], [q["conversation"]], limit * 3))[:limit])
            for q in corpus.asks]
    rows += [{"category": q["category"], "injected": len(index.ask(q["question"], [q["conversation"]], 5))}
             for q in corpus.absent]
    return rows


async def ask_cosine(corpus: Corpus, path: Path, url: str, env: dict, limit: int) -> list[dict]:
    """Plain cosine over the same turns' embeddings (no fusion, no neighbours, no time): the
    vector-only baseline; it always has something nearest, so it injects for every question."""
    vectors = await embed_corpus(corpus, path, url, env)
    rows = []
    for q, qv in zip(corpus.asks + corpus.absent, vectors["questions"], strict=True):
        ids, m = vectors["turns"][q["conversation"]]
        order = np.argsort(-(m @ qv), kind="stable")[: limit * 3]
        if q["evidence"]:
            rows.append(baseline_row(q, turns([ids[i] for i in order])[:limit]))
        else:
            rows.append({"category": q["category"], "injected": min(5, len(ids))})
    return rows


async def embed_corpus(corpus: Corpus, path: Path, url: str, env: dict) -> dict:
    """Unit vectors of every turn (by conversation: ids, matrix) and of every question (evidence first)."""
    async with Engine(load_settings(dict(env, MUNINN_DB_PATH=str(path), OLLAMA_URL=url))) as engine:
        out: dict = {"turns": {}}
        for sid, rows in corpus.records.items():
            m = np.asarray(await engine.embed_or_none([clean_text(r["text"]) for r in rows]), dtype=np.float32)
            out["turns"][sid] = ([r["external_id"] for r in rows], m / np.linalg.norm(m, axis=1, keepdims=True))
        qs = np.asarray(await engine.embed_or_none([q["question"] for q in corpus.asks + corpus.absent]),
                        dtype=np.float32)
        out["questions"] = qs / np.linalg.norm(qs, axis=1, keepdims=True)
    return out


def age_report(rows: list[dict], created: dict[str, float]) -> dict:
    """R@10 of evidence by its age at the time of asking, and the share of the top 10 from the last 14 days."""
    found: dict[str, list[int]] = {name: [0, 0] for _, _, name in AGE_BUCKETS}
    recent, shown = 0, 0
    for row in rows:
        if row["category"] == 5:
            continue
        top = set(row["ranked"][:10])
        for eid in row["evidence"]:
            age = (row["as_of"] - created[eid]) / DAY
            name = next(n for lo, hi, n in AGE_BUCKETS if lo <= age < hi)
            found[name][0] += eid in top
            found[name][1] += 1
        recent += sum(1 for eid in row["ranked"][:10] if (row["as_of"] - created[eid]) / DAY <= 14)
        shown += len(row["ranked"][:10])
    out = {name: {"r10": round(hit / n, 4) if n else None, "n": n} for name, (hit, n) in found.items()}
    out["top10_share_last_14d"] = round(recent / shown, 4) if shown else None
    return out


def cosine_report(rows: list[dict]) -> dict:
    """Percentiles of the cosine of recalled memories that are evidence and that are not, and
    the share of each that the touch rules (absolute floor, relative to the best) would touch."""
    evidence: list[float] = []
    other: list[float] = []
    relative: dict[str, list[float]] = {"evidence": [], "other": []}
    for row in rows:
        if row["category"] == 5:
            continue
        known = [c for c in row["cosines"] if c is not None]
        best = max(known, default=0.0)
        for eid, cos in zip(row["ranked"], row["cosines"], strict=False):  # BM25 rows have no cosines
            if cos is not None:
                kind = "evidence" if eid in row["evidence"] else "other"
                (evidence if kind == "evidence" else other).append(cos)
                relative[kind].append(cos / best if best > 0 else 0.0)
    out: dict = {}
    for name, values in (("evidence", evidence), ("other", other)):
        if values:
            out[name] = {f"p{p}": round(float(np.percentile(values, p)), 4) for p in (5, 10, 25, 50, 75, 90)}
            out[name]["n"] = len(values)
            out[name]["touched_by_floor"] = {str(f): round(float(np.mean(np.asarray(values) >= f)), 4) for f in FLOORS}
            ratios = np.asarray(relative[name])
            out[name]["touched_by_relative_rule"] = {str(r): round(float(np.mean(ratios >= r)), 4)
                                                     for r in RATIOS}
    return out


FLOORS = (0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
RATIOS = (0.5, 0.6, 0.7, ranking.RELATIVE_FLOOR)  # cosine / the best recalled cosine of the same question


def floor_report(corpus: Corpus, vectors: dict) -> dict:
    """For choosing the touch floor of this embedding model: the cosine between each question
    (with evidence; LoCoMo's adversarial apart) and its evidence turns versus every other turn
    of its conversation, and the share of each above candidate floors."""
    evidence: list[float] = []
    other: list[float] = []
    for q, qv in zip(corpus.asks, vectors["questions"], strict=False):  # the evidence questions come first
        if q["category"] == 5:
            continue
        ids, m = vectors["turns"][q["conversation"]]
        for eid, c in zip(ids, (m @ qv).tolist(), strict=True):
            (evidence if beam.turn_of(eid) in q["evidence"] else other).append(c)
    ev, ot = np.asarray(evidence), np.asarray(other)
    return {"evidence": {f"p{p}": round(float(np.percentile(ev, p)), 4) for p in (5, 10, 25, 50)} | {"n": len(ev)},
            "other": {f"p{p}": round(float(np.percentile(ot, p)), 4) for p in (50, 75, 90, 95, 99)} | {"n": len(ot)},
            "share_above": {str(f): {"evidence": round(float((ev >= f).mean()), 4),
                                     "other": round(float((ot >= f).mean()), 4)} for f in FLOORS}}


async def evaluate(data: list[dict], url: str, env: dict, modes: tuple[str, ...], limit: int,
                   protocols: dict[str, float | None] | None = None, touch: bool = True,
                   keep_rows: bool = False, worlds: dict[str, WorldSpec] | None = None) -> dict:
    """The LoCoMo dev split's results (evaluate_corpus)."""
    return await evaluate_corpus(Corpus(data), url, env, modes, limit, protocols, touch, keep_rows, worlds)


def summarise(rows: list[dict], corpus: Corpus, created: dict[str, float]) -> dict:
    """A mode's scores: per group, R@10 by age, recalled cosines, knowledge-update order, abstention."""
    asked = [r for r in rows if "injected" not in r]
    absent = [r for r in rows if "injected" in r]
    out = by_group(asked, corpus.groups) | {"age": age_report(asked, created), "cosine": cosine_report(asked)}
    if any(r.get("updated") for r in asked):
        out["update_order"] = update_order(asked)
    kinds = dict.fromkeys(r["category"] for r in absent)
    if kinds:
        out["abstention"] = {kind: abstention([r for r in absent if r["category"] == kind]) for kind in kinds}
        if any(c is not None for r in absent for c in r.get("cosines", [])):  # modes with a vector: a floor's cost
            out["abstention_floor"] = abstention_frontier(asked, absent)
    return out


async def evaluate_corpus(corpus: Corpus, url: str, env: dict, modes: tuple[str, ...], limit: int,
                          protocols: dict[str, float | None] | None = None, touch: bool = True,
                          keep_rows: bool = False, worlds: dict[str, WorldSpec] | None = None,
                          database_url: str | None = None) -> dict:
    """results[protocol][mode] = per-group scores, R@10 by evidence age, recalled cosines,
    abstention on the questions without evidence, knowledge-update order (where the data says
    which turn updated which); `worlds` adds the shared-world protocols. With `database_url`
    (a PostgreSQL server) the engine's modes run on PostgreSQL: the import goes to a database
    of its own there, and each protocol and mode asks a copy of it (CREATE DATABASE ... TEMPLATE)."""
    protocols = PROTOCOLS if protocols is None else protocols
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template.db"
        on_server = postgres_place(database_url, f"quality_{corpus.name}")
        await import_all(corpus, template, url, env | on_server)
        bm25_rows = ask_bm25(corpus, limit) if "bm25" in modes else []
        cosine_rows: list[dict] = []
        if any(m not in ("fts", "bm25") for m in modes):
            vectors = await embed_corpus(corpus, Path(tmp) / "floor.db", url, env)
            results["touch_floor"] = floor_report(corpus, vectors)
            if "cosine" in modes:
                cosine_rows = await ask_cosine(corpus, Path(tmp) / "floor.db", url, env, limit)
        for name, days_after in protocols.items():
            results[name] = {}
            for mode in modes:
                if mode in ("bm25", "cosine"):
                    rows = [dict(r, as_of=as_of_for(q, days_after) or time.time()) if "as_of" in r else r
                            for r, q in zip(bm25_rows if mode == "bm25" else cosine_rows, corpus.asks + corpus.absent,
                                            strict=True)]
                else:
                    path = Path(tmp) / f"{name}-{mode}.db"
                    copy_database(template, path)
                    copy = postgres_place(database_url, f"quality_{corpus.name}_asked", f"quality_{corpus.name}")
                    rows = await ask_engine(corpus, path, env | copy, mode, url, days_after, touch, limit)
                out = summarise(rows, corpus, corpus.created)
                if keep_rows:
                    out["rows"] = rows
                results[name][mode] = out
        for name, spec in (worlds or {}).items():
            results[name] = await evaluate_world(corpus, Path(tmp), url, env, modes, limit, spec, touch, keep_rows)
    return results


async def evaluate_world(corpus: Corpus, tmp: Path, url: str, env: dict, modes: tuple[str, ...], limit: int,
                         spec: WorldSpec, touch: bool, keep_rows: bool) -> dict:
    """One shared-world protocol (bench/shared_world.py): scores as `evaluate`, plus the
    share of the top 10 that came from the room (other people's talk)."""
    view, same_names = spec.view, spec.same_names
    template = tmp / f"world-{'names' if same_names else 'plain'}-crowd{spec.crowd}.db"
    world = shared_world.world_records(corpus.conversations, corpus.records, same_names=same_names,
                                       crowd=spec.crowd)
    if not template.exists():
        await import_groups({"the shared world": world}, template, url, env, warm=False)
    created = {r["external_id"]: r["created_at"] for r in world}
    asks = [q | {"as_of": as_of_for(q, spec.days_after)} for q in corpus.asks]
    out: dict = {}
    for mode in modes:
        if mode == "cosine":  # the plain baselines of a shared world: BM25 only
            continue
        if mode == "bm25":
            rankings = shared_world.bm25_world(world, asks, view, limit)
            rows = [score(ranked, q["evidence"]) | {"category": q["category"], "ranked": ranked, "cosines": [],
                                                    "evidence": sorted(q["evidence"]),
                                                    "as_of": q["as_of"] if q["as_of"] is not None else time.time()}
                    for ranked, q in zip(rankings, asks, strict=True)]
        else:
            path = tmp / f"world-{view}-{same_names}-{spec.crowd}-{spec.days_after}-{mode}.db"
            copy_database(template, path)
            rows = await ask_engine(corpus, path, env, mode, url, spec.days_after, touch, limit, view=view)
            rows = [r for r in rows if "injected" not in r]
        room = [sum(eid.startswith("room") for eid in r["ranked"][:10]) / max(1, len(r["ranked"][:10]))
                for r in rows if r["category"] != 5]
        out[mode] = by_group(rows) | {"age": age_report(rows, created), "cosine": cosine_report(rows),
                                      "room_share_top10": round(sum(room) / len(room), 4) if room else None}
        if keep_rows:
            out[mode]["rows"] = rows
    return out


def reference_of(world: str, results: dict) -> str | None:
    """What a hard protocol is compared with: a crowded world with the same world uncrowded,
    asked alike; any other with the isolated protocol asked at the same time."""
    spec = WORLDS[world]
    if spec.crowd:
        same = [name for name, other in WORLDS.items() if other == replace(spec, crowd=0) and name in results]
        if same:
            return same[0]
    isolated = next((name for name, days in PROTOCOLS.items() if days == spec.days_after), None)
    return isolated if isolated in results else None


def groups_of(scores: dict) -> list[str]:
    """The groups a mode's scores hold (overall first), in their order."""
    return [g for g, v in scores.items() if isinstance(v, dict) and "r10" in v]


def print_table(results: dict, title: str = "LoCoMo dev") -> None:
    floors = results.pop("touch_floor", None)
    protocols = list(results)
    modes = list(results[protocols[0]])
    print(f"\n{title}: R@5 / R@10 / MRR by as_of (touch on, questions in order); R@10 past the relevance floor")
    print(f"{'group':<24} {'mode':<7} {'n':>4} " + " ".join(f"{p:>27}" for p in protocols))
    for group in groups_of(results[protocols[0]][modes[0]]):
        for mode in modes:
            cells = [results[p].get(mode, {}).get(group) for p in protocols]  # a world has no cosine mode
            if not cells[0]:
                continue
            line = " ".join(f"{c['r5']:>6.3f} {c['r10']:>6.3f} {c['mrr']:>6.3f} {c.get('r10_floor', float('nan')):>6.3f}"
                            if c else f"{'-':>27}" for c in cells)
            print(f"{group:<24} {mode:<7} {cells[0]['n']:>4} {line}")
    for p in protocols:
        for mode in (m for m in modes if m in results[p]):
            extra = {k: results[p][mode][k] for k in ("update_order", "abstention", "abstention_floor")
                     if k in results[p][mode]}
            if extra:
                print(f"{p:<6} {mode:<7} {json.dumps(extra)}")
    print("\nR@10 by evidence age (categories 1-4) and share of the top 10 from the last 14 days")
    for p in protocols:
        for mode in (m for m in modes if m in results[p]):
            age = results[p][mode]["age"]
            cells = " ".join(f"{name} {age[name]['r10'] if age[name]['r10'] is not None else '-':>6} (n {age[name]['n']:>3})"
                             for _, _, name in AGE_BUCKETS)
            print(f"{p:<6} {mode:<7} {cells}  recent share {age['top10_share_last_14d']}")
    worlds = [p for p in protocols if p in WORLDS]
    if worlds:
        print("\nHard protocols against their reference (R@10 change; share of the top 10 from the room)")
        for world in worlds:
            reference = reference_of(world, results)
            if reference is None:
                continue
            for mode in (m for m in modes if m in results[world] and m in results[reference]):
                cells = [(g, results[world][mode].get(g), results[reference][mode].get(g))
                         for g in groups_of(results[world][mode])]
                changes = "  ".join(f"{g} {w['r10'] - i['r10']:+.3f}" for g, w, i in cells if w and i)
                print(f"{world:<18} vs {reference:<14} {mode:<7} {changes}  "
                      f"room share {results[world][mode]['room_share_top10']}")
    if floors:
        print("\ncosine question-turn: evidence", floors["evidence"], "\n                     other   ", floors["other"])
        print("share at or above a floor (evidence / other turns):",
              "  ".join(f"{f}: {v['evidence']:.3f} / {v['other']:.3f}" for f, v in floors["share_above"].items()))
        hybrid = results[protocols[0]].get("hybrid", {}).get("cosine")
        if hybrid:
            print("cosine of what hybrid recalls (top 10):", hybrid)
        results["touch_floor"] = floors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Muninn retrieval quality on LoCoMo (dev split)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--conversations", type=int, default=0, help="use only the first N (0 = all)")
    parser.add_argument("--datasets", default="locomo,beam", help="locomo, beam or both")
    parser.add_argument("--beam", default=None, help=f"BEAM's chats (default ${beam.ENV} or bench/data/beam/)")
    parser.add_argument("--beam-chats", type=int, default=0, help="use only the first N BEAM chats (0 = all)")
    parser.add_argument("--foreign", type=int, default=20,
                        help="questions of the other data set asked of each conversation (no evidence there)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help=f"any of {', '.join(PROTOCOLS)}")
    parser.add_argument("--worlds", default=",".join(WORLDS),
                        help=f"hard protocols (one shared database): any of {', '.join(WORLDS)}")
    parser.add_argument("--no-touch", action="store_true", help="ask with touch off (rankings never change)")
    parser.add_argument("--set", action="append", default=[], metavar="ENV=VALUE",
                        help="a setting for this run, e.g. --set MUNINN_RRF_K=20, or a recall constant, "
                        "e.g. --set @fusion.WEAK_SHARE=1 (repeatable)")
    parser.add_argument("--url", default=None, help="an Ollama-compatible server to use instead of starting one")
    parser.add_argument("--database-url", default=None,
                        help="a PostgreSQL server (postgresql://...): the engine's modes run there (no shared worlds)")
    parser.add_argument("--question-share", default=None, metavar="SIGNAL:T:A:B",
                        help="a per-question vector share for this run (bench/path_share.py's rules)")
    parser.add_argument("--spread", default=None, metavar="PENALTY:WINDOW",
                        help="re-order recall's final list for this run (bench/spread.py)")
    parser.add_argument("--label", default="quality")
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/<label>.json)")
    args = parser.parse_args(argv)
    if not Path(args.data).exists():
        parser.error(f"no LoCoMo dev split at {args.data}: put locomo-dev.json there or pass --data FILE")
    data = json.loads(Path(args.data).read_text())
    if args.conversations:
        data = data[: args.conversations]
    overrides = set_constants(dict(item.split("=", 1) for item in args.set))
    known_env = {spec.env for spec in SETTINGS.values()}
    for name in overrides:
        if name not in known_env:
            parser.error(f"unknown setting {name}")
    if args.question_share:
        from .patches import install_share
        install_share(args.question_share)
    if args.spread:
        from .patches import install_spread
        install_spread(args.spread)
    modes = tuple(m for m in args.modes.split(",") if m)
    protocols = {p: PROTOCOLS[p] for p in args.protocols.split(",") if p}
    worlds = {w: WORLDS[w] for w in args.worlds.split(",") if w}
    datasets = [d for d in args.datasets.split(",") if d]
    if args.database_url and worlds:
        parser.error("--database-url runs the isolated protocols only: pass --worlds ''")
    if not set(datasets) <= {"locomo", "beam"}:
        parser.error("--datasets takes locomo, beam or both")
    corpora = {"locomo": Corpus(data)}
    if "beam" in datasets:
        where = beam.folder(args.beam)
        if not where.is_dir() or not beam.chats(where):
            parser.error(f"no BEAM chats at {where}: download them there (bench/README.md) or pass --beam DIR")
        corpora["beam"] = Corpus.beam(where, args.beam_chats)
        corpora["locomo"].foreign(corpora["beam"], args.foreign)
        corpora["beam"].foreign(Corpus(data), args.foreign)
    started = time.perf_counter()
    env = ENGINE_ENV | overrides

    async def run(url: str) -> dict:
        return {name: await evaluate_corpus(corpora[name], url, env, modes, 10, protocols, not args.no_touch,
                                            worlds=worlds if name == "locomo" else None,
                                            database_url=args.database_url) for name in datasets}

    if args.url:
        results = asyncio.run(run(args.url))
    else:
        RESULTS.mkdir(parents=True, exist_ok=True)
        with EmbedServerProcess("minilm", cache=str(EMBED_CACHE)) as url:
            results = asyncio.run(run(url))
    out = Path(args.out) if args.out else RESULTS / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": overrides, "touch": not args.no_touch, "conversations": len(data),
                               "results": results.get("locomo", {}), "beam": results.get("beam", {}),
                               "beam_chats": len(corpora["beam"].records) if "beam" in corpora else 0,
                               "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    for name, found in results.items():
        print_table(dict(found), {"locomo": "LoCoMo dev", "beam": "BEAM dev"}[name])
    print(f"saved {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
