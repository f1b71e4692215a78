"""The architecture, checked: layers import down, never up; only the memory layer touches the
database (its SQL, its drivers, its connections); no module over 500 lines (import circles:
test_import_cycles.py)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("memory", "lifecycle", "conversation", "llm", "cli")


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_bot_never_imports_discord_or_the_cogs():
    for path in modules("bot"):
        bad = {name for name in imports_of(path) if name.split(".")[0] in ("discord", "cogs")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_memory_layer_imports_no_layer_above_it():
    above = {f"bot.{layer}" for layer in ("lifecycle", "conversation", "cli")}
    for path in modules("bot/memory"):
        bad = {name for name in imports_of(path) if any(name.startswith(layer) for layer in above)}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_only_the_memory_layer_reaches_the_connection():
    for folder in ("bot/lifecycle", "bot/conversation", "bot/llm", "bot/cli", "cogs"):
        for path in modules(folder):
            text = path.read_text()
            for private in ("._run(", "._connection(", "._conn"):
                assert private not in text, f"{path.relative_to(ROOT)} uses Engine{private}"


def test_every_layer_is_a_package_listed_for_installation():
    import tomllib
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert {f"bot.{layer}" for layer in LAYERS} <= set(packages)
    for layer in LAYERS:
        assert (ROOT / "bot" / layer / "__init__.py").exists()


OUTSIDE_MEMORY = ("bot/lifecycle", "bot/conversation", "bot/llm", "bot/cli", "cogs")
DRIVERS = ("apsw", "psycopg", "sqlite_vec")


def outside_memory() -> list[Path]:
    return [path for folder in OUTSIDE_MEMORY for path in modules(folder)] + [ROOT / "bot" / name for name in
                                                                              ("settings.py", "validate.py",
                                                                               "redact.py", "logs.py")]


def test_no_sql_and_no_database_driver_outside_the_memory_layer():
    for path in outside_memory():
        text = path.read_text()
        for call in (".execute(", ".executemany(", ".pg."):
            assert call not in text, f"{path.relative_to(ROOT)} runs SQL ({call}): give it a named method in bot/memory/"
        bad = {name for name in imports_of(path) if name.split(".")[0] in DRIVERS}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_no_layer_hands_the_engine_a_job_to_run_on_a_connection():
    # Engine.read / Engine.write run `job(conn, ...)`: for the memory layer and tests only.
    for path in outside_memory():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("read", "write") and ast.unparse(node.func.value).split(".")[-1] == "engine"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} calls {ast.unparse(node.func)}: "
                                     "add a named method to the memory layer instead")


def test_no_module_over_500_lines():
    long = {str(path.relative_to(ROOT)): n for folder in ("bot", "cogs") for path in modules(folder)
            if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}, "split these by role"
