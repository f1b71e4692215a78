"""The metrics' view of the LLM servers: every host of every server, whatever answers chat and embeddings."""
from __future__ import annotations

from bot.llm.servers import make_client
from bot.metrics import _llm_hosts
from bot.settings import load_settings


def hosts_up(settings_env: dict[str, str]) -> dict[str, float]:
    client = make_client(load_settings({"MUNINN_DB_PATH": "x.db", **settings_env}))
    families = {family.name: family for family in _llm_hosts(client)}
    return {sample.labels["host"]: sample.value for sample in families["muninn_llm_host_up"].samples}


def test_one_server_with_two_hosts_lists_both():
    up = hosts_up({"OLLAMA_URL": "http://gpu1:11434,http://gpu2:11434"})
    assert set(up) == {"http://gpu1:11434", "http://gpu2:11434"} and set(up.values()) == {1.0}


def test_chat_and_embeddings_on_different_servers_list_each():
    up = hosts_up({"OLLAMA_URL": "http://embed-box:11434", "MUNINN_CHAT_KIND": "openai",
                   "MUNINN_CHAT_URL": "http://vllm-box:8000/v1"})
    assert len(up) == 2 and any("vllm-box" in host for host in up) and any("embed-box" in host for host in up)
