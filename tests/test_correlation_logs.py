"""Python logging shipped as OTel log records during real MindSpore training: rank, step,
the sampled step span's ids, the level threshold, the rate limit, and the zero-code switch."""

import logging

import pytest
from mindspore.train import Callback
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

from otel_mindformers.config import LogsConfig
from otel_mindformers.names import semconv
from otel_mindformers.runtime.callback import MonitorCallback
from otel_mindformers.telemetry.log_bridge import AUTO_INSTRUMENTATION_VARIABLE, RateLimit, logs_enabled, severity
from tests.support.in_memory import Capture as InMemoryCapture
from tests.support.training import train

pytestmark = pytest.mark.slow  # real training runs

SCRIPT_LOGGER = "train_script"


class StepLogger(Callback):
    """What a training script's callback logs: one line as each step begins (and a chatty
    burst at step `burst_at`), with the step it is about in `extra`."""

    def __init__(self, burst_at=None, burst=0):
        self.log = logging.getLogger(SCRIPT_LOGGER)
        self.burst_at, self.burst = burst_at, burst

    def on_train_step_begin(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        self.log.warning("step %d begins", step, extra={"test_step": step})
        self.log.debug("debug detail of step %d", step)
        if step == self.burst_at:
            for i in range(self.burst):
                self.log.warning("chatty line %d", i)


class Capture(InMemoryCapture):
    def callback(self, tmp_path, **config):
        return MonitorCallback(
            {
                "interval": 5,
                "grad_monitor": False,
                "output_type": ["json_file"],
                "json_log_path": str(tmp_path / "m.json"),
                **config,
            },
            **self.providers(),
        )

    def records(self, logger=SCRIPT_LOGGER):
        return [d.log_record for d in self.logs.get_finished_logs() if d.instrumentation_scope.name == logger]

    def step_spans(self):
        return {
            s.attributes[semconv.ATTR_STEP]: s for s in self.spans.get_finished_spans() if s.name == semconv.SPAN_STEP
        }


@pytest.fixture
def capture(workdir):
    logging.getLogger(SCRIPT_LOGGER).setLevel(logging.DEBUG)
    yield Capture()
    logging.getLogger(SCRIPT_LOGGER).setLevel(logging.NOTSET)


def test_records_carry_rank_step_and_the_span_of_the_sampled_step_they_were_made_in(capture, tmp_path):
    train([StepLogger(), capture.callback(tmp_path, logs={"enable": True})], steps=12)

    records = {r.attributes["test_step"]: r for r in capture.records()}
    assert sorted(records) == list(range(1, 13))
    spans = capture.step_spans()
    assert sorted(spans) == [1, 5, 10, 12]
    for step, record in records.items():
        assert record.attributes[semconv.ATTR_RANK] == 0
        assert record.attributes[semconv.ATTR_STEP] == step - 1  # the last finished step
        assert record.severity_text == "WARN" and record.body == f"step {step} begins"
        if step in (1, 5, 10):  # sampled steps: the ids of the span the worker made later
            context = spans[step].get_span_context()
            assert (record.trace_id, record.span_id) == (context.trace_id, context.span_id), step
        else:  # unsampled (and the last step, which is sampled only once training has ended)
            assert record.span_id == 0, step
    # The step span is in the job step's trace, under its root, with the step's real times.
    (root,) = [
        s
        for s in capture.spans.get_finished_spans()
        if s.context.trace_id == spans[5].context.trace_id and s.name == semconv.SPAN_JOB_STEP
    ]
    assert spans[5].parent.span_id == root.context.span_id and root.parent is None
    assert spans[5].start_time < records[5].timestamp < spans[5].end_time


def test_the_level_threshold_and_the_loggers_own_level_decide_what_is_sent(capture, tmp_path):
    train([StepLogger(), capture.callback(tmp_path, logs={"enable": True, "level": "DEBUG"})], steps=3)
    assert sorted(r.body for r in capture.records() if r.severity_text == "DEBUG") == [
        f"debug detail of step {s}" for s in (1, 2, 3)
    ]

    capture.logs.clear()
    train([StepLogger(), capture.callback(tmp_path, logs={"enable": True, "level": "ERROR"})], steps=3)
    assert capture.records() == []


def test_the_rate_limit_holds_for_a_logger_emitting_ten_thousand_lines(capture, tmp_path):
    limit = 50
    train(
        [
            StepLogger(burst_at=2, burst=10_000),
            capture.callback(tmp_path, logs={"enable": True, "rate_limit_per_logger": limit}),
        ],
        steps=4,
    )
    records = capture.records()
    dropped = [r for r in records if semconv.ATTR_LOGS_DROPPED in r.attributes]
    sent = [r for r in records if semconv.ATTR_LOGS_DROPPED not in r.attributes]
    assert len(sent) == limit  # 4 step lines + 46 chatty lines in the one window of the run
    (summary,) = dropped
    assert summary.attributes[semconv.ATTR_LOGS_DROPPED] == 4 + 10_000 - limit
    assert "rate_limit_per_logger" in summary.body and summary.severity_text == "WARN"


def test_logging_is_left_as_it_was_after_the_run(capture, tmp_path):
    root = logging.getLogger()
    before = list(root.handlers)
    train([StepLogger(), capture.callback(tmp_path, logs={"enable": True})], steps=2)
    assert root.handlers == before
    logging.getLogger(SCRIPT_LOGGER).warning("after the run")
    assert "after the run" not in [r.body for r in capture.records()]


def test_off_by_default_and_the_standard_variable_turns_it_on(monkeypatch):
    assert not logs_enabled(LogsConfig())
    monkeypatch.setenv(AUTO_INSTRUMENTATION_VARIABLE, "true")
    assert logs_enabled(LogsConfig())
    assert not logs_enabled(LogsConfig(enable=False))  # the YAML's explicit word wins


def test_the_sdks_own_handler_stands_aside_during_the_run(capture, tmp_path):
    """Under zero-code with the standard variable the SDK put its handler on the root: during
    the run ours ships the records (once, with rank and step), after it the SDK's again."""
    sdk_logs = InMemoryLogRecordExporter()
    sdk_provider = LoggerProvider()
    sdk_provider.add_log_record_processor(SimpleLogRecordProcessor(sdk_logs))
    sdk_handler = LoggingHandler(logger_provider=sdk_provider)
    root = logging.getLogger()
    root.addHandler(sdk_handler)
    try:
        train([StepLogger(), capture.callback(tmp_path, logs={"enable": True})], steps=2)
        assert sdk_handler in root.handlers
        logging.getLogger(SCRIPT_LOGGER).warning("after the run")
    finally:
        root.removeHandler(sdk_handler)
    assert [d.log_record.body for d in sdk_logs.get_finished_logs()] == ["after the run"]
    assert len(capture.records()) == 2


def test_rate_limit_windows():
    limit = RateLimit(2, window=10.0)
    assert [limit.admit("a", t) for t in (0.0, 1.0, 2.0, 3.0)] == [(True, 0), (True, 0), (False, 0), (False, 0)]
    assert limit.admit("b", 3.0) == (True, 0)  # per logger
    assert limit.admit("a", 10.0) == (True, 2)  # a new window says what the last one dropped
    limit.admit("a", 11.0)
    limit.admit("a", 12.0)
    assert limit.drain() == {"a": 1}


def test_severity_follows_the_log_data_model():
    assert [severity(level)[1] for level in (5, 10, 20, 30, 40, 50)] == [
        "TRACE",
        "DEBUG",
        "INFO",
        "WARN",
        "ERROR",
        "FATAL",
    ]
    assert severity(25)[0].value == severity(20)[0].value + 3  # a custom level between two
