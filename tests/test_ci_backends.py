"""CI cannot go green by skipping: `.ci/run` sets CI=true, and every test that skips for a
missing backend does it through `tests/support/backends.unavailable`, which fails under it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

HELPER = REPO / "tests" / "support" / "backends.py"
# Ways a test can skip itself, other than through the helper.
SKIPS = re.compile(r"pytest\.skip\(|\bskipif\b|importorskip|pytest\.mark\.skip\b|pytest\.xfail\(")


def test_ci_run_sets_ci_true_before_the_suite():
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "export CI=true" in lines
    assert lines.index("export CI=true") < lines.index("bash scripts/test.sh")


def test_no_test_skips_except_through_the_helper():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path not in (HELPER, Path(__file__).resolve())
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if SKIPS.search(line)
    ]
    assert not found, "skip through tests.support.backends.unavailable, which fails under CI=true:\n" + "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("ci, outcome", [("true", "1 failed"), ("", "1 skipped")])
def test_a_missing_backend_skips_locally_and_fails_under_ci(tmp_path, ci, outcome):
    (tmp_path / "test_needs_backend.py").write_text(
        "from tests.support.backends import unavailable\n\n"
        "def test_needs_backend():\n"
        "    unavailable('the backend is not installed')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": ci}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout, done.stdout[-2000:]
    if ci:
        assert "CI requires it: the backend is not installed" in done.stdout
