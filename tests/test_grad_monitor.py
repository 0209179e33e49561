"""`grad_monitor`: unset reads the global norm where the network returns it, silently; `true`
measures it where the network does not return one (tests/test_grad_norm_probe.py checks the
values), and warns only where it cannot; `false` never reads it."""

import json
import logging

import mindspore as ms
import pytest
from mindspore import nn, ops
from mindspore.train import Callback, Model

from otel_mindformers import MonitorCallback
from tests.support import training

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

MISSING_NORM = "no global gradient norm"


def _run(workdir, caplog, shape: str, **overrides):
    config = {"interval": 1, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"), **overrides}
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        training.train([MonitorCallback(config)], steps=3, shape=shape)
    lines = [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]
    warned = [r for r in caplog.records if MISSING_NORM in r.getMessage()]
    return lines, warned


def test_unset_grad_monitor_says_nothing_when_the_network_returns_no_norm(workdir, caplog):
    lines, warned = _run(workdir, caplog, "scalar")
    assert warned == []
    assert all("grad_norm" not in line for line in lines)


def test_unset_grad_monitor_reports_the_norm_the_network_returns(workdir, caplog):
    lines, warned = _run(workdir, caplog, "tuple5")
    assert warned == []
    assert all(line["grad_norm"] > 0 for line in lines)


def test_grad_monitor_true_measures_the_norm_the_network_does_not_return(workdir, caplog):
    lines, warned = _run(workdir, caplog, "scalar", grad_monitor=True)
    assert warned == []
    assert all(line["grad_norm"] > 0 for line in lines)


def test_grad_monitor_false_reads_no_norm(workdir, caplog):
    lines, warned = _run(workdir, caplog, "tuple5", grad_monitor=False)
    assert warned == []
    assert all("grad_norm" not in line for line in lines)


def test_grad_monitor_true_warns_once_when_nothing_can_measure_the_norm(workdir, caplog):
    """The graph was compiled before the run (an earlier train without monitoring): the probe
    cannot enter it, which the run says, and then that no norm is reported."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    model = training.build_model("scalar")
    model.train(1, training.build_dataset(2), dataset_sink_mode=False)
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "m.json"),
        "grad_monitor": True,
    }
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        model.train(1, training.build_dataset(3), callbacks=[MonitorCallback(config)], dataset_sink_mode=False)
    lines = [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]
    assert all("grad_norm" not in line for line in lines)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "compiled before monitoring started" in m]) == 1
    assert len([m for m in messages if MISSING_NORM in m]) == 1


class _OwnUpdateCell(nn.TrainOneStepCell):
    """Holds an optimizer (for its learning rate) but updates the weights itself: the probe
    put in `optimizer` never runs."""

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad_no_sens(self.network, self.weights)(x, y)
        for weight, grad in zip(self.weights, grads):
            loss = ops.depend(loss, ops.assign_sub(weight, grad * self.optimizer.get_lr()))
        return loss


def _train_cell(workdir, cell_class) -> list[dict]:
    """Three PyNative steps of a Dense regressor through `cell_class` with `grad_monitor: True`;
    the JSON lines."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")  # as training.train does: later tests set it again
    net = nn.Dense(training.FEATURES, 1)
    cell = cell_class(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "m.json"),
        "grad_monitor": True,
    }
    Model(cell).train(1, training.build_dataset(3), callbacks=[MonitorCallback(config)], dataset_sink_mode=False)
    return [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]


def test_grad_monitor_true_warns_once_when_the_cell_never_calls_the_probe(workdir, caplog):
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        lines = _train_cell(workdir, _OwnUpdateCell)
    assert len(lines) == 3 and all("grad_norm" not in line for line in lines)
    said = [r.getMessage() for r in caplog.records if "grad_monitor" in r.getMessage()]
    assert len(said) == 1 and "never called its optimizer `optimizer`" in said[0], said


class _OwnNormCell(nn.TrainOneStepCell):
    """Returns MindFormers' 5-tuple with a norm of its own making (a fixed 7)."""

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad_no_sens(self.network, self.weights)(x, y)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, ops.zeros((), ms.bool_), ops.ones((), ms.float32), self.optimizer.get_lr(), ops.full((1,), 7.0)


def test_grad_monitor_true_keeps_the_norm_the_cell_returns(workdir, caplog):
    lines = _train_cell(workdir, _OwnNormCell)
    assert [line["grad_norm"] for line in lines] == [7.0, 7.0, 7.0]


def test_pynative_gives_the_optimizer_back_and_graph_mode_reuses_its_probe(workdir, caplog):
    """PyNative: after the run the train cell calls its own optimizer again. Graph mode: the
    compiled graph keeps the probe, and a second monitored run of the same Model reads it."""
    from mindspore.nn import Momentum

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    lines, warned = _run(workdir, caplog, "scalar", grad_monitor=True)
    assert not warned and all(line["grad_norm"] > 0 for line in lines)
    pynative = training.train([], steps=1)
    pynative.train(1, training.build_dataset(2), callbacks=[_monitor(workdir / "p")], dataset_sink_mode=False)
    assert type(pynative.train_network.optimizer) is Momentum

    ms.set_context(mode=ms.GRAPH_MODE)
    model = training.build_model("scalar")
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        for run in ("first", "second"):
            model.train(1, training.build_dataset(3), callbacks=[_monitor(workdir / run)], dataset_sink_mode=False)
            norms = [json.loads(line)["grad_norm"] for line in (workdir / run / "m.json").read_text().splitlines()]
            assert len(norms) == 3 and all(norm > 0 for norm in norms), run
    assert not [r for r in caplog.records if "grad_monitor" in r.getMessage()]


def _monitor(folder) -> MonitorCallback:
    return MonitorCallback(
        {"interval": 1, "output_type": ["json_file"], "json_log_path": str(folder / "m.json"), "grad_monitor": True}
    )


class _OwnTrainCell(nn.Cell):
    """A train cell of the user's own, with auto_prefix (nn.Cell's default)."""

    def __init__(self, network, optimizer) -> None:
        super().__init__()
        self.network, self.optimizer = network, optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, x, y):
        loss = self.network(x, y)
        return ops.depend(loss, self.optimizer(self.grad(self.network, self.weights)(x, y)))


def test_the_probe_leaves_the_names_of_the_parameters_alone(workdir, caplog):
    """Checkpoints keep their names: the probe adds its two Parameters, renames none."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = nn.Dense(training.FEATURES, 1)
    cell = _OwnTrainCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    before = {p.name for p in cell.get_parameters()}
    seen: list[set[str]] = []

    class _Names(Callback):
        def on_train_step_end(self, run_context) -> None:
            seen.append({p.name for p in run_context.original_args().train_network.get_parameters()})

    Model(cell).train(1, training.build_dataset(2), callbacks=[_monitor(workdir), _Names()], dataset_sink_mode=False)
    added = {"otel_mindformers_grad_norm.optimizer", "otel_mindformers_grad_norm.optimizer.calls"}
    assert seen and all(names == before | added for names in seen)
    assert all(json.loads(line)["grad_norm"] > 0 for line in (workdir / "m.json").read_text().splitlines())


def test_an_optimizer_of_dynamic_embeddings_is_left_alone_with_the_reason():
    """MapParameters' gradients are MapTensors, which the probe does not measure: no probe
    (the run says why once), and the optimizer stays where it was."""
    from mindspore.experimental import MapParameter

    from otel_mindformers.model_state.grad_norm_probe import install_probes

    ms.set_device("CPU")
    net = nn.Dense(training.FEATURES, 1)
    table = MapParameter(key_dtype=ms.int32, value_dtype=ms.float32, value_shape=(4,), name="table")
    optimizer = nn.FTRL([table, *net.trainable_params()])
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    probed, why_not = install_probes(cell)
    assert probed == [] and why_not.startswith("`optimizer` updates MapParameters (dynamic embeddings)")
    assert cell.optimizer is optimizer
