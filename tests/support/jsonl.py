"""Reading JSON-lines files (the `json_file` output, diagnosis dumps) back in tests."""

from __future__ import annotations

import json
from pathlib import Path


def json_lines(path: Path) -> list[dict]:
    """Every line of `path`, parsed; a line that is not JSON fails the read."""
    return [json.loads(line) for line in path.read_text().splitlines()]
