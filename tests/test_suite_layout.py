"""The suite's own layout (docs/testing.md): shared helpers live in tests/support, and every file
a test reads is inside the repository, so a fresh clone with nothing beside it passes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.paths import REPO

SOURCES = sorted(
    path for folder in ("tests", "benchmarks", "examples", "scripts") for path in (REPO / folder).rglob("*.py")
)
# Ways out of the checkout: the folder above it, or a machine's absolute path.
OUTSIDE = re.compile(r"REPO(_ROOT)?\.parent\b|\.parents\[[3-9]\]|[\"']/(work|home|root|mnt)/|\.\./shared\b")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_no_file_imports_a_test_file():
    found = [
        f"{path.relative_to(REPO)}: {module}"
        for path in SOURCES
        for module in sorted(_imported_modules(path))
        if module.split(".")[-1].startswith("test_") or module.startswith("test_")
    ]
    assert not found, "put what is shared in tests/support:\n" + "\n".join(found)


def test_no_file_reaches_outside_the_repository():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in SOURCES
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, "bring the file into the repository (tests/fixtures or examples):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "name", sorted(name for name, value in vars(paths).items() if name.isupper() and isinstance(value, Path))
)
def test_every_input_path_is_in_the_repository_and_exists(name):
    path = getattr(paths, name)
    assert path.is_relative_to(REPO) and path.exists(), path


def test_the_rule_files_are_found():
    assert paths.RULE_FILES and all(path.is_relative_to(REPO) for path in paths.RULE_FILES)
