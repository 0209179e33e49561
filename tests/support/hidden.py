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


def absent(folder: Path, module: str) -> str:
    """A folder to put on PYTHONPATH where `module`, a submodule of a namespace package
    (`opentelemetry.configuration`), is not installed: found there first, its import fails
    as a missing module's does. For a command that brings its own sitecustomize
    (`opentelemetry-instrument`), where `hiding` cannot run."""
    package = folder.joinpath(*module.split("."))
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
    )
    return str(folder)
