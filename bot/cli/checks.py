"""One finding of `muninn doctor`: what was checked, whether it is fine, and what to run if not."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    """One finding: what was checked, whether it is fine, what was found, and what to run if not."""
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        """The check as `muninn doctor --json` prints it."""
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}
