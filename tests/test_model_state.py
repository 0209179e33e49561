"""Readings from inside the model (otel_mindformers/model_state/) with real MindSpore training:
per-layer gradient norms from LocalNormTrainOneStepCell, bounded series at a real OTLP
receiver, the grad-norm spike naming the layer it came from, readbacks on sampled steps only,
and replay reproducing the live series from the JSON lines."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Callback, Model

from otel_mindformers import MonitorCallback
from otel_mindformers.model_state import LocalNormTrainOneStepCell
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.model_state.parameters import ParameterFilter, kind_of, layer_of
from otel_mindformers.names import model_state as specs
from otel_mindformers.names import semconv
from tests.support import training
from tests.support.jsonl import json_lines as lines
from tests.support.readbacks import record_readbacks

BATCH = 4
pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training loops


class Stack(nn.Cell):
    """`layers` parallel blocks, block i reading its own `width` input features: a data spike
    in one block's features spikes that block's gradient."""

    def __init__(self, layers: int, depth: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.layers = nn.CellList(
            [nn.SequentialCell([nn.Dense(width, width) for _ in range(depth)]) for _ in range(layers)]
        )

    def construct(self, x):
        out = 0
        for index, layer in enumerate(self.layers):
            out = out + layer(x[:, index * self.width : (index + 1) * self.width]).sum(axis=1, keepdims=True)
        return out


def train(callbacks, *, layers=4, depth=1, width=2, steps=12, spike=None):
    """`spike=(step, layer, factor)` multiplies that layer's input features on that step."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)  # the same initial weights every run: the spike tests' z-scores do not drift
    net = Stack(layers, depth, width)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=1e-3)
    model = Model(LocalNormTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, layers * width)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) * 0.1).astype(np.float32)
    if spike is not None:
        step, layer, factor = spike
        x[(step - 1) * BATCH : step * BATCH, layer * width : (layer + 1) * width] *= factor
    data = GeneratorDataset(list(zip(x, y)), column_names=["x", "y"], shuffle=False).batch(BATCH)
    model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    return net


def otlp_config(receiver, workdir, **extra):
    return {
        "interval": 1,
        "output_type": ["otlp", "json_file"],
        "json_log_path": str(workdir / "m.json"),
        "otlp": {"endpoint": receiver.grpc_endpoint, "export_interval": 0.2},
        **extra,
    }


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, layer, kind",
    [
        ("model.tok_embeddings.embedding_weight", None, "embedding"),
        ("model.layers.0.attention.wq.weight", "0", "attention"),
        ("model.layers.1.attention_norm.weight", "1", "norm"),
        ("model.layers.11.feed_forward.w2.weight", "11", "mlp"),
        ("model.norm_out.weight", None, "norm"),
        ("lm_head.weight", None, "head"),
        ("h.3.attn.c_attn.weight", "3", "attention"),
        ("layers.2.mlp.down_proj.weight", "2", "mlp"),
    ],
)
def test_parameter_names_give_their_layer_and_kind(name, layer, kind):
    assert (layer_of(name), kind_of(name)) == (layer, kind)


def test_target_filter_follows_mindformers_semantics_and_caps():
    names = [f"model.layers.{i}.attention.wq.weight" for i in range(100)] + ["lm_head.weight"]
    assert ParameterFilter(None).select(names) == []  # no target: no per-parameter series
    assert ParameterFilter(["layers.1.attention"]).select(names) == ["model.layers.1.attention.wq.weight"]
    assert ParameterFilter(["attention"], invert=True).select(names) == ["lm_head.weight"]
    assert len(ParameterFilter([".*"], cap=64).select(names)) == 64


# --- plain MindSpore ------------------------------------------------------------------------------


def test_per_layer_norms_from_the_wrapper_equal_the_gradients(workdir, otlp_receiver):
    """LocalNormTrainOneStepCell's norms, aggregated per layer, are the real gradients' norms;
    `target` limits the per-parameter series to the parameters it selects."""
    cb = MonitorCallback(otlp_config(otlp_receiver, workdir, target=["layers.1."]))
    train([cb], steps=3)
    line = lines(workdir / "m.json")[-1]
    last = line["model_state"]["grad_norm"]
    assert sorted(last["layer"]) == ["0", "1", "2", "3"]
    # The cell's global norm (the 7-tuple's fifth) is the L2 norm over every layer's.
    assert line["grad_norm"] == pytest.approx(math.sqrt(sum(v * v for v in last["layer"].values())), rel=1e-5)
    assert sorted(last["parameter"]) == ["layers.1.0.bias", "layers.1.0.weight"]
    # The layer norm is the L2 norm over its parameters.
    layer1 = math.sqrt(sum(v * v for v in last["parameter"].values()))
    assert last["layer"]["1"] == pytest.approx(layer1, rel=1e-9)
    otlp_receiver.wait_for(lambda r: r.points(specs.BY_FAMILY["grad_norm"].parameter.name))
    exported = {
        p.attributes[specs.ATTR_PARAMETER] for p in otlp_receiver.points(specs.BY_FAMILY["grad_norm"].parameter.name)
    }
    assert exported == {"layers.1.0.bias", "layers.1.0.weight"}
    layer_points = {
        p.attributes[specs.ATTR_LAYER]: p.value for p in otlp_receiver.points(specs.BY_FAMILY["grad_norm"].layer.name)
    }
    assert layer_points["1"] == pytest.approx(last["layer"]["1"], rel=1e-6)


def test_two_hundred_parameters_without_a_filter_export_a_bounded_number_of_series(workdir, otlp_receiver):
    cb = MonitorCallback(otlp_config(otlp_receiver, workdir))
    net = train([cb], layers=20, depth=5, width=2, steps=3)
    assert len(net.trainable_params()) == 200
    names = {spec.name for spec in specs.INSTRUMENTS}
    otlp_receiver.wait_for(lambda r: r.points(specs.BY_FAMILY["grad_norm"].max.name))
    series = {(p.metric, tuple(sorted(p.attributes.items()))) for p in otlp_receiver.points() if p.metric in names}
    by_metric = defaultdict(int)
    for metric, _ in series:
        by_metric[metric] += 1
    family = specs.BY_FAMILY["grad_norm"]
    assert by_metric[family.layer.name] == 20
    assert by_metric[family.kind.name] <= 6
    assert 1 <= by_metric[family.max.name] <= 3  # one live series; its parameter may change per step
    assert by_metric[family.parameter.name] == 0
    assert len(series) <= 20 + 6 + 3 < 200


def test_a_spike_in_one_layers_gradient_is_named_by_the_alert(workdir, otlp_receiver):
    alerts = {
        "enable_alert": True,
        "nonfinite": False,
        "loss_spike": {"enable": False},
        "grad_norm_spike": {"warmup": 5, "zscore": 6.0},
    }
    cb = MonitorCallback(otlp_config(otlp_receiver, workdir, alert_config=alerts))
    train([cb], layers=4, steps=12, spike=(9, 2, 300.0))
    fired = [line for line in lines(workdir / "m.json") if "grad_norm_spike" in line.get("alerts", [])]
    assert fired[0]["step"] == 9  # (the huge update damages the weights: later steps may fire too)
    otlp_receiver.wait_for(lambda r: any(s.attributes[semconv.ATTR_STEP] == 9 for s in r.spans(semconv.SPAN_STEP)))
    (span,) = [s for s in otlp_receiver.spans(semconv.SPAN_STEP) if s.attributes[semconv.ATTR_STEP] == 9]
    (event,) = [attrs for name, attrs in span.events if attrs.get(semconv.ATTR_ALERT_RULE) == "grad_norm_spike"]
    assert event[specs.ATTR_LAYER] == "2"
    assert event[specs.ATTR_PARAMETER].startswith("layers.2.")
    assert "moved most: layer 2" in event["message"]


class _WritesWeightNorm(Callback):
    """Puts a reading in the inbox each step, as MindFormers' TrainingStateMonitor does
    through the wrapped `_output` (model_state/mindformers_hooks.py)."""

    def on_train_step_end(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        INBOX.put("weight_norm", np.float32(step * 0.5), step)


def test_inbox_readings_reach_the_line_when_the_outputs_carry_no_local_norms(workdir):
    """A scalar loss: nothing for the 7-tuple path to read, so only the inbox having been
    written tells the sampled step to take it; a step with nothing written adds nothing."""
    cb = MonitorCallback({"interval": 2, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json")})
    training.train([_WritesWeightNorm(), cb], steps=6, mode=ms.GRAPH_MODE)
    assert [(line["step"], line.get("weight_norm")) for line in lines(workdir / "m.json")] == [
        (1, 0.5), (2, 1.0), (4, 2.0), (6, 3.0),
    ]  # fmt: skip


def test_unsampled_steps_do_no_readback_of_the_seven_tuple(workdir, monkeypatch):
    cb = MonitorCallback({"interval": 5, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json")})
    steps_read = record_readbacks(monkeypatch, cb)
    train([], steps=12)
    baseline = len(steps_read)  # MindSpore's own
    steps_read.clear()
    train([cb], steps=12)
    ours = steps_read[baseline:] if baseline else steps_read
    # loss, overflow, scale, lr, grad_norm and the local norms: six readbacks on steps 1, 5, 10, 12.
    assert len(steps_read) - baseline == 4 * 6
    assert sorted(set(ours)) == [1, 5, 10, 12]
    assert [line["step"] for line in lines(workdir / "m.json") if "model_state" in line] == [1, 5, 10, 12]


def test_replay_reproduces_the_live_model_state_series(workdir, otlp_receiver):
    from otel_mindformers.core import measurements as recording
    from otel_mindformers.outputs.jsonl_reader import as_records, read_logs

    cb = MonitorCallback(
        {"interval": 2, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"), "target": ["layers.0."]}
    )
    train([cb], steps=6)
    (series,) = read_logs([str(workdir / "m.json")])
    names = {spec.name for spec in specs.INSTRUMENTS}
    replayed = [
        (m.spec.name, dict(m.attributes), m.value)
        for record in as_records(series)
        for m in recording.measurements(record, {})
        if m.spec.name in names
    ]
    expected = []
    for line in lines(workdir / "m.json"):
        part = line["model_state"]["grad_norm"]
        expected += [
            (specs.BY_FAMILY["grad_norm"].layer.name, {specs.ATTR_LAYER: k}, v) for k, v in part["layer"].items()
        ]
    assert [r for r in replayed if r[0] == specs.BY_FAMILY["grad_norm"].layer.name] == expected
    assert {r[1][specs.ATTR_PARAMETER] for r in replayed if r[0] == specs.BY_FAMILY["grad_norm"].parameter.name} == {
        "layers.0.0.weight",
        "layers.0.0.bias",
    }


def test_report_and_plot_show_the_layers_and_parameters_with_the_largest_norms(workdir):
    from PIL import Image

    from otel_mindformers.analysis.plot import plot
    from otel_mindformers.analysis.report import render, report_logs
    from otel_mindformers.outputs.jsonl_reader import read_logs

    cb = MonitorCallback(
        {"interval": 1, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"), "target": ["layers.3."]}
    )
    train([cb], layers=4, steps=6, spike=(4, 2, 50.0))
    report = report_logs([str(workdir / "m.json")])
    (summary,) = report.series
    assert summary.top_layers[0].name == "layer 2" and summary.top_layers[0].step == 4
    assert summary.top_parameters[0].name.startswith("layers.2.") and summary.top_parameters[0].step == 4
    text = render(report, "text")
    assert "Largest gradient norms: layers" in text and "layer 2" in text
    assert "## Largest gradient norms: parameters" in render(report, "markdown")

    plain = plot(read_logs([str(workdir / "m.json")]), workdir / "plain.png")
    (workdir / "old.json").write_text(
        "".join(
            json.dumps({k: v for k, v in line.items() if k != "model_state"}) + "\n"
            for line in lines(workdir / "m.json")
        )
    )
    without = plot(read_logs([str(workdir / "old.json")]), workdir / "without.png")
    # The per-layer panels add a third row of panels.
    assert Image.open(plain).size[1] == pytest.approx(Image.open(without).size[1] * 1.5, rel=0.02)


def test_the_grad_norm_spike_names_the_layer_and_parameter_that_rose_most_not_the_largest():
    """Layer 0 holds the largest norm throughout; layer 1's rose most between the samples."""
    from otel_mindformers.alerts.rules import GradNormSpikeRule
    from otel_mindformers.core.step_record import StepRecord
    from otel_mindformers.model_state.state import FamilyReadings, ModelState
    from otel_mindformers.names.model_state import ATTR_LAYER, ATTR_PARAMETER, GRAD_NORM

    names = ["model.layers.0.attention.wq.weight", "model.layers.1.attention.wq.weight"]

    def record(step, norms, grad_norm):
        state = ModelState(families={GRAD_NORM: FamilyReadings(names, [n * n for n in norms])})
        return StepRecord(
            step=step, epoch=1, rank=0, time_stamp=float(step), values={"grad_norm": grad_norm}, model_state=state
        )

    rule = GradNormSpikeRule(zscore=3.0, window=10, warmup=3)
    for step in range(1, 6):
        assert rule.check(record(step, [10.0, 1.0], 1.0 + 0.01 * step)) is None
    finding = rule.check(record(6, [10.5, 6.0], 50.0))
    assert finding.attributes == {ATTR_LAYER: "1", ATTR_PARAMETER: names[1]}
    assert finding.detail.endswith(f"moved most: layer 1, {names[1]}")


def test_stdout_names_the_largest_parameter_and_the_layer_with_the_largest_norm(workdir, capsys):
    """docs/model_state.md: stdout carries aggregates only, the largest parameter norm and
    the top layer; a spike in layer 2's data makes it the top layer at that step."""
    config = {"interval": 1, "output_type": ["stdout", "json_file"], "json_log_path": str(workdir / "m.json")}
    train([MonitorCallback(config)], steps=4, spike=(3, 2, 50.0))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[otel_mindformers]")]
    logged = {line["step"]: line["model_state"]["grad_norm"] for line in lines(workdir / "m.json")}
    assert len(printed) == len(logged) == 4
    for text in printed:
        grad = logged[int(text.split(" step ")[1].split(" ")[0])]
        top = max(grad["layer"], key=grad["layer"].__getitem__)
        largest = grad["max"]
        assert f"grad_norm_max {largest['value']:.4g} ({largest['parameter']})" in text, text
        assert f"top layer {top} {grad['layer'][top]:.4g}" in text, text
    assert max(logged[3]["layer"], key=logged[3]["layer"].__getitem__) == "2"
