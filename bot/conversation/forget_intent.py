"""Asking Muninn in plain words to forget: "forget that I live in Oslo", "don't remember this".

Detection is deliberately conservative: the whole message (after a leading mention or
greeting) must be the request, so "I always forget that I live in Oslo" or "can you forget
things?" are ordinary conversation. A request names what to forget (`about`), points back at
the person's previous message ("this", "that", "what I just said"; `about` is None), or asks
for everything (`everything`, answered with a pointer to /memory forget-all).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ForgetIntent:
    """A forget request found by `detect`: the words to forget, the previous message, or everything."""
    about: str | None        # the words to look for; None = the person's previous message
    everything: bool = False


_LEAD = r"^(?:@\S+[\s,:]*)*(?:(?:hey|hi|ok|okay|so|muninn|please|pls|and|also|actually)[\s,:!]+)*"
_POLITE_END = r"[\s,]*(?:please|pls|thanks|thank you)?[\s.!]*$"
_FORGET = r"(?:forget|unlearn|erase|delete|remove|drop)"
_DONT_REMEMBER = r"(?:don'?t|do not|dont|never|please don'?t|stop) (?:remember|store|keep|save|memori[sz]e)"
_BACK = r"(?:this|that|it|what i (?:just )?(?:said|wrote|told you)|my (?:last|previous) message)"

_EVERYTHING = re.compile(
    _LEAD + rf"{_FORGET}\s+(?:everything|all)(?:\s+(?:you know|you remember|you have|you learned))?"
            rf"\s+about me{_POLITE_END}", re.I)
_PREVIOUS = re.compile(_LEAD + rf"(?:{_FORGET}|{_DONT_REMEMBER})\s+{_BACK}{_POLITE_END}", re.I)
_NAMED = re.compile(
    _LEAD + rf"(?:{_FORGET}|{_DONT_REMEMBER})\s+(?:the fact that|that|about|what i (?:said|told you) about)\s+"
            rf"(?P<about>.+?){_POLITE_END}", re.I | re.S)
_MAX_CHARS = 300


def detect(text: str) -> ForgetIntent | None:
    """The forget request this whole message makes, or None."""
    text = " ".join(text.split())
    if not text or len(text) > _MAX_CHARS or text.endswith("?"):
        return None
    if _EVERYTHING.match(text):
        return ForgetIntent(about=None, everything=True)
    if _PREVIOUS.match(text):
        return ForgetIntent(about=None)
    named = _NAMED.match(text)
    if named:
        about = named.group("about").strip(" .!\"'“”")
        if about and any(ch.isalnum() for ch in about):
            return ForgetIntent(about=about)
    return None
