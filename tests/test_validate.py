"""Input validation at the boundary (bot/validate.py) and the importer / recall batch built on
it: every bad value is one reported line, every good line around it is stored. Includes a
hypothesis fuzz of import lines and batch lines."""
from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot import validate
from bot.cli.importer import import_lines, memory_from_record
from bot.cli.main import main
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

NOW = time.time()


@pytest.mark.parametrize("value, ok", [
    (5, 5), ("5", 5), (2**63 - 1, 2**63 - 1), (None, None), ("", None), (7.0, 7),
    (2**63, None), (-1, None), (True, None), ("x5", None), ("99999999999999999999", None), ([1], None), (1.5, None),
])
def test_snowflake(value, ok):
    if ok is None and value not in (None, ""):
        with pytest.raises(validate.Invalid):
            validate.snowflake(value, "user_id")
    else:
        assert validate.snowflake(value, "user_id") == ok


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e400, -0.1, 1.1, "0.5", True, None])
def test_number_refuses_non_finite_out_of_range_and_non_numbers(value):
    with pytest.raises(validate.Invalid, match="importance"):
        validate.number(value, "importance", low=0, high=1)


@pytest.mark.parametrize("value", [math.nan, -1e11, 1e300, 10**400, "3000-01-01T00:00:00Z", "1999-12-31", True,
                                   "yesterday", [2020]])
def test_timestamp_window(value):
    with pytest.raises(validate.Invalid, match="created_at"):
        validate.timestamp(value, "created_at", now=NOW)


def test_timestamp_accepts_iso_naive_utc_and_seconds():
    assert validate.timestamp("2024-05-01T10:00:00Z", "t") == validate.timestamp("2024-05-01T10:00:00", "t")
    assert validate.timestamp(1_700_000_000, "t") == 1_700_000_000.0
    assert validate.timestamp(NOW + 3600, "t", now=NOW) == NOW + 3600  # clocks differ a little


def test_as_of_far_future_only_without_touch():
    future = "2090-01-01T00:00:00Z"
    with pytest.raises(validate.Invalid, match="no_touch"):
        validate.as_of(future, touch=True)
    assert validate.as_of(future, touch=False) > NOW
    with pytest.raises(validate.Invalid):
        validate.as_of(1e300, touch=False)


@pytest.mark.parametrize("value", ["false", "no", 0, 1, "true", []])
def test_booleans_are_strict(value):
    with pytest.raises(validate.Invalid, match="true or false"):
        validate.boolean(value, "dm")


def test_text_surrogates_rejected_when_stored_and_replaced_in_queries():
    with pytest.raises(validate.Invalid, match="invalid characters"):
        validate.stored_text("bad \ud800 text")
    assert validate.query_text("ott\ud800ers") == ("ott\ufffders", True)
    assert validate.query_text("otters") == ("otters", False)
    with pytest.raises(ValueError):
        NewMemory(text="x\udc00", scope="global")  # the store refuses it too (LLM output, slash commands)


def test_limit_capped():
    assert validate.limit(validate.MAX_RECALL_LIMIT) == validate.MAX_RECALL_LIMIT
    for bad in (0, validate.MAX_RECALL_LIMIT + 1, 2000, True, 2.0):
        with pytest.raises(validate.Invalid):
            validate.limit(bad)


@pytest.mark.parametrize("record, reason", [
    ({"text": "x", "scope": "personal", "user_id": 2**63}, "out of range"),
    ({"text": "x", "scope": "global", "importance": math.nan}, "importance"),
    ({"text": "x", "scope": "global", "created_at": -1e11}, "before 2000"),
    ({"text": "x", "scope": "global", "created_at": 10**400}, "created_at"),
    ({"text": "x", "scope": "global", "external_id": "e\udc00"}, "external_id"),
    ({"text": "x", "scope": "global", "source_message_ids": 5}, "list"),
    ({"text": "x", "scope": "personal", "user_id": 1, "private": "false"}, "true or false"),
    ({"text": "x", "scope": ["global"]}, "scope"),
])
def test_import_record_reasons(record, reason):
    with pytest.raises(ValueError, match=reason):
        memory_from_record(record)


async def test_bad_bytes_and_constants_are_reported_lines_and_the_rest_stored(fts_engine):
    lines = [json.dumps({"text": "first otter", "scope": "global"}).encode(),
             b'{"text": "caf\xe9", "scope": "global"}',
             b'{"text": "x", "scope": "global", "importance": NaN}',
             b"[" * 50000 + b"]" * 50000,
             json.dumps({"text": "last otter", "scope": "global"}).encode()]
    report = await import_lines(fts_engine, lines)
    assert report.imported == 2
    assert [n for n, _ in report.errors] == [2, 3, 4]
    assert "UTF-8" in report.errors[0][1] and "byte 0xe9" in report.errors[0][1]
    assert "NaN" in report.errors[1][1]


async def test_a_row_the_database_refuses_costs_only_its_own_line(fts_engine, monkeypatch):
    """A batch the database rejects (here: a duplicate external_id inside one file racing another
    import) is stored line by line, so only the offending line is lost, and it is reported."""
    await fts_engine.remember(NewMemory(text="already here", scope="global", external_id="dup"))
    lines = [json.dumps({"text": f"row {i}", "scope": "global", "external_id": f"e{i}"}) for i in range(5)]

    async def nothing_stored_yet(ids):  # as if another process stored "dup" right after the check
        return set()
    monkeypatch.setattr(fts_engine, "existing_external_ids", nothing_stored_yet)
    lines.insert(2, json.dumps({"text": "again", "scope": "global", "external_id": "dup"}))
    report = await import_lines(fts_engine, lines)
    assert report.imported == 5 and [n for n, _ in report.errors] == [3]
    assert "refused" in report.errors[0][1]


# -- fuzz -------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["", "\ud800", "2024-05-01T10:00:00Z", "3000-01-01", "personal", "room", "global", "1e400",
                     "99999999999999999999", "false"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
FIELD_NAMES = ["text", "scope", "user_id", "channel_id", "guild_id", "importance", "created_at", "external_id",
               "source_message_ids", "private"]
records = st.dictionaries(st.sampled_from(FIELD_NAMES + ["other"]), json_values, max_size=8)
raw_lines = st.one_of(
    records.map(lambda r: json.dumps(r).encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
    json_values.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.lists(raw_lines, min_size=1, max_size=6))
async def test_fuzz_import_lines_never_raise_and_never_lose_a_good_line(fts_engine, noise):
    stamp = time.monotonic_ns()
    good = [json.dumps({"text": f"good fact {stamp} {i}", "scope": "global", "external_id": f"g{stamp}-{i}"}).encode()
            for i in range(3)]
    lines = [good[0], *noise[:3], good[1], *noise[3:], good[2]]
    before = (await fts_engine.stats())["memories"]
    report = await import_lines(fts_engine, lines, batch=4)
    after = (await fts_engine.stats())["memories"]
    assert after - before == report.imported                       # nothing stored without being counted
    counted = report.imported + report.skipped_existing + len(report.errors)
    assert counted == sum(1 for line in lines if line.strip())     # every line imported, skipped or reported
    for external in (f"g{stamp}-{i}" for i in range(3)):
        assert await fts_engine.write(lambda c, e=external: c.execute(
            "SELECT count(*) FROM memories WHERE external_id = ?", (e,)).fetchall()[0][0]) == 1
    listed, _ = await fts_engine.list_visible(Viewer(user_id=1, dm=True), limit=500)
    for memory in listed:                                           # whatever got in renders
        json.dumps(memory.to_dict(), ensure_ascii=False).encode("utf-8")


batch_keys = st.sampled_from(["query", "user_id", "channel_id", "guild_id", "dm", "limit", "as_of", "no_touch",
                              "colour"])
batch_records = st.dictionaries(batch_keys, json_values, max_size=6)
batch_lines = st.one_of(batch_records.map(lambda r: json.dumps(r).encode("utf-8", "surrogatepass")),
                        st.binary(max_size=40))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.lists(batch_lines, min_size=1, max_size=5))
def test_fuzz_batch_lines_one_result_line_each(tmp_path_factory, monkeypatch, capsys, noise):
    folder = tmp_path_factory.mktemp("batch")
    monkeypatch.setenv("MUNINN_DB_PATH", str(folder / "b.db"))
    monkeypatch.setenv("OLLAMA_URL", "")
    good = json.dumps({"query": "otters", "user_id": 1, "dm": True, "no_touch": True}).encode()
    lines = [good, *noise, good]
    batch = folder / "q.jsonl"
    batch.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    code = main(["recall", "--batch", str(batch), "--json"])
    out = capsys.readouterr().out
    results = [json.loads(line) for line in out.splitlines()]
    expected = [n for n, line in enumerate(lines, start=1) if line.replace(b"\n", b" ").strip()]
    assert [r["line"] for r in results] == expected                 # one result per line, in order
    assert "memories" in results[0] and "memories" in results[-1]   # the good lines ran
    assert code == (3 if any("error" in r for r in results) else 0)
