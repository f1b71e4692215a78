"""`muninn chat` on a real terminal (a pseudo-terminal driven by pexpect) against the fake Ollama:
the thinking sign and the streamed reply, typed text that survives log lines arriving, editing
and history, Ctrl-C and Ctrl-D, /why, a missing model and Ollama down at the start. No traceback
may appear in any of them."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.fakes.ollama import FakeOllama, FakeOllamaThread

ROOT = Path(__file__).resolve().parents[2]
LEFT = "\x1b[D"
UP = "\x1b[A"


@pytest.fixture
def fake():
    with FakeOllamaThread() as server:
        yield server


class Chat:
    """A `muninn chat` in a pseudo-terminal; `transcript` is everything it printed."""

    def __init__(self, tmp_path: Path, url: str, *args: str, **env: str):
        self.log = io.StringIO()
        environ = {**os.environ, "PYTHONPATH": str(ROOT), "MUNINN_DB_PATH": str(tmp_path / "chat.db"),
                   "MUNINN_DATABASE_URL": "", "OLLAMA_URL": url, "MUNINN_SHUTDOWN_SECONDS": "5",
                   "OLLAMA_RETRIES": "0", "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", **env}
        # Ctrl-C as a signal must reach it as on a terminal (a CI shell's background job ignores SIGINT).
        self.child = pexpect.spawn(sys.executable, ["-m", "cogs", "chat", "--name", "Kari", *args], env=environ,
                                   cwd=str(tmp_path), dimensions=(30, 200), encoding="utf-8", timeout=20,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.child.logfile_read = self.log

    @property
    def transcript(self) -> str:
        return self.log.getvalue()

    def expect(self, text: str) -> None:
        self.child.expect_exact(text)

    def say(self, text: str) -> None:
        self.child.send(text + "\r")

    def type_slowly(self, text: str, pause: float) -> None:
        for char in text:
            self.child.send(char)
            self.child.expect(pexpect.TIMEOUT, timeout=pause)   # reads what is printed meanwhile

    def wait(self) -> int:
        self.child.expect(pexpect.EOF, timeout=20)
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else 128 + self.child.signalstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def facts_or(reply: str):
    def answer(request: dict) -> str:
        if request.get("format"):
            said = request["messages"][-1]["content"]
            facts = [{"text": "Kari grows tomatoes", "about": "Kari", "scope": "personal", "importance": 0.7}]
            return json.dumps({"facts": facts if "I grow tomatoes" in said else []})
        return reply
    return answer


def said_to_model(fake) -> list[str]:
    return [r["messages"][-1]["content"].rsplit(") Kari: ", 1)[-1]
            for r in fake.chat_requests() if not r.get("format")]


def test_thinking_then_the_reply_as_it_is_written_then_ctrl_d_saves(fake, tmp_path):
    fake.default_chat_reply = facts_or("Once upon a time there was a raven.")
    fake.stream_delay = 0.4                                  # a model writing slowly, word by word
    chat = Chat(tmp_path, fake.url)
    try:
        chat.expect("Talking to Muninn as Kari")
        chat.expect("you>")
        chat.say("I grow tomatoes")
        chat.expect("muninn is thinking")
        chat.expect("muninn> Once")
        assert "raven" not in chat.transcript               # the first words before the last one was written
        chat.expect("muninn> Once upon a time there was a raven.\r\n")   # then the whole reply, on its line
        chat.child.sendcontrol("d")                          # Ctrl-D on an empty input line
        chat.expect("Saved 1 memory from this conversation")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert "Traceback" not in chat.transcript and "did not finish" not in chat.transcript
    assert "WARNING" not in chat.transcript and "INFO" not in chat.transcript     # a quiet start and end


def test_leaving_before_extraction_ends_says_plainly_what_was_not_saved(fake, tmp_path):
    fake.chat_replies.extend(["Noted.", FakeOllama.TIMEOUT])    # the reply, then an extraction that hangs
    fake.delay = 10.0
    chat = Chat(tmp_path, fake.url, MUNINN_SHUTDOWN_SECONDS="1")
    try:
        chat.expect("you>")
        chat.say("I grow tomatoes")
        chat.expect("muninn> Noted.")
        chat.child.sendcontrol("d")
        chat.expect("Saving what Muninn learned from 1 message (up to 1 s)…")
        chat.expect("Not saved: what Muninn was still learning from your last message (it did not finish in time).")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert "Traceback" not in chat.transcript and "did not finish within" not in chat.transcript
    assert "Saved " not in chat.transcript


def test_typed_text_survives_log_lines_and_the_line_can_be_edited_and_recalled(fake, tmp_path):
    fake.default_chat_reply = facts_or("Lovely.")
    # The reply, then three failed extractions: each a log line above the input line while the person types.
    fake.chat_replies.extend(["Lovely.", FakeOllama.HTTP_500, FakeOllama.HTTP_500, FakeOllama.HTTP_500])
    chat = Chat(tmp_path, fake.url, OLLAMA_COOLDOWN="0.6")
    text = "the quick brown fox jumps over the lazy dog, and then it sleeps; " * 8
    try:
        chat.expect("you>")
        chat.say("I grow tomatoes")
        chat.expect("muninn> Lovely.")
        before = len(chat.transcript)
        typed = ""
        for char in text:                                    # typing on while the log lines come (a loaded
            chat.type_slowly(char, 0.06)                     # machine may take longer to send them)
            typed += char
            if len(typed) > 40 and chat.transcript[before:].count("fact extraction") >= 2:
                break
        while_typing = chat.transcript[before:]
        typed = typed.strip()
        chat.say("")
        chat.expect("muninn> Lovely.")
        chat.type_slowly("hello wrld", 0.01)
        chat.child.send(LEFT * 3 + "o")                      # the line is edited, not only appended to
        chat.say("")
        chat.expect("muninn> Lovely.")
        chat.child.send(UP)                                  # the history brings it back
        chat.say("")
        chat.expect("muninn> Lovely.")
        chat.say("/quit")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert while_typing.count("fact extraction") >= 2, while_typing   # log lines arrived while typing ...
    assert said_to_model(fake) == ["I grow tomatoes", typed, "hello world", "hello world"]  # ... and nothing was lost
    assert "Traceback" not in chat.transcript


def test_ctrl_c_mid_answer_leaves_at_once_and_quietly(fake, tmp_path):
    fake.chat_replies.append(FakeOllama.TIMEOUT)
    fake.delay = 30.0                                        # an answer that would take half a minute
    chat = Chat(tmp_path, fake.url)
    try:
        chat.expect("you>")
        chat.say("tell me a long story")
        chat.expect("muninn is thinking")
        pressed = time.monotonic()
        chat.child.sendcontrol("c")
        code = chat.wait()
        took = time.monotonic() - pressed
    finally:
        chat.close()
    assert code == 130 and took < 4, (code, took)
    assert "Traceback" not in chat.transcript and "did not finish" not in chat.transcript
    assert "0 waiting" not in chat.transcript and "interrupted" not in chat.transcript


def test_a_sigint_leaves_at_once_too(fake, tmp_path):
    fake.chat_replies.append(FakeOllama.TIMEOUT)
    fake.delay = 30.0
    chat = Chat(tmp_path, fake.url)
    try:
        chat.expect("you>")
        chat.say("tell me a long story")
        chat.expect("muninn is thinking")
        pressed = time.monotonic()
        chat.child.kill(signal.SIGINT)                       # what Ctrl-C sends when the terminal makes it a signal
        code = chat.wait()
        took = time.monotonic() - pressed
    finally:
        chat.close()
    assert code == 130 and took < 4, (code, took)
    assert "Traceback" not in chat.transcript


def test_why_says_why_the_last_reply_recalled_what_it_did(fake, tmp_path):
    fake.default_chat_reply = facts_or("Noted.")
    chat = Chat(tmp_path, fake.url)
    try:
        chat.expect("you>")
        chat.say("/why")
        chat.expect("No reply yet to explain")
        chat.say("I grow tomatoes")
        chat.expect("muninn> Noted.")
        for _ in range(40):                                  # until extraction stored the fact
            chat.say("/memories")
            if chat.child.expect_exact(["1 memory you can see here", "remembers nothing"]) == 0:
                break
            time.sleep(0.25)
        chat.say("what do I grow? tomatoes?")
        chat.expect("muninn> Noted.")
        chat.say("/why")
        chat.expect("The last reply recalled 1 memory for “what do I grow? tomatoes?”:")
        chat.expect("Kari grows tomatoes: shares words with your message")
        chat.say("/quit")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert "Traceback" not in chat.transcript


def test_a_missing_model_gets_the_pull_command_not_try_again_later(fake, tmp_path):
    fake.missing.add("llama3.2")
    chat = Chat(tmp_path, fake.url)
    try:
        chat.expect("Ollama has no llama3.2, so Muninn cannot answer until you pull the model: ollama pull llama3.2")
        chat.expect("you>")
        chat.say("hello")
        chat.expect("muninn> Sorry, I can't think right now: my language model is not installed; "
                    "pull the model: ollama pull llama3.2")
        chat.say("/quit")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert "Traceback" not in chat.transcript and "try again in a little while" not in chat.transcript


def test_ollama_down_at_the_start_is_one_friendly_line(tmp_path):
    with socket.socket() as probe:                           # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    chat = Chat(tmp_path, url)
    try:
        chat.expect("you>")
        chat.expect("Ollama is not answering at")
        start = chat.transcript
        chat.say("/memories")
        chat.expect("Muninn remembers nothing you can see here yet.")   # the local commands work
        chat.say("hello")
        chat.expect("muninn> Sorry, I can't think right now")
        chat.say("/quit")
        assert chat.wait() == 0
    finally:
        chat.close()
    assert "start it with `ollama serve`" in start and "WARNING" not in start and "ERROR" not in start
    assert "Traceback" not in chat.transcript
