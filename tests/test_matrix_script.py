"""`scripts/matrix.sh` itself, on a row whose venv is a stand-in (a `python` that installs
nothing and runs no test): where the row's venv lands on PATH, and the names it refuses."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # runs the script in bash

ROW = "ms2.8.0"
STAND_IN = """#!/bin/bash
# A row venv's python: `-m pip ...` does nothing; `-m pytest` keeps the PATH it was given.
if [ "$1 $2" = "-m pytest" ]; then
  printf '%s\\n' "$PATH" > "$(dirname "$0")/../pytest_path"
  echo "1 passed in 0.01s"
fi
exit 0
"""


def _matrix(*rows, matrix_dir):
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "matrix.sh"), *rows],
        cwd=REPO,
        env={**os.environ, "MATRIX_DIR": str(matrix_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_absolute_matrix_dir_puts_the_rows_own_venv_first_on_path(tmp_path):
    """msrun's workers start the `python` first on PATH: it was "$PWD/" + the absolute
    MATRIX_DIR, a folder that does not exist (issue 46, item 18)."""
    bin_dir = tmp_path / ROW / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(STAND_IN)
    (bin_dir / "python").chmod(0o755)
    done = _matrix(ROW, matrix_dir=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    first = (tmp_path / ROW / "venv" / "pytest_path").read_text().split(":")[0]
    assert first == str(bin_dir) and os.path.isdir(first)
    assert "1 passed" in (tmp_path / ROW / "result").read_text()


def test_an_empty_row_name_prints_the_usage(tmp_path):
    done = _matrix("", matrix_dir=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: scripts/matrix.sh [ROW...]; rows: ms2.7.0-mf1.6.0 "), done.stderr
    assert "bad array subscript" not in done.stderr
