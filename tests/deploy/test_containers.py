"""The container files (Dockerfile, compose.yaml, .dockerignore): no container runtime runs here, so
what can be checked without one is: the files parse, say what docs/deployment.md promises, and
install and start Muninn the way the README does."""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import yaml

from bot.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def readme_install() -> tuple[list[str], str]:
    """The README's quick-start line: the steps up to installing Muninn, and the command it runs."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "-m venv" in line and "pip install" in line and "[test]" not in line:
            steps = [step.strip() for step in re.split(r"&&|;", line)]
            install = next(i for i, step in enumerate(steps) if "pip install" in step)
            return steps[:install + 1], steps[-1]
    raise AssertionError("the README has no install line")


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_the_image_installs_and_starts_muninn_as_the_readme_does():
    steps, run = readme_install()
    runs = [args for instruction, args in dockerfile() if instruction == "RUN"]
    assert " && ".join(steps) in runs
    [cmd] = [args for instruction, args in dockerfile() if instruction == "CMD"]
    [command] = yaml.safe_load(cmd)  # the exec form is a JSON (so YAML) list
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command == Path(shlex.split(run)[0]).name == "muninn" and "muninn" in script


def test_the_image_runs_unprivileged_with_a_private_data_volume():
    instructions = dockerfile()
    users = [args for instruction, args in instructions if instruction == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [i for i, _ in instructions].index("USER") > max(i for i, (ins, _) in enumerate(instructions) if ins == "RUN")
    assert ("VOLUME", '["/data"]') in instructions
    runs = " ".join(args for instruction, args in instructions if instruction == "RUN")
    assert "chmod 0700 /data" in runs and f"chown {users[-1]}:" in runs
    env = " ".join(args for instruction, args in instructions if instruction == "ENV")
    assert "MUNINN_DB_PATH=/data/" in env


def test_the_build_context_leaves_out_secrets_and_data():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert ".env" in patterns and "data/" in patterns and ".venv" in patterns and ".git" in patterns
    copied = [args.split()[0] for instruction, args in dockerfile() if instruction == "COPY"]
    assert not any(source in (".", "./") for source in copied)  # only what the image needs, by name


def test_compose_runs_ollama_healthy_before_the_bot_and_reaches_it_by_name():
    services = compose()["services"]
    assert set(services) == {"ollama", "ollama-pull", "muninn"}
    ollama, pull, bot = services["ollama"], services["ollama-pull"], services["muninn"]
    assert ollama["image"].startswith("ollama/ollama")
    assert ollama["healthcheck"]["test"][:2] == ["CMD", "ollama"]
    assert ollama["environment"]["OLLAMA_HOST"].startswith("0.0.0.0")
    assert any(volume.endswith(":/root/.ollama") for volume in ollama["volumes"])
    assert pull["depends_on"]["ollama"]["condition"] == "service_healthy"
    assert pull["restart"] == "no" and "ollama pull" in " ".join(pull["entrypoint"])
    assert pull["environment"]["OLLAMA_HOST"] == "http://ollama:11434"
    assert bot["depends_on"]["ollama"]["condition"] == "service_healthy"
    assert bot["depends_on"]["ollama-pull"]["condition"] == "service_completed_successfully"
    assert bot["environment"]["OLLAMA_URL"] == "http://ollama:11434"
    assert bot["environment"]["MUNINN_DB_PATH"].startswith("/data/")
    assert "muninn-data:/data" in bot["volumes"] and bot["env_file"] == ".env"
    assert set(compose()["volumes"]) == {"ollama", "muninn-data"}


def test_compose_gives_the_graceful_shutdown_its_time():
    grace = compose()["services"]["muninn"]["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > 2 * float(SETTINGS["shutdown_seconds"].default)


def test_the_pulled_models_are_the_settings_defaults():
    entry = " ".join(compose()["services"]["ollama-pull"]["entrypoint"])
    for key in ("chat_model", "embed_model"):
        spec = SETTINGS[key]
        assert f"$${{{spec.env}:-{spec.default}}}" in entry
