"""The run API's outputs off the machine and on the console, in one real PyNative custom loop
(tests/support/custom_loop.py): OTLP/gRPC to a real receiver on 127.0.0.1 (metrics, step spans
in the job step's trace linked to the run span, Python logging with the step and the step
span's ids), the `prometheus` endpoint scraped from inside the loop, and stdout. One training
is shared by the tests, which only read what it sent."""

from __future__ import annotations

import contextlib
import io
import logging
import urllib.request
from dataclasses import dataclass

import pytest

import otel_mindformers
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support import custom_loop
from tests.support.instrumented import free_port
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # a real training

STEPS, INTERVAL, SCRAPE_AT = 12, 5, 6
SAMPLED = [1, 5, 10, 12]
LOGGER = "custom_loop_script"
LOSS_SERIES = "mindformers_train_loss"  # the loss gauge as Prometheus names it


@dataclass
class Sent:
    receiver: OtlpReceiver
    scraped: str  # the Prometheus endpoint's body at SCRAPE_AT
    stdout: str
    losses: dict[int, float]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _served_loss(body: str) -> float | None:
    served = [line for line in body.splitlines() if line.startswith(f"{LOSS_SERIES}{{")]
    return float(served[0].rsplit(" ", 1)[1]) if len(served) == 1 else None


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outputs")
    port = free_port()
    script_log = logging.getLogger(LOGGER)
    script_log.setLevel(logging.INFO)
    loop = custom_loop.build()
    losses: dict[int, float] = {}
    printed = io.StringIO()
    with OtlpReceiver() as receiver:
        config = {
            "interval": INTERVAL,
            "service_name": "custom-loop",
            "output_type": ["stdout", "json_file", "otlp", "prometheus"],
            "json_log_path": str(folder / "m.json"),
            "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc", "export_interval": 0.2},
            "prometheus": {"port": port},
            "logs": {"enable": True},
        }
        scraped, url = "", f"http://127.0.0.1:{port}/metrics"
        with contextlib.redirect_stdout(printed), otel_mindformers.start(config, optimizer=loop.optimizer) as run:
            for step, (x, y) in enumerate(custom_loop.Data(STEPS).batches(), start=1):
                with run.step(step):
                    script_log.info("step %d runs", step, extra={"test_step": step})
                    loss, grads = loop.train_step(x, y)
                    run.log(loss=loss, grads=grads)
                losses[step] = float(loss.asnumpy())
                if step == SCRAPE_AT:  # step 5's loss, served while the loop runs (once the worker had it)
                    step5 = pytest.approx(losses[5], rel=1e-5)
                    wait_until(lambda: _served_loss(_scrape(url)) == step5, "step 5's loss served")  # noqa: B023
                    scraped = _scrape(url)
        # end() flushed every exporter: what was sent has arrived.
        assert receiver.wait_for(
            lambda rx: (
                len(rx.spans(semconv.SPAN_STEP)) == len(SAMPLED)
                and rx.spans(semconv.SPAN_RUN)
                and len([r for r in rx.logs(LOGGER) if r.attributes.get("test_step")]) == STEPS
            )
        )
        yield Sent(receiver, scraped, printed.getvalue(), losses)
    script_log.setLevel(logging.NOTSET)


def test_step_spans_are_in_their_job_steps_trace_and_linked_to_the_run_span(sent):
    receiver = sent.receiver
    (run_span,) = receiver.spans(semconv.SPAN_RUN)
    assert run_span.resource["service.name"] == "custom-loop" and run_span.attributes[semconv.ATTR_STEP] == STEPS
    steps = {s.attributes[semconv.ATTR_STEP]: s for s in receiver.spans(semconv.SPAN_STEP)}
    assert sorted(steps) == SAMPLED
    roots = {root.span_id: root for root in receiver.spans(semconv.SPAN_JOB_STEP)}
    for step, span in steps.items():
        assert span.links == [(run_span.trace_id, run_span.span_id)], step
        root = roots[span.parent_span_id]  # the job step's root: one rank emits it
        assert (root.trace_id, root.attributes[semconv.ATTR_STEP]) == (span.trace_id, step)
        assert span.attributes[tm.BY_KEY[tm.LOSS].span_attribute] == pytest.approx(sent.losses[step], rel=1e-5)


def test_metrics_reach_the_receiver_with_the_sampled_losses(sent):
    loss_points = sent.receiver.points(tm.instrument_name(tm.LOSS))
    assert loss_points and all(p.attributes == {semconv.ATTR_RANK: 0} for p in loss_points)
    assert loss_points[-1].value == pytest.approx(sent.losses[STEPS], rel=1e-5)
    sampled = [sent.losses[step] for step in SAMPLED]
    assert all(any(p.value == pytest.approx(loss, rel=1e-5) for loss in sampled) for p in loss_points)
    norm_points = sent.receiver.points(tm.instrument_name(tm.GRAD_NORM))
    assert norm_points and all(p.value > 0 for p in norm_points)
    (histogram,) = sent.receiver.points(tm.instrument_name(tm.STEP_TIME))[-1:]
    assert histogram.count == len(SAMPLED)  # one step-time observation per sampled step


def test_log_records_carry_the_step_and_the_sampled_step_spans_ids(sent):
    steps = {s.attributes[semconv.ATTR_STEP]: s for s in sent.receiver.spans(semconv.SPAN_STEP)}
    records = {r.attributes["test_step"]: r for r in sent.receiver.logs(LOGGER) if r.attributes.get("test_step")}
    assert sorted(records) == list(range(1, STEPS + 1))
    for step, record in records.items():
        assert record.body == f"step {step} runs" and record.attributes[semconv.ATTR_RANK] == 0
        assert record.attributes[semconv.ATTR_STEP] == step - 1  # the last finished step
        if step in (1, 5, 10):  # made inside a sampled step: its span's ids, derived in advance
            assert (record.trace_id, record.span_id) == (steps[step].trace_id, steps[step].span_id), step
        else:
            assert record.span_id == "", step


def test_prometheus_serves_the_loss_while_the_loop_runs(sent):
    assert _served_loss(sent.scraped) == pytest.approx(sent.losses[5], rel=1e-5)
    assert 'training_rank="0"' in sent.scraped


def test_stdout_has_one_line_per_sampled_step(sent):
    lines = [line for line in sent.stdout.splitlines() if line.startswith("[otel_mindformers] rank 0")]
    assert [int(line.split(" step ")[1].split(" ")[0]) for line in lines] == SAMPLED
    assert all("| loss " in line for line in lines)
