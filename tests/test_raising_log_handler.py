"""A user's log handler that raises must not stop training through our own messages: the
grad_monitor warning (read on a sampled step), a failing custom monitor's warnings, the
stop-on-NaN warning, all on the training thread."""

from __future__ import annotations

import logging

import pytest

from otel_mindformers import MonitorCallback
from tests.support import training

pytestmark = pytest.mark.slow  # real training runs


class _Raising(logging.Handler):
    """A handler whose emit raises (nothing makes user handlers catch their errors)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        raise RuntimeError("user handler bug")

    def handle(self, record: logging.LogRecord) -> bool:  # no handleError safety net
        self.emit(record)
        return True


@pytest.fixture
def raising_root_handler():
    root = logging.getLogger()
    handler = _Raising()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_our_warnings_on_the_training_thread_do_not_stop_training(tmp_path, raising_root_handler, capfd):
    monitor = MonitorCallback(
        {
            "interval": 2,
            "output_type": ["json_file"],
            "json_log_path": str(tmp_path / "m.json"),
            "custom_monitor_callback": "tests.support.monitors.Raising",
            "alert_config": {"enable_alert": True, "stop_on_nonfinite": True},
        }
    )
    training.train([monitor], steps=8, faults=training.Faults(nan_at={6}))

    ours = [r for r in raising_root_handler.records if r.name.startswith("otel_mindformers")]
    messages = " | ".join(r.getMessage() for r in ours)
    assert "custom monitor" in messages and "stopping training" in messages
    # Each record names the module that logged it, not the guard.
    assert {r.pathname for r in ours}.isdisjoint({"guarded_log.py"}) and all(
        not r.pathname.endswith("guarded_log.py") for r in ours
    )
    assert monitor.progress.step == 6  # stopped by the NaN rule, as asked, not by the handler
    assert capfd.readouterr().err.count("a logging handler raised RuntimeError") <= 1
