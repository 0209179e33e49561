"""Docs and docstrings name files that exist.

A path that names this project's layout — its top folders (`docs/`, `tests/`, ...), the
package's folders (`runtime/parts.py`, `otel_mindformers/outputs/jsonl.py`), a page of docs
(`stragglers.md`) or a module of the package (`parts.py`) — must name a tracked file. Paths of
other projects (MindSpore's `dataset_helper.py`, a user's `train.py`, an output such as
`train_metric.json`) are not this project's layout and are left alone: a `.py` or `.md` name
that is not ours must say whose it is, by being in FOREIGN_NAMES with its project, and a path in
another repository is written `REPOSITORY:PATH` (`mind-cluster:docs/en/...`).
"""

from __future__ import annotations

import difflib
import re
import subprocess
from pathlib import PurePosixPath

import pytest

from otel_mindformers.names.phase_names import BUILT_IN_PHASES
from tests.support.paths import REPO

TRACKED = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
TOP_FOLDERS = {path.split("/")[0] for path in TRACKED if "/" in path}
PACKAGE_FOLDERS = {part for path in TRACKED if path.startswith("otel_mindformers/") for part in path.split("/")[1:-1]}
NAMES = {PurePosixPath(path).name for path in TRACKED}

# `.py` / `.md` names the docs quote from other projects, with whose they are.
FOREIGN_NAMES = {
    "dataset_helper.py": "MindSpore (mindspore/train/dataset_helper.py)",
    "npu_info_parser.py": "MindCluster's fault diagnosis",
    "loader.py": "a user's data loader, in an example stall message",
    "train.py": "a user's training script",
    "config.py": "a user's module",
}

PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:py|md|sh|toml|yaml|yml|css|js|proto))(?![\w/])")


def _ours(token: str) -> bool:
    """Whether a path-like token names this project's layout."""
    parts = token.lstrip("./").split("/")
    if len(parts) == 1:
        return token.endswith((".py", ".md")) and token not in FOREIGN_NAMES
    return parts[0] in TOP_FOLDERS | PACKAGE_FOLDERS | {"otel_mindformers"}


def _exists(token: str) -> bool:
    path = token.lstrip("./")
    if "/" not in path:
        return path in NAMES
    return any(tracked == path or tracked.endswith("/" + path) for tracked in TRACKED)


def _sources() -> list[str]:
    return sorted(
        path
        for path in TRACKED
        if path == "README.md"
        or (path.startswith("docs/") and path.endswith(".md"))
        or (path.startswith("otel_mindformers/") and path.endswith(".py"))
    )


def _missing(source: str) -> list[str]:
    text = (REPO / source).read_text(encoding="utf-8")
    return [
        f"{source}:{number}: {token}"
        for number, line in enumerate(text.splitlines(), 1)
        for token in PATH.findall(line)
        if _ours(token) and not _exists(token)
    ]


@pytest.mark.parametrize("source", _sources())
def test_every_path_a_page_or_docstring_names_exists(source):
    assert _missing(source) == []


def test_the_check_finds_a_file_that_does_not_exist(tmp_path):
    assert _ours("runtime/attempt.py") and not _exists("runtime/attempt.py")
    assert _ours("environment.md") and not _exists("environment.md")
    assert _ours("runtime/parts.py") and _exists("runtime/parts.py")
    assert not _ours("mindformers/trainer/trainer.py")
    assert PATH.findall("`mind-cluster:docs/en/x.md`") == []


# A measured time in the package's text: any µs / us figure, or a cost / measurement in ms or s.
TIMING = re.compile(
    r"\d[\d.,]*(?:[-–]\d[\d.,]*)?\s?(?:µs|us)\b"
    r"|\b(?:costs?|costing|measured|took|takes)\b[^.\n]{0,40}?\d[\d.,]*(?:[-–]\d[\d.,]*)?\s?(?:ms|s)\b"
)


def _timings(source: str) -> list[str]:
    text = (REPO / source).read_text(encoding="utf-8")
    return [
        f"{source}:{number}: {match.group(0)}"
        for number, line in enumerate(text.splitlines(), 1)
        for match in TIMING.finditer(line)
    ]


@pytest.mark.parametrize("source", [s for s in _sources() if s.endswith(".py")])
def test_timings_live_in_the_performance_page_not_in_the_code(source):
    """A figure measured on one machine goes stale where code quotes it: it belongs in
    docs/performance.md (or the feature's page), with how it was measured."""
    assert _timings(source) == []


def test_the_timing_check_finds_a_quoted_figure():
    assert TIMING.search("measured at ~25 us per step")
    assert TIMING.search("it costs about 1.5 ms of CPU")
    assert TIMING.search("start 2-13 ms") is None  # a bare figure in ms is a bound or a setting
    assert TIMING.search("a sampled step every 50 ms") is None


def test_the_docs_phases_near_a_built_in_name_use_that_name():
    """`phase("evaluate")` copied from a page is a user phase, counted as `other`: a phase the
    docs name that is nearly a built-in one (docs/time.md) must be the built-in one."""
    near_misses = []
    for page in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        for name in re.findall(r"""phase\(["']([^"']+)["']""", page.read_text(encoding="utf-8")):
            close = difflib.get_close_matches(name, BUILT_IN_PHASES, n=1, cutoff=0.6)
            if close and close[0] != name:
                near_misses.append(f"{page.name}: phase({name!r}), the built-in one is {close[0]!r}")
    assert not near_misses
