"""Packages made absent for a fresh interpreter, as on a machine that lacks them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def hiding(folder: Path, modules: Iterable[str]) -> str:
    """A folder to put first on PYTHONPATH: its sitecustomize makes each of `modules`
    unimportable (`sys.modules[name] = None`) before the program runs."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"sys.modules[{module!r}] = None\n" for module in modules)
    (folder / "sitecustomize.py").write_text("import sys\n" + lines)
    return str(folder)
