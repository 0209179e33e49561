"""JSON from files and replies other processes write: nesting too deep for the parser is bad
JSON like any other. `json.loads` raises RecursionError for it (a line of 100,000 `[`), which
the readers' `except ValueError` let through: one such line stopped `report`, or a training's
start reading its log or the job ledger. A line too long to be one of our records is
skipped over, never held whole (`bounded_lines`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TextIO

# No line we write comes near it; a file in a shared folder that is one line of gigabytes
# would otherwise be read whole, then parsed into several times its size.
MAX_LINE_CHARS = 16 * 2**20
TOO_LONG = f"longer than {MAX_LINE_CHARS // 2**20} MiB; not read"


class TooDeep(ValueError):
    """Nested deeper than the parser can follow."""


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`; a ValueError (TooDeep) where it nests too deep to parse."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("nested too deep") from None


def bounded_lines(handle: TextIO) -> Iterator[tuple[int, str | None]]:
    """(number, line) for each line of `handle`, from 1; None for a line longer than
    MAX_LINE_CHARS, which is skipped over a bounded piece at a time, never held."""
    number = 0
    while text := handle.readline(MAX_LINE_CHARS + 1):
        number += 1
        if len(text) <= MAX_LINE_CHARS:
            yield number, text
            continue
        while text and not text.endswith("\n"):  # the rest of it, a bounded piece at a time
            text = handle.readline(MAX_LINE_CHARS)
        yield number, None


__all__ = ["MAX_LINE_CHARS", "TOO_LONG", "TooDeep", "bounded_lines", "loads"]
