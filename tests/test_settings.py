"""Settings: typed, checked at start, one clear line naming the setting."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dotenv import dotenv_values

from bot.settings import OTHER, SETTINGS, SettingsError, Spec, env_example, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_valid(tmp_path):
    settings = load_settings({"MUNINN_DB_PATH": str(tmp_path / "m.db")})
    assert settings.ollama_url == "http://localhost:11434"
    assert settings.embed_model == "nomic-embed-text" and settings.recall_limit == 5 and settings.rrf_k == 3


@pytest.mark.parametrize("env, named", [
    ({"OLLAMA_URL": "localhost:11434"}, "OLLAMA_URL"),
    ({"OLLAMA_URL": "ftp://x"}, "OLLAMA_URL"),
    ({"MUNINN_RECALL_LIMIT": "-1"}, "MUNINN_RECALL_LIMIT"),
    ({"MUNINN_RECALL_LIMIT": "five"}, "MUNINN_RECALL_LIMIT"),
    ({"OLLAMA_EMBED_TIMEOUT": "0"}, "OLLAMA_EMBED_TIMEOUT"),
    ({"MUNINN_TIMEZONE": "Mars/Olympus"}, "MUNINN_TIMEZONE"),
    ({"MUNINN_OWNER_IDS": "12,abc"}, "MUNINN_OWNER_IDS"),
    ({"MUNINN_LOG_LEVEL": "LOUD"}, "MUNINN_LOG_LEVEL"),
    ({"MUNINN_VECTOR_INDEX_MIN": "-1"}, "MUNINN_VECTOR_INDEX_MIN"),
    ({"MUNINN_VECTOR_INDEX_MIN": "many"}, "MUNINN_VECTOR_INDEX_MIN"),
    ({"MUNINN_VECTOR_INDEX_BUILD_MB": "1.5"}, "MUNINN_VECTOR_INDEX_BUILD_MB"),
    ({"MUNINN_DB_PATH": "{tmp}/a-file/m.db"}, "MUNINN_DB_PATH"),
    ({"MUNINN_DB_PATH": "{tmp}"}, "MUNINN_DB_PATH"),
    ({"MUNINN_DB_PATH": ""}, "MUNINN_DB_PATH"),
])
def test_bad_values_name_the_setting(tmp_path, env, named):
    (tmp_path / "a-file").write_text("not a folder")
    env = {"MUNINN_DB_PATH": str(tmp_path / "m.db"), **{k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}}
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_empty_ollama_url_disables_ollama(tmp_path):
    assert load_settings({"MUNINN_DB_PATH": str(tmp_path / "m.db"), "OLLAMA_URL": ""}).ollama_url == ""


def test_env_example_lists_every_setting_with_its_default():
    text = (ROOT / ".env.example").read_text()
    regenerate = "python -c 'from bot.settings import env_example; print(env_example(), end=\"\")' > .env.example"
    assert text == env_example(), f"regenerate .env.example: {regenerate}"
    for spec in SETTINGS.values():
        assert spec.help.strip() and f"{spec.env}={spec.default}\n" in text
        assert f"\n{'' if spec.essential else '# '}{spec.env}={spec.default}\n" in text


def test_copying_env_example_sets_only_the_essentials(tmp_path):
    """`cp .env.example .env` pins what every install must choose, and no tuning default."""
    (tmp_path / ".env").write_text(env_example())
    essentials = {spec.env: spec.default for spec in SETTINGS.values() if spec.essential}
    assert dict(dotenv_values(tmp_path / ".env")) == essentials
    assert {"DISCORD_TOKEN", "OLLAMA_URL", "OLLAMA_CHAT_MODEL", "OLLAMA_EMBED_MODEL", "MUNINN_DB_PATH"} <= set(essentials)
    advanced = env_example().index("# ===== Advanced")
    for spec in SETTINGS.values():
        at = env_example().index(f"{spec.env}={spec.default}\n")
        assert (at < advanced) == spec.essential, spec.env


def test_a_new_row_without_a_section_lands_under_advanced(monkeypatch):
    """Rows added without `section` or `essential` are tuning: commented out, under Advanced."""
    extra = Spec("MUNINN_SOMETHING_NEW", "7", "A setting someone added.", lambda name, raw: raw)
    monkeypatch.setitem(SETTINGS, "something_new", extra)
    text = env_example()
    assert text.index("# ===== Advanced") < text.index(f"# --- {OTHER} ---") < text.index("# MUNINN_SOMETHING_NEW=7\n")
    assert "\nMUNINN_SOMETHING_NEW=" not in text


def test_cli_reports_a_bad_setting_in_one_line(tmp_path):
    env = {**os.environ, "OLLAMA_URL": "localhost", "MUNINN_DB_PATH": str(tmp_path / "m.db")}
    proc = subprocess.run([sys.executable, "-m", "cogs", "stats"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "OLLAMA_URL" in proc.stderr
    assert "Traceback" not in proc.stderr
