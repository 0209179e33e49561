"""The log bridge against a real OTLP receiver: one oversized record no longer costs its
batch (bodies and attributes are bounded), and the HTTP exporter's own `urllib3` records
are not shipped back."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from mindspore.train import Callback

from otel_mindformers import MonitorCallback
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.log_bridge import MAX_ATTRIBUTE_CHARS, MAX_BODY_CHARS
from tests.support import training

pytestmark = pytest.mark.slow  # real training runs

SCRIPT = "train_script"
REPO = Path(__file__).resolve().parent.parent


class _Lines(Callback):
    """One line per step, and at step 3 a 5 MiB line with a 1 MiB `extra` and a traceback."""

    def __init__(self) -> None:
        self.log = logging.getLogger(SCRIPT)

    def on_train_step_end(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        self.log.warning("step %d done", step)
        if step == 3:
            try:
                raise ValueError("x" * (1 << 20))
            except ValueError:
                self.log.exception("huge " + "y" * (5 << 20), extra={"payload": "z" * (1 << 20)})


@pytest.fixture
def debug_logging():
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    yield
    root.setLevel(level)


def _monitor(tmp_path, endpoint: str, protocol: str) -> MonitorCallback:
    return MonitorCallback(
        {
            "interval": 5,
            "output_type": ["otlp"],
            "json_log_path": str(tmp_path / "m.json"),
            "otlp": {"endpoint": endpoint, "protocol": protocol, "export_interval": 0.2},
            "logs": {"enable": True, "level": "DEBUG"},
        }
    )


def test_an_oversized_record_is_cut_and_its_batch_arrives(workdir, otlp_receiver, debug_logging):
    training.train([_monitor(workdir, otlp_receiver.grpc_endpoint, "grpc"), _Lines()], steps=40)
    assert otlp_receiver.wait_for(lambda rx: len(rx.logs(SCRIPT)) >= 41)
    logs = otlp_receiver.logs(SCRIPT)
    assert sorted(r.body for r in logs if r.body.startswith("step")) == sorted(f"step {i} done" for i in range(1, 41))
    (huge,) = [r for r in logs if r.body.startswith("huge")]
    assert len(huge.body) <= MAX_BODY_CHARS and "characters cut" in huge.body
    assert len(huge.attributes["payload"]) <= MAX_ATTRIBUTE_CHARS
    assert len(huge.attributes["exception.message"]) <= MAX_ATTRIBUTE_CHARS
    assert huge.attributes["exception.type"] == "ValueError"
    assert len(huge.attributes["exception.stacktrace"]) <= MAX_BODY_CHARS  # its end: the raise
    assert huge.attributes[semconv.ATTR_LOG_TRUNCATED] > 7 << 20


def test_the_http_exporters_own_records_are_not_shipped(workdir, otlp_receiver, debug_logging):
    training.train([_monitor(workdir, otlp_receiver.http_endpoint, "http/protobuf"), _Lines()], steps=40)
    assert otlp_receiver.wait_for(lambda rx: len(rx.logs(SCRIPT)) >= 41)
    scopes = {record.scope for record in otlp_receiver.logs()}
    assert not any(scope.startswith("urllib3") for scope in scopes), scopes


def test_a_root_level_above_logs_level_is_said_at_start():
    from opentelemetry.sdk._logs import LoggerProvider

    from otel_mindformers.config import LogsConfig
    from otel_mindformers.telemetry.log_bridge import LogBridge, RunCorrelation

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    ours, root = logging.getLogger("otel_mindformers"), logging.getLogger()
    keep, level = Keep(), root.level
    ours.addHandler(keep)
    root.setLevel(logging.WARNING)  # what a script that never configures logging has
    try:
        bridge = LogBridge.start(
            LogsConfig(enable=True, level="INFO"), LoggerProvider(), RunCorrelation(0, None, None, None)
        )
        bridge.close()
    finally:
        ours.removeHandler(keep)
        root.setLevel(level)
    (said,) = [m for m in seen if "root logger's level is WARNING" in m]
    assert "logs.level is INFO" in said and "setLevel(logging.INFO)" in said


_SCRIPT_THAT_NEVER_CONFIGURES_LOGGING = """
import logging, sys
from mindspore.train import Callback
from otel_mindformers import MonitorCallback
from tests.support import training

class Warns(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] == 2:
            logging.getLogger("train_script").warning("loss looks odd at step 2")

monitor = MonitorCallback({
    "interval": 5, "output_type": ["otlp"], "json_log_path": sys.argv[2] + "/m.json",
    "otlp": {"endpoint": sys.argv[1], "export_interval": 0.2},
    "logs": {"enable": True, "level": "INFO"},
})
training.train([monitor, Warns()], steps=4)
logging.getLogger("train_script").warning("after training")
"""


def test_a_script_that_never_configures_logging_keeps_its_warnings_on_the_console(tmp_path, otlp_receiver):
    # Python prints such a script's warnings through logging.lastResort, used only while no
    # handler is found: the bridge's handler on the root must not silence the console.
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT_THAT_NEVER_CONFIGURES_LOGGING, otlp_receiver.grpc_endpoint, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "loss looks odd at step 2" in lines  # the script's, during the run, as Python prints it
    assert any("logs.level is INFO, but the root logger's level is WARNING" in line for line in lines)  # ours
    assert "after training" in lines  # and after the run, with the bridge gone
    assert [log.body for log in otlp_receiver.logs("train_script")] == ["loss looks odd at step 2"]  # shipped too
