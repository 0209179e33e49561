"""Monitor configurations several test files train with."""

from __future__ import annotations

from pathlib import Path


def config(tmp_path: Path, **overrides) -> dict:
    """JSON lines only, at `tmp_path/m.json`, every 5th step unless `overrides` say otherwise."""
    base = {"interval": 5, "output_type": ["json_file"], "json_log_path": str(tmp_path / "m.json")}
    base.update(overrides)
    return base
