"""Correlation both ways, end to end: a real training under `opentelemetry-instrument`
exporting to a real OTLP receiver, with the standard logging switch on.

- log records of the script's logger and MindFormers' own arrive with rank and step, and
  those made during a sampled step carry that step span's trace and span ids;
- a user span and an HTTP client span (the requests instrumentation, calling a real server
  on 127.0.0.1) made inside `otel_mindformers.phase("upload")` are children of the phase span;
- child processes started inside the phase see a TRACEPARENT naming the phase span.
"""

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from otel_mindformers.integration.environment_variables import (
    OTEL_PYTHON_MINDFORMERS_CONFIG,
    OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT,
)
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.log_bridge import AUTO_INSTRUMENTATION_VARIABLE
from tests.support.instrumented import child_env, instrumented, run
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SCRIPT = str(REPO / "tests" / "support" / "correlated_train.py")
STEPS, UPLOAD_AT = 12, 3


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def correlated_run(tmp_path_factory):
    """One instrumented training shared by the tests below (a run costs ~15 s here)."""
    from tests.support.otlp_receiver import OtlpReceiver

    workdir = tmp_path_factory.mktemp("correlated")
    config = workdir / "monitor.yaml"
    config.write_text(
        "monitor_config:\n  interval: 5\n  grad_monitor: false\n  output_type: [json_file]\n"
        f"  json_log_path: {workdir / 'train_metric.json'}\n"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/checkpoint"
    with OtlpReceiver() as receiver:
        env = child_env(
            receiver,
            OTEL_SERVICE_NAME="correlated",
            **{
                OTEL_PYTHON_MINDFORMERS_CONFIG: str(config),
                AUTO_INSTRUMENTATION_VARIABLE: "true",
                OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT: "true",
            },
        )
        command = instrumented("python", SCRIPT, "--steps", str(STEPS), "--upload-at", str(UPLOAD_AT), "--url", url)
        result = run(command, env, workdir)
        assert "training finished" in result.stdout
        assert receiver.wait_for(
            lambda rx: (
                len(rx.spans(semconv.SPAN_STEP)) == 4
                and rx.spans("GET")
                and len([r for r in rx.logs("train_script") if r.attributes.get("test_step")]) >= STEPS
            )
        )
        yield receiver, result.stdout
    server.shutdown()
    server.server_close()


def test_log_records_carry_rank_step_and_the_sampled_step_spans_ids(correlated_run):
    receiver, _ = correlated_run
    steps = {s.attributes[semconv.ATTR_STEP]: s for s in receiver.spans(semconv.SPAN_STEP)}
    assert sorted(steps) == [1, 5, 10, 12]
    mindformers_scopes = {r.scope for r in receiver.logs() if r.scope.startswith("mindformers")}
    assert mindformers_scopes, "no record from MindFormers' logger"
    for scope in ["train_script", *mindformers_scopes]:
        records = {r.attributes["test_step"]: r for r in receiver.logs(scope) if r.attributes.get("test_step", 0) > 0}
        assert sorted(records) == list(range(1, STEPS + 1)), scope
        for step, record in records.items():
            assert record.resource[semconv.ATTR_RANK] == 0
            assert (record.attributes[semconv.ATTR_RANK], record.attributes[semconv.ATTR_STEP]) == (0, step - 1)
            if step in (1, 5, 10):
                assert (record.trace_id, record.span_id) == (steps[step].trace_id, steps[step].span_id), (scope, step)
            elif step != UPLOAD_AT:
                assert record.span_id == "", (scope, step)


def test_spans_made_inside_a_phase_are_its_children(correlated_run):
    receiver, _ = correlated_run
    (upload,) = receiver.spans("mindformers.phase.upload")
    (run_span,) = receiver.spans(semconv.SPAN_RUN)
    assert upload.trace_id == run_span.trace_id  # the phase belongs to the run's trace
    (user,) = receiver.spans("user.upload.part")
    (http,) = receiver.spans("GET")
    for child in (user, http):
        assert (child.trace_id, child.parent_span_id) == (upload.trace_id, upload.span_id), child.name
    # The requests instrumentation's attributes (old or stable HTTP conventions, by its opt-in).
    assert http.attributes.get("http.status_code", http.attributes.get("http.response.status_code")) == 200
    # A record logged inside the phase carries the phase span.
    (inside,) = [r for r in receiver.logs("train_script") if r.attributes.get("test_step") == -1]
    assert (inside.trace_id, inside.span_id) == (upload.trace_id, upload.span_id)


def test_child_processes_started_in_a_phase_see_its_traceparent(correlated_run):
    receiver, stdout = correlated_run
    (upload,) = receiver.spans("mindformers.phase.upload")
    plain, helper = re.search(r"CHILD_TRACEPARENT plain=(\S+) helper=(\S+)", stdout).groups()
    for seen in (plain, helper):  # Popen wrapped (OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT), trace_environment()
        version, trace_id, parent_id, flags = seen.split("-")
        assert (version, trace_id, parent_id) == ("00", upload.trace_id, upload.span_id), seen
        assert int(flags, 16) & 1  # sampled
