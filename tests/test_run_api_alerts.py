"""Alerts through the run API in real PyNative custom loops (tests/support/custom_loop.py): a
rule's stop reaching the loop as `run.should_stop`, its notices sent to a real webhook on
127.0.0.1, and a custom monitor that raises an alert and asks the loop to stop."""

from __future__ import annotations

import pytest

import otel_mindformers
from tests.support import custom_loop
from tests.support.jsonl import json_lines
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training

STEPS = 3000  # far more than the stop lets run


def _config(workdir, alerts, **more):
    return {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "m.json"),
        "shutdown_timeout": 5.0,
        "alert_config": {"enable_alert": True, **alerts},
        **more,
    }


def _notices(receiver):
    return [(r.body["rule"], r.body["status"], r.body["step"]) for r in receiver.requests]


def test_a_rules_stop_reaches_the_loop_and_its_notices_the_webhook(workdir):
    """Every loss is over the threshold: three anomalous sampled steps in a row stop the loop,
    at the first step boundary after the worker's batch holding step 3."""
    with WebhookReceiver() as receiver:
        alerts = {
            "loss_threshold": 0.0,
            "stop_after_anomalous_steps": 3,
            # One loss notice for the run: the loop may be far ahead of the worker on a loaded
            # host, and the default interval (50 steps) would let a second one through.
            "alert_interval": STEPS,
            "notifiers": [{"type": "webhook", "url": receiver.url()}],
        }
        with otel_mindformers.start(_config(workdir, alerts)) as run:
            last = custom_loop.train(run, steps=STEPS)
            assert run.should_stop
            assert run.stop_reason == "3 consecutive anomalous sampled steps, the last at step 3"
        said = receiver.wait_for(2)
        assert [(rule, status) for rule, status, _ in _notices(receiver)] == [
            ("loss_threshold", "firing"),
            ("early_stop", "firing"),
        ], said
        assert _notices(receiver)[0][2] == 1
    assert 3 < last < STEPS
    lines = json_lines(workdir / "m.json")
    assert [line["step"] for line in lines] == list(range(1, last + 1))  # nothing lost, nothing twice


STOPPER = """
from otel_mindformers import BaseMonitor


class Stopper(BaseMonitor):
    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        with open("rates.txt", "a") as rates:  # read only here: the rate the step's update used
            rates.write(f"{float(cb_params.learning_rate)}\\n")
        if cb_params.cur_step_num == 3:
            loss = float(cb_params.train_loss.asnumpy().reshape(-1)[0])
            self.raise_alert("custom_loss_check", f"loss {loss:.3f} seen by a custom monitor", value=loss)
        if cb_params.cur_step_num == 4:
            run_context.request_stop()
"""


def test_a_custom_monitor_alerts_and_stops_the_loop_at_its_step(workdir):
    from mindspore import nn

    (workdir / "stopper.py").write_text(STOPPER)
    loop = custom_loop.build(lr=nn.PolynomialDecayLR(0.01, 0.001, 8, 1.0))
    with WebhookReceiver() as receiver:
        alerts = {"notifiers": [{"type": "webhook", "url": receiver.url()}]}
        config = _config(workdir, alerts, interval=10, custom_monitor_callback="stopper.Stopper")
        with otel_mindformers.start(config, optimizer=loop.optimizer) as run:
            last = custom_loop.train(run, steps=STEPS, loop=loop)
            assert run.should_stop
        (notice,) = receiver.wait_for(1)
    assert last == 4, "request_stop() is honoured at the step it was asked in"
    assert (notice.body["rule"], notice.body["status"], notice.body["step"]) == ("custom_loss_check", "firing", 3)
    assert notice.body["value"] > 0
    assert [line["step"] for line in json_lines(workdir / "m.json")] == [1, 4]  # the first, and the last at end
    rates = [float(rate) for rate in (workdir / "rates.txt").read_text().split()]
    assert rates == pytest.approx([0.01 - 0.009 * index / 8 for index in range(4)], rel=1e-5)
