"""`grad_monitor: True` on plain MindSpore: the global gradient norm of any `Model.train`.

Each sampled step's `grad_norm` is checked against the norm of that step's batch gradients
under the weights before its update, computed here with `mindspore.grad` at the step's
begin, in graph and PyNative mode, without a loss scale, with a loss scale the optimizer
divides out (`FixedLossScaleManager(drop_overflow_update=False)`), and with one the cell
divides out (`TrainOneStepWithLossScaleCell`). An overflow step under a dynamic scale is
non-finite and no fault. The CPU backend lacks the loss-scale cell's NPUGetFloatStatusV2: its
overflow check is the same answer computed from the gradients (tests/support/mindformers_cpu.py).
"""

from __future__ import annotations

import json
import logging
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.dataset import GeneratorDataset
from mindspore.nn.wrap.loss_scale import TrainOneStepWithLossScaleCell
from mindspore.train import Callback, FixedLossScaleManager, Model

from otel_mindformers import MonitorCallback
from tests.support import mindformers_cpu

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

FEATURES, BATCH, STEPS, INTERVAL = 8, 4, 7, 3
SCALE = 1024.0
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


class _ReferenceNorms(Callback):
    """At each step's begin (weights not yet updated), the global norm of the gradients of
    the step's batch, by `mindspore.grad` on the unscaled loss."""

    def __init__(self, loss_net: nn.Cell, weights: list) -> None:
        self._grad = ms.grad(loss_net, grad_position=None, weights=weights)
        self.norms: dict[int, float] = {}

    def on_train_step_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        x, y = cb_params.train_dataset_element[:2]
        grads = self._grad(x, y)
        self.norms[cb_params.cur_step_num] = math.sqrt(
            sum(float(np.square(g.asnumpy().astype(np.float64)).sum()) for g in grads)
        )


def _data(steps: int = STEPS, spread: float | list[float] = 1.0):
    """`steps` batches; `spread`: the inputs' scale, or one per step (the gradients' scale)."""
    rng = np.random.default_rng(0)
    scale = np.repeat(np.broadcast_to(np.asarray(spread, dtype=np.float64), (steps,)), BATCH)[:, None]
    x = (rng.standard_normal((steps * BATCH, FEATURES)) * scale).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
    return GeneratorDataset(list(zip(x, y)), column_names=["x", "y"], shuffle=False).batch(BATCH)


def _model(scaling: str, monkeypatch, scale_sense=None) -> tuple[Model, nn.Cell, list]:
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    weights = net.trainable_params()
    if scaling == "none":
        return Model(net, nn.MSELoss(), nn.Momentum(weights, 0.01, 0.9)), loss_net, weights
    if scaling == "optimizer":  # the optimizer divides the scale out inside its update
        optimizer = nn.Momentum(weights, 0.01, 0.9, loss_scale=SCALE)
        manager = FixedLossScaleManager(SCALE, drop_overflow_update=False)
        return Model(net, nn.MSELoss(), optimizer, loss_scale_manager=manager), loss_net, weights
    monkeypatch.setattr(TrainOneStepWithLossScaleCell, "get_overflow_status", mindformers_cpu._cpu_overflow)
    sense = scale_sense if scale_sense is not None else nn.FixedLossScaleUpdateCell(loss_scale_value=SCALE)
    cell = TrainOneStepWithLossScaleCell(loss_net, nn.Momentum(weights, 0.01, 0.9), scale_sense=sense)
    return Model(cell), loss_net, weights


def _monitor(workdir, interval: int = INTERVAL) -> MonitorCallback:
    return MonitorCallback(
        {
            "interval": interval,
            "grad_monitor": True,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(workdir / "m.json"),
            "tensorboard_path": str(workdir / "tb"),
            "alert_config": {"enable_alert": True},
        }
    )


def _lines(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]


def _tensorboard(workdir, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(workdir / "tb" / "rank_0"))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


@pytest.mark.parametrize("scaling", ["none", "optimizer", "cell"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_sampled_norm_is_that_steps_gradient_norm(workdir, monkeypatch, mode, scaling):
    ms.set_context(mode=MODES[mode])
    ms.set_device("CPU")
    model, loss_net, weights = _model(scaling, monkeypatch)
    reference = _ReferenceNorms(loss_net, weights)

    model.train(1, _data(), callbacks=[reference, _monitor(workdir)], dataset_sink_mode=False)

    lines = _lines(workdir)
    assert [line["step"] for line in lines] == [1, 3, 6, 7]
    for line in lines:
        assert line["grad_norm"] == pytest.approx(reference.norms[line["step"]], rel=1e-4), line["step"]
    # The norms differ from step to step: a stale value would not pass.
    assert len({round(line["grad_norm"], 6) for line in lines}) == len(lines)
    assert _tensorboard(workdir, "grad_norm") == pytest.approx({line["step"]: line["grad_norm"] for line in lines})


# Near fp32's largest: a gradient above ~1 overflows, as fp16 scaling does; the scale is
# lowered on each overflow and never raised again in this short run.
HUGE, FACTOR, WINDOW = 3.0e38, 2.0**10, 1000


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_overflow_step_is_non_finite_and_no_fault(workdir, monkeypatch, mode):
    ms.set_context(mode=MODES[mode])
    ms.set_device("CPU")
    dynamic = nn.DynamicLossScaleUpdateCell(loss_scale_value=HUGE, scale_factor=FACTOR, scale_window=WINDOW)
    model, loss_net, weights = _model("cell", monkeypatch, scale_sense=dynamic)
    reference = _ReferenceNorms(loss_net, weights)

    model.train(1, _data(12), callbacks=[reference, _monitor(workdir, interval=1)], dataset_sink_mode=False)

    lines = _lines(workdir)
    overflowed = [line for line in lines if line["overflow"]]
    assert overflowed and overflowed[-1]["step"] < lines[-1]["step"]
    for line in lines:
        assert "nonfinite" not in line.get("alerts", [])  # loss scaling at work, not a fault
        if line["overflow"]:
            assert line["grad_norm"] is None and line["nonfinite"] == ["grad_norm"]
        else:
            assert line["grad_norm"] == pytest.approx(reference.norms[line["step"]], rel=1e-4)


def _train_cell_run(workdir, name: str, build_cell) -> tuple[list[dict], set[str]]:
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    cell = build_cell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    folder = workdir / name
    optimizers = _OptimizerSeen()
    Model(cell).train(1, _data(), callbacks=[_monitor(folder, interval=1), optimizers], dataset_sink_mode=False)
    return _lines(folder), optimizers.seen


class _OptimizerSeen(Callback):
    """The kinds of optimizer the train cell called during the run."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def on_train_step_end(self, run_context) -> None:
        self.seen.add(type(run_context.original_args().train_network.optimizer).__name__)


@pytest.mark.mindformers
def test_mindformers_cell_keeps_its_own_norm_and_the_probe_reports_the_same(workdir, monkeypatch):
    """The same weights and batches through MindFormers' MFTrainOneStepCell (its 5th output,
    with a clip that never clips) and through nn.TrainOneStepCell (the probe)."""
    from mindformers.wrapper.wrapper import MFTrainOneStepCell

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    monkeypatch.setattr(TrainOneStepWithLossScaleCell, "get_overflow_status", mindformers_cpu._cpu_overflow)
    mindformers, mf_optimizers = _train_cell_run(
        workdir, "mf", lambda net, opt: MFTrainOneStepCell(net, opt, use_clip_grad=True, max_grad_norm=1e9)
    )
    probed, optimizers = _train_cell_run(workdir, "ms", nn.TrainOneStepCell)

    assert mf_optimizers == {"Momentum"} and optimizers == {"GradNormProbe"}  # MindFormers': its own norm
    assert [line["step"] for line in mindformers] == [line["step"] for line in probed] == list(range(1, STEPS + 1))
    assert [line["grad_norm"] for line in probed] == pytest.approx(
        [line["grad_norm"] for line in mindformers], rel=1e-5
    )


@pytest.mark.integration  # an msrun job
@pytest.mark.msrun_job
@pytest.mark.msrun_api  # the probe after the data-parallel all-reduce
def test_data_parallel_ranks_report_the_norm_of_the_averaged_gradients(workdir):
    from tests.support.instrumented import BIN, REPO, child_env, free_port, run

    steps = 5
    run(
        [
            str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
            "--join=True", f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "grad_norm_worker.py"), str(workdir), str(steps),
        ],
        child_env(),
        workdir,
    )  # fmt: skip

    by_rank = [{line["step"]: line for line in _lines_of(next(workdir.rglob(f"rank{r}*.json")))} for r in (0, 1)]
    assert sorted(by_rank[0]) == sorted(by_rank[1]) == [1, 2, 4, 5]
    for step in by_rank[0]:
        local = [np.load(workdir / f"grads_rank{r}_step{step}.npy") for r in (0, 1)]
        assert not np.allclose(local[0], local[1])  # each rank's own batch
        averaged = float(np.linalg.norm((local[0] + local[1]) / 2))
        for rank in (0, 1):
            assert by_rank[rank][step]["grad_norm"] == pytest.approx(averaged, rel=1e-4), (rank, step)


def _lines_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plain_training_has_grad_norm_in_every_output(workdir, monkeypatch, otlp_receiver):
    from otel_mindformers.analysis.plot import plot
    from otel_mindformers.names import semconv
    from otel_mindformers.names import training as tm
    from otel_mindformers.outputs.jsonl_reader import read_logs
    from tests.support.plot_pixels import count, load, panels

    monkeypatch.setenv("RANK_ID", "0")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    model, _, _ = _model("none", monkeypatch)
    monitor = MonitorCallback(
        {
            "interval": INTERVAL,
            "grad_monitor": True,
            "output_type": ["json_file", "tensorboard", "otlp"],
            "json_log_path": str(workdir / "m.json"),
            "tensorboard_path": str(workdir / "tb"),
            "otlp": {"endpoint": otlp_receiver.grpc_endpoint, "export_interval": 0.2},
        }
    )
    model.train(1, _data(), callbacks=[monitor], dataset_sink_mode=False)

    norms = {line["step"]: line["grad_norm"] for line in _lines(workdir)}
    assert sorted(norms) == [1, 3, 6, 7] and all(value > 0 for value in norms.values())
    assert _tensorboard(workdir, "grad_norm") == pytest.approx(norms)
    spans = otlp_receiver.spans(semconv.SPAN_STEP)
    assert {s.attributes[semconv.ATTR_STEP]: s.attributes["training.grad_norm"] for s in spans} == pytest.approx(norms)
    points = otlp_receiver.points(tm.instrument_name(tm.GRAD_NORM))
    assert points and all(any(p.value == pytest.approx(v) for v in norms.values()) for p in points)
    image = plot(read_logs([workdir / "m.json"]), workdir / "run.png")
    assert count(panels(load(image))["grad_norm"], "C0") > 0  # not "grad norm: no data"


# --- sparse gradients and two optimizers: the wide & deep pattern -----------------------------

VOCAB, FIELDS, DIM = 20, 3, 4


class _WideDeep(nn.Cell):
    """A wide part (a 1-wide embedding summed over the fields) and a deep part (a 4-wide
    embedding, then a Dense), as MindSpore's wide & deep. `sparse`: EmbeddingLookup(sparse=True),
    whose gradients are RowTensors; else nn.Embedding (a Gather: dense gradients)."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.wide = nn.EmbeddingLookup(VOCAB, 1, sparse=True) if sparse else nn.Embedding(VOCAB, 1)
        self.deep = nn.EmbeddingLookup(VOCAB, DIM, sparse=True) if sparse else nn.Embedding(VOCAB, DIM)
        self.dense = nn.Dense(FIELDS * DIM, 1)

    def construct(self, ids):
        wide = self.wide(ids).sum(axis=1)
        return wide + self.dense(self.deep(ids).reshape((ids.shape[0], -1)))


class _WideDeepTrainCell(nn.Cell):
    """Two optimizers, as wide & deep's train cell: FTRL on the wide part, LazyAdam on the
    deep part; neither is called `optimizer`."""

    def __init__(self, loss_net: nn.Cell, net: _WideDeep) -> None:
        super().__init__()
        self.network = loss_net
        self.weights_w = net.wide.trainable_params()
        self.weights_d = net.deep.trainable_params() + net.dense.trainable_params()
        self.weights = ms.ParameterTuple(self.weights_w + self.weights_d)
        self.optimizer_w = nn.FTRL(self.weights_w, learning_rate=0.05)
        self.optimizer_d = nn.LazyAdam(self.weights_d, learning_rate=0.05)
        self.grad = ops.GradOperation(get_by_list=True)
        self.split = len(self.weights_w)

    def step(self, ids, y):
        loss = self.network(ids, y)
        grads = self.grad(self.network, self.weights)(ids, y)
        loss = ops.depend(loss, self.optimizer_w(grads[: self.split]))
        return ops.depend(loss, self.optimizer_d(grads[self.split :]))

    def construct(self, ids, y):
        return self.step(ids, y)


class _JitWideDeepTrainCell(_WideDeepTrainCell):
    """The same step compiled with `mindspore.jit` in PyNative mode (plain PyNative cannot
    train sparse embeddings with FTRL or LazyAdam: MindSpore 2.9 hands them a dense-shaped
    gradient, with or without this package)."""

    @ms.jit
    def construct(self, ids, y):
        return self.step(ids, y)


class _DenseTwinNorms(Callback):
    """At each step's begin, the global norm of the step's gradients computed by an
    independent dense network: the same weights (copied in, in order), no sparse gradient."""

    def __init__(self, sparse_net: nn.Cell) -> None:
        self._sparse = sparse_net
        self._dense = nn.WithLossCell(_WideDeep(sparse=False), nn.MSELoss())
        self._grad = ms.grad(self._dense, grad_position=None, weights=self._dense.trainable_params())
        self.norms: dict[int, float] = {}

    def on_train_step_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        for source, parameter in zip(self._sparse.trainable_params(), self._dense.trainable_params(), strict=True):
            ops.assign(parameter, ms.Tensor(source.asnumpy()))  # in place: its compiled grad reads it
        grads = self._grad(*cb_params.train_dataset_element)
        self.norms[cb_params.cur_step_num] = math.sqrt(
            sum(float(np.square(g.asnumpy().astype(np.float64)).sum()) for g in grads)
        )


def _ids_data(steps: int):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 6, size=(steps * BATCH, FIELDS)).astype(np.int32)  # ids repeat in a batch
    y = rng.standard_normal((steps * BATCH, 1)).astype(np.float32)
    return GeneratorDataset(list(zip(ids, y)), column_names=["ids", "y"], shuffle=False).batch(BATCH)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sparse_gradients_of_two_optimizers_count_as_their_dense_gradients(workdir, caplog, mode):
    """The wide & deep pattern trains with grad_monitor on (it failed to compile), and each
    step's norm is that of the dense gradients over both optimizers' parameters."""
    ms.set_context(mode=MODES[mode])
    ms.set_device("CPU")
    ms.set_seed(0)
    net = _WideDeep(sparse=True)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    cell = (_WideDeepTrainCell if mode == "graph" else _JitWideDeepTrainCell)(loss_net, net)
    reference = _DenseTwinNorms(net)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        Model(cell).train(1, _ids_data(4), [reference, _monitor(workdir, interval=1)], dataset_sink_mode=False)

    lines = _lines(workdir)
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    for line in lines:
        assert line["grad_norm"] == pytest.approx(reference.norms[line["step"]], rel=1e-4), line["step"]
    assert not [r for r in caplog.records if "grad_monitor" in r.getMessage()]


# --- gradient accumulation: the optimizer runs every ACCUMULATE-th step ------------------------

ACCUMULATE = 4


class _AccumulatingCell(nn.Cell):
    """Adds each step's gradients up and calls its optimizer with their mean on every
    ACCUMULATE-th step (steps 4, 8, 12, ...), then starts again from zero."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer) -> None:
        super().__init__()
        self.network, self.optimizer = network, optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)
        self.accumulated = self.weights.clone(prefix="accumulated", init="zeros")
        self.counter = ms.Parameter(ms.Tensor(0, ms.int32), name="accumulation_counter", requires_grad=False)

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad(self.network, self.weights)(x, y)
        for total, grad in zip(self.accumulated, grads):
            loss = ops.depend(loss, ops.assign_add(total, grad))
        loss = ops.depend(loss, ops.assign_add(self.counter, ms.Tensor(1, ms.int32)))
        if self.counter % ACCUMULATE == 0:
            loss = ops.depend(loss, self.optimizer(tuple(total / ACCUMULATE for total in self.accumulated)))
            for total in self.accumulated:
                loss = ops.depend(loss, ops.assign(total, ops.zeros_like(total)))
        return loss


class _ReferenceGradients(Callback):
    """At each step's begin, the step's batch gradients (one flat float64 vector)."""

    def __init__(self, loss_net: nn.Cell, weights: list) -> None:
        self._grad = ms.grad(loss_net, grad_position=None, weights=weights)
        self.gradients: dict[int, np.ndarray] = {}

    def on_train_step_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        grads = self._grad(*cb_params.train_dataset_element[:2])
        self.gradients[cb_params.cur_step_num] = np.concatenate([g.asnumpy().astype(np.float64).ravel() for g in grads])


# interval -> the sampled steps (every interval-th, the first, the last: 14) whose own norm is
# known: graph, interval 3: samples 1 3 6 9 12 14, updates at 4 8 12; step 6 follows an update
# at 4 (cannot be told apart), so from there each sample's begin is read: 9 none, 12 its own.
# PyNative, interval 2: samples 1 2 4 6 8 10 12 14; 4 cannot be told apart; 8 and 12 updated.
ACCUMULATION_RUNS = {"graph": (3, [12]), "pynative": (2, [8, 12])}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_accumulating_cell_has_the_norm_of_the_steps_that_update_and_no_other(workdir, caplog, mode):
    interval, updated = ACCUMULATION_RUNS[mode]
    ms.set_context(mode=MODES[mode])
    ms.set_device("CPU")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    cell = _AccumulatingCell(loss_net, nn.Momentum(net.trainable_params(), 0.01, 0.9))
    reference = _ReferenceGradients(loss_net, net.trainable_params())
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        Model(cell).train(1, _data(14), [reference, _monitor(workdir, interval=interval)], dataset_sink_mode=False)

    lines = _lines(workdir)
    assert [line["step"] for line in lines] == sorted({1, *range(interval, 15, interval), 14})
    assert [line["step"] for line in lines if "grad_norm" in line] == updated  # no other step, no old norm
    for step in updated:
        applied = sum(reference.gradients[s] for s in range(step - ACCUMULATE + 1, step + 1)) / ACCUMULATE
        (line,) = [line for line in lines if line["step"] == step]
        assert line["grad_norm"] == pytest.approx(float(np.linalg.norm(applied)), rel=1e-4), step
    assert not [r for r in caplog.records if "grad_monitor" in r.getMessage()]


# --- a cell that clips its gradients before its optimizer --------------------------------------

# MindSpore deprecates `ops.clip_by_global_norm` after 2.9; `ops.clip_by_norm` of a tuple is
# the same global clip.
_clip_by_global_norm = getattr(ops, "clip_by_global_norm", None) or ops.clip_by_norm


class _ClippingCell(nn.TrainOneStepCell):
    """The most common custom train cell: the gradients clipped to a global norm of 1."""

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = _clip_by_global_norm(self.grad_no_sens(self.network, self.weights)(x, y), 1.0)
        return ops.depend(loss, self.optimizer(grads))


def test_a_clipping_cell_reports_the_clipped_norm_and_says_so_once(workdir, caplog):
    """What the optimizer receives is measured: at the clip value while the gradients are
    larger (docs/model_state.md), which the run says once, at the third such step in a row;
    step 4's small gradients are not clipped, and steps 5 to 7 clip again (said already)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    cell = _ClippingCell(loss_net, nn.Momentum(net.trainable_params(), 0.001, 0.9))
    reference = _ReferenceNorms(loss_net, net.trainable_params())
    said_by_step: dict[int, int] = {}

    class _Said(Callback):  # after the monitor: what it has said by each step's end
        def on_train_step_end(self, run_context) -> None:
            said_by_step[run_context.original_args().cur_step_num] = len(_clip_warnings(caplog))

    spread = [30.0, 30.0, 30.0, 0.01, 30.0, 30.0, 30.0]
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        callbacks = [reference, _monitor(workdir, interval=1), _Said()]
        Model(cell).train(1, _data(7, spread), callbacks, dataset_sink_mode=False)

    norms = {line["step"]: line["grad_norm"] for line in _lines(workdir)}
    clipped = [step for step in norms if reference.norms[step] > 1.0]
    assert clipped == [1, 2, 3, 5, 6, 7] and [norms[s] for s in clipped] == pytest.approx([1.0] * 6, rel=1e-5)
    assert norms[4] == pytest.approx(reference.norms[4], rel=1e-4)  # below the clip: the true norm
    assert said_by_step == {1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1}
    (said,) = _clip_warnings(caplog)
    assert "grad_norm has been 1 on 3 sampled steps in a row" in said


def _clip_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "clip its gradients" in r.getMessage()]
