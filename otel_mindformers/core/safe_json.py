"""JSON from files and replies other processes write: nesting too deep for the parser is bad
JSON like any other. `json.loads` raises RecursionError for it (a line of 100,000 `[`), which
the readers' `except ValueError` let through: one such line stopped `report`, or a training's
start reading its log or the job ledger."""

from __future__ import annotations

import json
from typing import Any


class TooDeep(ValueError):
    """Nested deeper than the parser can follow."""


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`; a ValueError (TooDeep) where it nests too deep to parse."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("nested too deep") from None


__all__ = ["TooDeep", "loads"]
