"""Shared test setup.

MindSpore's generated protobuf modules need protobuf's pure-Python implementation, chosen
before anything imports protobuf (the OTLP receiver does): see otel_mindformers/__init__.py.
"""

import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fast_guard import guard  # noqa: E402
from tests.support.paths import FAKE_BIN  # noqa: E402
from tests.support.shm_segments import own_ipc_namespace  # noqa: E402

FAST_TEST_TIMEOUT_S = 60  # a fast test runs in well under a second; a minute means it hangs


def pytest_configure(config):
    """The session in an IPC namespace of its own, where it may be (root): the flight rings'
    shared memory that the trainings it kills leave (docs/flight_recorder.md) goes with its
    last process, and no test sees another session's."""
    own_ipc_namespace()


def _fast(item) -> bool:
    return item.get_closest_marker("slow") is None


def pytest_collection_modifyitems(config, items):
    """Fast tests get a tighter per-test limit than pyproject's `timeout` (pytest-timeout)."""
    for item in items:
        if _fast(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A test not marked slow starts no process and runs no training, fixtures included."""
    with guard() if _fast(item) else contextlib.nullcontext():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with guard() if _fast(item) else contextlib.nullcontext():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with guard() if _fast(item) else contextlib.nullcontext():
        return (yield)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a temp dir: importing mindformers creates ./output/log in the CWD."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def otlp_receiver():
    from tests.support.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def fake_npu_smi(monkeypatch, tmp_path):
    """Puts the fake npu-smi (tests/fixtures/bin) first on PATH; returns the file listing its calls."""
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "npu-smi.calls"
    monkeypatch.setenv("FAKE_NPU_SMI_LOG", str(log))
    return log
