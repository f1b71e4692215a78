"""deploy/muninn.service: the settings an operator expects, TimeoutStopSec from
MUNINN_SHUTDOWN_SECONDS, and `systemd-analyze verify` clean where systemd is installed."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "muninn.service"
# Beyond the bot's own bound (replies, then as long for the facts waiting), closing the
# database and the gateway: what the unit's comment promises.
STOP_MARGIN_S = 10


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_the_unit_runs_unprivileged_hardened_and_restarts_on_failure():
    s = service()
    assert s["Restart"] == "on-failure" and s["EnvironmentFile"].startswith("/etc/muninn/")
    assert s["User"] == s["Group"] == "muninn" and "DynamicUser" not in s
    assert s["StateDirectory"] == "muninn" and s["StateDirectoryMode"] == "0700"
    assert s["Environment"] == "MUNINN_DB_PATH=/var/lib/muninn/muninn.db"
    for option, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                          "PrivateTmp": "yes", "KillSignal": "SIGTERM"}.items():
        assert s[option] == value, option
    assert s["ExecStart"].endswith("/bin/muninn")


def test_the_stop_timeout_covers_the_graceful_shutdown():
    bound = float(SETTINGS["shutdown_seconds"].default)
    assert int(service()["TimeoutStopSec"]) == 2 * bound + STOP_MARGIN_S
    assert f"2 x it + {STOP_MARGIN_S}" in UNIT.read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_is_clean(tmp_path):
    # ExecStart must exist for verify: point it at this checkout's `muninn`.
    unit = tmp_path / "muninn.service"
    unit.write_text(UNIT.read_text().replace("/opt/muninn/.venv/bin/muninn", str(Path(sys.executable).parent / "muninn")))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
