"""The OTLP log queue against a real receiver and real training runs: a burst of the
documented size (`LOGS_BURST`, docs/logs.md) arrives whole beside the run's own records; a burst past the queue is
counted as dropped in this process, with the count at the run's end, and not blamed on the
collector. (The SDK's default queue of 2048 dropped most of such a burst.)"""

from __future__ import annotations

import logging
import re

import pytest
from mindspore.train import Callback

from otel_mindformers import MonitorCallback
from otel_mindformers.config import ConfigError, load_monitor_config
from otel_mindformers.config.limits import LOGS_BURST, LOGS_QUEUE_SIZE, MAX_LOGS_QUEUE_SIZE
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from tests.support import training

SCRIPT = "burst_script"


class _Burst(Callback):
    """`lines` WARNING lines in a tight loop at step 2; then waits until each of them has
    arrived at `receiver` or been counted as dropped by the queue (the rest of the run must
    not race the burst's drain)."""

    def __init__(self, lines: int, receiver) -> None:
        self.log = logging.getLogger(SCRIPT)
        self.lines = lines
        self.receiver = receiver

    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] != 2:
            return
        for i in range(self.lines):
            self.log.warning("burst line %d", i)
        reporter = ExportErrorReporter.installed()
        assert reporter is not None

        def settled(rx) -> bool:
            return rx.log_count(SCRIPT) + reporter.dropped.get("Log", 0) >= self.lines

        assert self.receiver.wait_for(settled, timeout=120)


def _run(tmp_path, receiver, lines: int, otlp: dict | None = None) -> None:
    monitor = MonitorCallback(
        {
            "interval": 5,
            "output_type": ["otlp"],
            "json_log_path": str(tmp_path / "m.json"),
            "otlp": {"endpoint": receiver.grpc_endpoint, "insecure": True, **(otlp or {})},
            "logs": {"enable": True, "rate_limit_per_logger": lines + 1},
            "shutdown_timeout": 120.0,
        }
    )
    training.train([monitor, _Burst(lines, receiver)], steps=6)


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("otel_mindformers")]


@pytest.mark.slow  # a real training run
def test_a_burst_of_the_documented_size_arrives_whole(workdir, otlp_receiver, caplog):
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        _run(workdir, otlp_receiver, LOGS_BURST)
    # Train end flushed the queue: what did not arrive within a few seconds more never will.
    otlp_receiver.wait_for(lambda rx: rx.log_count(SCRIPT) >= LOGS_BURST, timeout=10)
    messages = _messages(caplog)
    assert otlp_receiver.log_count(SCRIPT) == LOGS_BURST, messages
    assert not any("queue" in m or "dropped" in m for m in messages), messages


@pytest.mark.slow  # a real training run
def test_a_burst_past_the_queue_is_counted_as_dropped_by_the_queue(workdir, otlp_receiver, caplog):
    lines, queue = 4000, 256
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        _run(workdir, otlp_receiver, lines, otlp={"logs_queue_size": queue})
    received = otlp_receiver.log_count(SCRIPT)
    assert queue <= received < lines  # the queue's worth at least: the rest was dropped
    messages = _messages(caplog)
    assert not any("is failing or too slow" in m for m in messages), messages  # the collector is fine
    (first,) = [m for m in messages if "queue for Log records is full" in m]
    assert "dropped in this process" in first and "otlp.logs_queue_size" in first
    (total,) = [m for m in messages if "full SDK queues dropped" in m]
    counted = re.search(r"dropped (\d+) Log record\(s\) in this run before export", total)
    assert counted is not None and "not at the collector" in total, total
    # The SDK counts a drop before it queues; an export that empties the queue in between
    # makes a drop that lost nothing: at most one per exported batch.
    lost = lines - received
    assert lost <= int(counted.group(1)) <= lost + received // queue + 1, (received, total)


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "must be >= 1, got 0"),
        ("8k", "expected an integer, got '8k'"),
        (MAX_LOGS_QUEUE_SIZE + 1, f"must be <= {MAX_LOGS_QUEUE_SIZE}"),
    ],
)
def test_a_bad_logs_queue_size_is_one_error_naming_the_key(value, message, workdir):
    with pytest.raises(ConfigError) as info:
        load_monitor_config({"monitor_config": {"otlp": {"logs_queue_size": value}}})
    assert f"monitor_config.otlp.logs_queue_size: {message}" in str(info.value)
    assert len(info.value.problems) == 1


def test_the_queue_size_is_the_key_else_the_standard_variable_else_ours(monkeypatch):
    monkeypatch.delenv("OTEL_BLRP_MAX_QUEUE_SIZE", raising=False)
    assert load_monitor_config({}).otlp.resolved_logs_queue_size() == LOGS_QUEUE_SIZE
    monkeypatch.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "3000")
    assert load_monitor_config({}).otlp.resolved_logs_queue_size() == 3000
    assert load_monitor_config({"otlp": {"logs_queue_size": 100}}).otlp.resolved_logs_queue_size() == 100
    monkeypatch.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "lots")  # unusable: ours, not the SDK's 2048
    assert load_monitor_config({}).otlp.resolved_logs_queue_size() == LOGS_QUEUE_SIZE


def test_a_logs_queue_size_the_sdks_own_provider_overrides_is_said_to_be_ignored():
    """Under `opentelemetry-instrument` the SDK's logger provider and its queue are used."""
    from otel_mindformers.telemetry.providers import _ignored_settings

    config = load_monitor_config({"output_type": ["otlp"], "otlp": {"logs_queue_size": 100}})
    ignored = _ignored_settings(config.telemetry, {"logger_provider"}, builds_none=False)
    assert ignored == ["otlp.logs_queue_size (set OTEL_BLRP_MAX_QUEUE_SIZE instead)"]
    assert _ignored_settings(config.telemetry, {"meter_provider"}, builds_none=False) == []
