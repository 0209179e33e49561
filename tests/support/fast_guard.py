"""The fast set (`-m "not slow"`) starts no process and runs no training: the README promises it.

`guard()` replaces, for the time of one test phase, every way a test in this suite could start a
process and MindSpore's `Model.train` with one that fails the test. It replaces where processes
are made, not `subprocess.Popen` itself, so code under test may still wrap `Popen.__init__`
(the instrumentor does): `subprocess`'s fork_exec and `os.posix_spawn[p]` (every `Popen`, so
`run`, `check_output`, asyncio), `os.fork`/`os.forkpty`/`os.system`, and `multiprocessing`'s
process start and fork_exec. tests/conftest.py puts it around the setup, call and
teardown of every test not marked slow. The refusal is a pytest outcome (a BaseException), so
code that catches `Exception` cannot swallow it, and one made on another thread still fails the
test when the phase ends.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy.testing  # noqa: F401  (importing it runs `lscpu` once: before any guard, not in a test)
import pytest

SUBPROCESS = "fast test started a subprocess: mark it slow"
TRAINING = "fast test ran a real training (Model.train): mark it slow"


def _targets() -> list[tuple[object, str, str, str]]:
    """(owner, attribute, message, what) for each thing the fast set must not call."""
    targets: list[tuple[object, str, str, str]] = [
        (subprocess, "_fork_exec", SUBPROCESS, "subprocess.Popen"),
        (_posixsubprocess, "fork_exec", SUBPROCESS, "fork_exec"),
        (multiprocessing.process.BaseProcess, "start", SUBPROCESS, "multiprocessing Process.start"),
    ]
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            targets.append((os, name, SUBPROCESS, f"os.{name}"))
    model = sys.modules.get("mindspore.train.model")  # only once a test module imported MindSpore
    if model is not None:
        targets.append((model.Model, "train", TRAINING, "mindspore Model.train"))
    return targets


@contextlib.contextmanager
def guard() -> Iterator[None]:
    refused: list[str] = []  # also what a thread the test started tried: its failure is not the test's

    def refuse(message: str, what: str):
        def refused_call(*args, **kwargs):
            refused.append(f"{message} ({what})")
            pytest.fail(refused[-1])

        return refused_call

    targets = _targets()
    saved = [(owner, name, vars(owner)[name]) for owner, name, _, _ in targets]
    try:
        for owner, name, message, what in targets:
            setattr(owner, name, refuse(message, what))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if refused:
        pytest.fail("; ".join(dict.fromkeys(refused)))
