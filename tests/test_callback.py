"""MonitorCallback on real MindSpore training loops: sampling, values, spans, metrics, files."""

import json
import math

import mindspore as ms
import pytest
from mindspore import nn
from opentelemetry.trace import StatusCode

from otel_mindformers import ConfigError, MonitorCallback
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support import monitors, training
from tests.support.configs import config
from tests.support.in_memory import Capture
from tests.support.paths import EXAMPLES
from tests.support.readbacks import record_readbacks
from tests.support.training import Faults

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs


def strict_lines(path):
    def reject(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


EXPECTED_KEYS = {
    "scalar": {"loss", "learning_rate", "train_per_step_time", "samples_per_second"},
    "tuple3": {"loss", "learning_rate", "overflow", "loss_scale", "train_per_step_time", "samples_per_second"},
    "tuple5": {
        "loss",
        "learning_rate",
        "grad_norm",
        "overflow",
        "loss_scale",
        "train_per_step_time",
        "samples_per_second",
    },
}


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
@pytest.mark.parametrize("shape", ["scalar", "tuple3", "tuple5"])
def test_every_output_shape_is_read_on_sampled_steps(shape, mode, workdir):
    capture = Capture()
    cb = capture.callback(config(workdir))
    training.train([cb], steps=12, shape=shape, mode=mode)

    lines = strict_lines(workdir / "m.json")
    assert [line["step"] for line in lines] == [1, 5, 10, 12]  # first, every 5th, last
    for line in lines:
        # goodput, the time breakdown and the job (docs/restarts.md) on every line; an ETA and
        # the rank's sections (docs/stragglers.md) from the second sample on (and its own
        # straggler signal, which a loaded machine can raise on any run).
        assert set(line) - {tm.ETA, "sections", "stragglers"} == (
            {"time_stamp", "step", "epoch", "rank", "time", tm.GOODPUT, "job"} | EXPECTED_KEYS[shape]
        )
        assert line["rank"] == 0 and line["epoch"] == 1
        assert line["loss"] > 0 and line["train_per_step_time"] > 0
        assert line["learning_rate"] == pytest.approx(0.01)
    if shape == "tuple3":
        assert {line["loss_scale"] for line in lines} == {1024.0}
        assert {line["overflow"] for line in lines} == {False}

    step_spans = capture.finished(semconv.SPAN_STEP)
    (run_span,) = capture.finished(semconv.SPAN_RUN)
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in step_spans) == [1, 5, 10, 12]
    for span in step_spans:
        assert span.links[0].context.span_id == run_span.context.span_id
        assert span.attributes["training.loss"] > 0
    assert len(capture.finished(semconv.SPAN_EPOCH)) == 1
    assert run_span.attributes[semconv.ATTR_RANK] == 0

    points = capture.points()
    (steps_total,) = points[tm.STEPS.name]
    assert steps_total.value == 12
    (duration,) = points[tm.instrument_name(tm.STEP_TIME)]
    assert duration.count == 4 and duration.explicit_bounds == tm.STEP_DURATION_BUCKETS
    exemplars = capture.exemplars(tm.instrument_name(tm.STEP_TIME))
    assert exemplars, "step-duration points carry exemplars of their step spans"
    assert {e.span_id for e in exemplars} <= {s.context.span_id for s in step_spans}
    (loss,) = points[tm.instrument_name(tm.LOSS)]
    assert loss.attributes == {semconv.ATTR_RANK: 0}
    assert loss.value == pytest.approx(lines[-1]["loss"])
    if shape == "tuple5":
        assert points[tm.instrument_name(tm.GRAD_NORM)][0].value == pytest.approx(lines[-1]["grad_norm"])


def test_learning_rate_is_the_one_the_step_used(workdir):
    """optimizer.get_lr() at step end is already the next step's: the callback must not use it."""
    schedule = [0.001 * (i + 1) for i in range(10)]  # step k (1-based) uses 0.001 * k
    for shape in ("scalar", "tuple5"):
        cb = MonitorCallback(config(workdir, interval=3, json_log_path=str(workdir / f"{shape}.json")))
        training.train([cb], steps=10, shape=shape, lr=schedule)
        lines = strict_lines(workdir / f"{shape}.json")
        assert [(line["step"], round(line["learning_rate"], 6)) for line in lines] == [
            (1, 0.001),
            (3, 0.003),
            (6, 0.006),
            (9, 0.009),
            (10, 0.01),
        ]


def test_learning_rate_is_the_optimizers_across_train_calls_and_initial_epoch(workdir):
    """The optimizer's global_step goes on across Model.train calls where the job's step
    starts again at 1, and starts at 0 in a fresh model trained with initial_epoch (no
    checkpoint loaded) where the job's step starts past the first epoch: the rate written
    is the one the schedule gave the optimizer's update."""

    def used(index: int) -> float:  # nn.CosineDecayLR(0.0, 0.1, 40) at the update's index
        return round(0.05 * (1 + math.cos(math.pi * index / 40)), 5)

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    model = training.build_model(lr=nn.CosineDecayLR(0.0, 0.1, 40))
    cb = MonitorCallback(config(workdir, interval=3))
    model.train(1, training.build_dataset(6), callbacks=[cb], dataset_sink_mode=False)
    first = strict_lines(workdir / "m.json")  # the next run starts at step 1: it sets these aside
    model.train(1, training.build_dataset(6), callbacks=[cb], dataset_sink_mode=False)
    second = strict_lines(workdir / "m.json")
    assert [(line["step"], round(line["learning_rate"], 5)) for line in first] == [(s, used(s - 1)) for s in (1, 3, 6)]
    assert [(line["step"], round(line["learning_rate"], 5)) for line in second] == [(s, used(s + 5)) for s in (1, 3, 6)]

    fresh = training.build_model(lr=[0.001 * (i + 1) for i in range(20)])  # update k (1-based) uses 0.001 * k
    log = workdir / "epoch.json"
    cb = MonitorCallback(config(workdir, interval=3, json_log_path=str(log)))
    fresh.train(2, training.build_dataset(6), callbacks=[cb], dataset_sink_mode=False, initial_epoch=1)
    assert [(line["step"], round(line["learning_rate"], 6)) for line in strict_lines(log)] == [
        (7, 0.001),
        (9, 0.003),
        (12, 0.006),
    ]


@pytest.mark.parametrize("ours", ["last", "first"])
def test_learning_rate_changed_by_a_learning_rate_scheduler_is_the_one_the_step_used(ours, workdir, monkeypatch):
    """MindSpore's LearningRateScheduler sets the next step's rate at a step's end: listed
    before ours (ours last, as time.md advises for checkpoint saves), the optimizer already
    holds it when we read. Steps 1-4 use 0.1, 5-8 0.05, 9-10 0.025."""
    from mindspore.train import LearningRateScheduler, Model

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    net = nn.SequentialCell(nn.Dense(training.FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))

    def halve_every_4th(lr, step):
        return lr * 0.5 if step % 4 == 0 else lr

    scheduler = LearningRateScheduler(halve_every_4th)
    monkeypatch.setattr(monitors.ReadsLearningRate, "values", [])  # a custom monitor's cb_params.learning_rate
    monitor = MonitorCallback(
        config(workdir, interval=4, custom_monitor_callback="tests.support.monitors.ReadsLearningRate")
    )
    callbacks = [scheduler, monitor] if ours == "last" else [monitor, scheduler]
    model.train(1, training.build_dataset(10), callbacks=callbacks, dataset_sink_mode=False)
    lines = strict_lines(workdir / "m.json")
    assert [(line["step"], round(line["learning_rate"], 6)) for line in lines] == [
        (1, 0.1),
        (4, 0.1),
        (8, 0.05),
        (10, 0.025),
    ]
    used = [0.1] * 4 + [0.05] * 4 + [0.025] * 2
    assert monitors.ReadsLearningRate.values == pytest.approx(used, rel=1e-6)
    assert scheduler.learning_rate_function is halve_every_4th  # put back after the run


def test_unsampled_steps_do_no_device_readback(workdir, monkeypatch):
    cb = MonitorCallback(config(workdir, interval=10))
    readback_steps = record_readbacks(monkeypatch, cb)
    training.train([], steps=25, shape="tuple5")
    baseline = len(readback_steps)  # MindSpore's own, without the callback
    readback_steps.clear()
    training.train([cb], steps=25, shape="tuple5")
    ours = readback_steps[baseline:] if baseline else readback_steps
    # loss, overflow, scale, lr, grad_norm: five readbacks on each of steps 1, 10, 20, 25 only.
    assert len(readback_steps) - baseline == 4 * 5
    assert sorted(set(ours)) == [1, 10, 20, 25]


def test_nonfinite_loss_is_null_in_json_and_counted(workdir):
    capture = Capture()
    cb = capture.callback(config(workdir, interval=1))
    training.train([cb], steps=6, shape="tuple5", faults=Faults(nan_at={4}))
    lines = strict_lines(workdir / "m.json")
    assert lines[2]["loss"] is not None
    bad = lines[3]
    assert bad["step"] == 4 and bad["loss"] is None and "loss" in bad["nonfinite"]
    counter = capture.points()[tm.NONFINITE.name]
    loss_count = sum(p.value for p in counter if p.attributes[tm.ATTR_METRIC] == "loss")
    assert loss_count == sum(1 for line in lines if line["loss"] is None) >= 1
    errored = [s for s in capture.finished(semconv.SPAN_STEP) if s.status.status_code == StatusCode.ERROR]
    assert 4 in {s.attributes[semconv.ATTR_STEP] for s in errored}


def test_grad_monitor_on_a_cell_without_global_norm_measures_it_without_a_warning(workdir, caplog):
    training.train([MonitorCallback(config(workdir, interval=2, grad_monitor=True))], steps=6, shape="scalar")
    assert not [r for r in caplog.records if "no global gradient norm" in r.getMessage()]
    assert all(line["grad_norm"] > 0 for line in strict_lines(workdir / "m.json"))


def test_other_ranks_write_their_own_file_without_training_metrics(workdir, monkeypatch, capsys):
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    cb = MonitorCallback(config(workdir, output_type=["json_file", "stdout"]))
    training.train([cb], steps=6, shape="tuple5")
    assert not (workdir / "m.json").exists()
    lines = strict_lines(workdir / "m_rank_1.json")
    assert [line["rank"] for line in lines] == [1, 1, 1]
    assert all("loss" not in line and line["train_per_step_time"] > 0 for line in lines)
    assert "[otel_mindformers]" not in capsys.readouterr().out  # stdout is rank 0's


def test_grad_monitor_says_nothing_of_the_norm_on_ranks_that_do_not_report_it(workdir, monkeypatch, caplog):
    """A rank outside `report_ranks` measures the norm (graphs stay alike) but never reads it:
    it was warning that no sampled step could be told apart, once per rank of the job."""
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    training.train([MonitorCallback(config(workdir, interval=2, grad_monitor=True))], steps=6, shape="scalar")
    assert not [r.getMessage() for r in caplog.records if "grad_monitor" in r.getMessage()]
    assert all("grad_norm" not in line for line in strict_lines(workdir / "m_rank_1.json"))


def test_report_ranks_all_makes_every_rank_report(workdir, monkeypatch):
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    training.train([MonitorCallback(config(workdir, report_ranks="all"))], steps=3, shape="tuple5")
    assert all("loss" in line for line in strict_lines(workdir / "m_rank_1.json"))


def test_stdout_line_per_sampled_step(workdir, capsys):
    training.train([MonitorCallback(config(workdir, output_type=["stdout"], interval=4))], steps=8, shape="tuple5")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[otel_mindformers]")]
    assert len(lines) == 3
    assert lines[1].startswith("[otel_mindformers] rank 0 epoch 1 step 4 | loss ")
    assert "overflow no" in lines[1] and "ms" in lines[1]


def test_tensorboard_scalars_read_back_with_tensorboard(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = MonitorCallback(config(workdir, output_type=["tensorboard"], tensorboard_path=str(workdir / "tb")))
    training.train([cb], steps=10, shape="tuple5")
    acc = EventAccumulator(str(workdir / "tb" / "rank_0"))
    acc.Reload()
    assert {"loss", "learning_rate", "grad_norm", "train_per_step_time"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("loss")] == [1, 5, 10]
    assert all(math.isfinite(e.value) and e.value > 0 for e in acc.Scalars("grad_norm"))


def test_epochs_and_multi_epoch_sampling(workdir):
    capture = Capture()
    training.train([capture.callback(config(workdir, interval=4))], steps=6, epochs=2)
    lines = strict_lines(workdir / "m.json")
    assert [(line["epoch"], line["step"]) for line in lines] == [(1, 1), (1, 4), (2, 8), (2, 12)]
    assert len(capture.finished(semconv.SPAN_EPOCH)) == 2


def test_article_custom_monitor_appends_to_the_same_file(workdir, capsys):
    cb = MonitorCallback(
        config(
            workdir, custom_monitor_callback="custom_monitor.CustomMetricMonitor", alert_config={"loss_threshold": 0.0}
        ),
        source_dir=str(EXAMPLES),
    )
    training.train([cb], steps=6, shape="tuple5")
    lines = strict_lines(workdir / "m.json")
    custom = [line for line in lines if "lr" in line]
    assert [line["step"] for line in custom] == [1, 2, 3, 4, 5, 6]  # the article's monitor logs every step
    assert len(lines) == 6 + 3
    assert "【监控告警】step 1" in capsys.readouterr().out


def test_disabled_config_does_nothing(workdir):
    capture = Capture()
    training.train([capture.callback(config(workdir, enable=False))], steps=3)
    assert not (workdir / "m.json").exists() and not capture.spans.get_finished_spans()


def test_exception_in_training_ends_run_span_with_error_and_propagates(workdir):
    from mindspore.train import Callback

    class Boom(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 3:
                raise RuntimeError("boom at step 3")

    capture = Capture()
    with pytest.raises(RuntimeError, match="boom at step 3"):
        training.train([capture.callback(config(workdir, interval=1)), Boom()], steps=6)
    (run_span,) = capture.finished(semconv.SPAN_RUN)
    assert run_span.status.status_code == StatusCode.ERROR
    assert "boom at step 3" in run_span.status.description
    assert [line["step"] for line in strict_lines(workdir / "m.json")] == [1, 2, 3]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_real_otlp_receiver_gets_spans_and_metrics_with_rank(protocol, workdir, otlp_receiver, monkeypatch):
    monkeypatch.setenv("RANK_ID", "0")
    monkeypatch.setenv("RANK_SIZE", "1")
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    cb = MonitorCallback(
        {
            "interval": 5,
            "output_type": ["otlp"],
            "service_name": "otlp-test",
            "otlp": {"endpoint": endpoint, "protocol": protocol, "export_interval": 0.2},
        }
    )
    training.train([cb], steps=10, shape="tuple5")
    steps = otlp_receiver.spans(semconv.SPAN_STEP)
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in steps) == [1, 5, 10]
    (run,) = otlp_receiver.spans(semconv.SPAN_RUN)
    assert run.resource["service.name"] == "otlp-test"
    assert run.resource[semconv.ATTR_RANK] == 0 and run.resource[semconv.ATTR_WORLD_SIZE] == 1
    assert {link[1] for s in steps for link in s.links} == {run.span_id}
    loss_points = otlp_receiver.points(tm.instrument_name(tm.LOSS))
    assert loss_points and all(p.attributes == {semconv.ATTR_RANK: 0} for p in loss_points)
    histogram = otlp_receiver.points(tm.instrument_name(tm.STEP_TIME))
    assert histogram[-1].count == 3 and histogram[-1].unit == "s"
    exemplar_spans = {span_id for p in histogram for _trace, span_id in p.exemplars}
    assert exemplar_spans and exemplar_spans <= {s.span_id for s in steps}


def test_keyword_overrides_are_validated_monitor_config_keys(workdir):
    cb = MonitorCallback(config(workdir), service_name="tiny-llama", interval=3)
    assert (cb.config.service_name, cb.config.interval) == ("tiny-llama", 3)
    with pytest.raises(ConfigError, match="monitor_config.intervall: unknown key"):
        MonitorCallback(config(workdir), intervall=3)


def test_a_step_skipped_by_step_spans_keeps_its_span_when_an_alert_fires(workdir):
    capture = Capture()
    cb = capture.callback(
        config(workdir, interval=1, step_spans=False, alert_config={"enable_alert": True, "loss_threshold": 1e9})
    )
    training.train([cb], steps=8, shape="tuple5", faults=Faults(spike_at={5: 1e6}))
    spans = {s.attributes[semconv.ATTR_STEP]: s for s in capture.finished(semconv.SPAN_STEP)}
    assert min(spans) == 5, "healthy steps 1-4 get no span"
    assert all(s.status.status_code == StatusCode.ERROR for s in spans.values()), "only anomalous steps"
    assert [e.attributes[semconv.ATTR_ALERT_RULE] for e in spans[5].events] == ["loss_threshold"]
    run_span_id = capture.finished(semconv.SPAN_RUN)[0].context.span_id
    assert all(s.links[0].context.span_id == run_span_id for s in spans.values())


def test_alerts_that_fire_are_named_in_the_step_line_and_read_back_as_marks(workdir):
    from otel_mindformers.outputs.jsonl_reader import read_logs

    cb = MonitorCallback(config(workdir, interval=1, alert_config={"enable_alert": True, "loss_threshold": 50.0}))
    training.train([cb], steps=6, shape="tuple5", faults=Faults(spike_at={3: 30.0}))
    lines = strict_lines(workdir / "m.json")
    assert lines[2]["step"] == 3 and "loss_threshold" in lines[2]["alerts"]
    assert "alerts" not in lines[0] and "alerts" not in lines[1]
    marks = [(a.step, a.rule) for series in read_logs([str(workdir / "m.json")]) for a in series.alerts]
    assert (3, "loss_threshold") in marks
