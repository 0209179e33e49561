"""`ConfigError`: the one exception bad configuration raises, naming every problem's key."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """Invalid monitor configuration. Each of `problems` names a key and what is wrong with
    it; the message is the one problem, or all of them, one per line."""

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems) or ["invalid monitor configuration"]
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems)
        super().__init__(message)


def suggestion(name: object, candidates: Iterable[str]) -> str:
    """The closest candidate as ` (did you mean 'x'?)`, or an empty string."""
    match = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
