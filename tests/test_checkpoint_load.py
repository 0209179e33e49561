"""`checkpoint.load`: a real MindSpore checkpoint saved, then loaded before training, is a
phase of the run that follows; unregister() puts MindSpore's `load_checkpoint` back."""

from __future__ import annotations

import json
import os
import sys
import time

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Model

import otel_mindformers

# Importing the package registers the instrumentor: MindSpore's load_checkpoint is wrapped.
from otel_mindformers.integration.checkpoint_load import MINDSPORE_MODULES
from otel_mindformers.integration.instrumentor import MindFormersInstrumentor
from otel_mindformers.names.phase_names import ATTR_CHECKPOINT_PATH, ATTR_CHECKPOINT_SIZE, ATTR_PHASE, PHASE_DURATION
from tests.support import training
from tests.support.configs import config
from tests.support.in_memory import Capture
from tests.support.timed_fit import build_net

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

LOAD_SPAN = "mindformers.phase.checkpoint.load"


def _within(span, bracket: tuple[int, int]) -> bool:
    """The span lies inside the test's own clock readings around the call (Unix ns; 1 ms for
    the run's wall clock, derived from one perf_counter / time pair)."""
    return bracket[0] - 1_000_000 <= span.start_time <= span.end_time <= bracket[1] + 1_000_000


def _train_after_loading(workdir, checkpoint) -> tuple[Capture, tuple[int, int]]:
    """Load `checkpoint` into a new network, then train it monitored; the Unix ns before and
    after the load."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = build_net()
    before = time.time_ns()
    ms.load_checkpoint(str(checkpoint), net)
    after = time.time_ns()
    capture = Capture()
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.Momentum(net.trainable_params(), 0.01, 0.9))
    model.train(
        1, training.build_dataset(4), callbacks=[capture.callback(config(workdir, interval=2))], dataset_sink_mode=False
    )
    return capture, (before, after)


def test_a_checkpoint_loaded_before_training_is_a_phase_of_that_run(workdir):
    checkpoint = workdir / "saved.ckpt"
    ms.save_checkpoint(build_net(), str(checkpoint))
    capture, bracket = _train_after_loading(workdir, checkpoint)

    (load,) = capture.finished(LOAD_SPAN)
    (run,) = capture.finished("mindformers.train")
    assert load.parent.span_id == run.context.span_id
    assert load.start_time < run.start_time  # it happened before the run began
    assert load.attributes[ATTR_PHASE] == "checkpoint.load"
    assert load.attributes[ATTR_CHECKPOINT_PATH] == str(checkpoint)
    assert load.attributes[ATTR_CHECKPOINT_SIZE] == os.path.getsize(checkpoint)
    # The call timed: inside the test's own readings around it (a loaded host's pauses between
    # the two clocks are the test's, not the span's).
    assert _within(load, bracket), (load.start_time, load.end_time, bracket)
    seconds = (load.end_time - load.start_time) / 1e9
    assert seconds > 0
    # Part of the run's start-up breakdown and of the phase histogram: the same seconds.
    last = json.loads((workdir / "m.json").read_text().splitlines()[-1])
    assert last["time"]["checkpoint.load"] == pytest.approx(seconds, abs=1e-3)
    (point,) = [p for p in capture.points()[PHASE_DURATION.name] if p.attributes[ATTR_PHASE] == "checkpoint.load"]
    assert point.count == 1 and point.sum == pytest.approx(seconds, abs=1e-3)


def test_unregister_puts_mindspore_load_checkpoint_back_and_register_wraps_it_again(workdir):
    checkpoint = workdir / "saved.ckpt"
    ms.save_checkpoint(build_net(), str(checkpoint))
    instrumentor = MindFormersInstrumentor()
    wrapped = {name: vars(sys.modules[name])["load_checkpoint"] for name in MINDSPORE_MODULES}
    original = wrapped["mindspore"].__wrapped__
    instrumentor.unregister()
    try:
        assert all(vars(sys.modules[name])["load_checkpoint"] is original for name in MINDSPORE_MODULES)
        capture, _ = _train_after_loading(workdir, checkpoint)
        assert capture.finished(LOAD_SPAN) == []
        # A reference taken while it was wrapped no longer times anything either.
        wrapped["mindspore"](str(checkpoint), build_net())
        capture, _ = _train_after_loading(workdir, checkpoint)
        assert capture.finished(LOAD_SPAN) == []
    finally:
        instrumentor.register()
    assert all(vars(sys.modules[name])["load_checkpoint"] is not original for name in MINDSPORE_MODULES)
    capture, _ = _train_after_loading(workdir, checkpoint)
    assert len(capture.finished(LOAD_SPAN)) == 1


@pytest.mark.mindformers
def test_mindformers_resume_load_is_one_phase_with_the_resume_flag_and_unregister_restores_it(workdir):
    """MindFormers' `transform_and_load_checkpoint`, called as `BaseTrainer.training_process`
    calls it on `resume_training` (with the optimizer), on a real checkpoint file."""
    from mindformers.tools.register import MindFormerConfig
    from mindformers.trainer import base_trainer

    from otel_mindformers.compat import mindformers_api
    from otel_mindformers.names.phase_names import ATTR_CHECKPOINT_RESUME

    checkpoint = workdir / "saved.ckpt"
    ms.save_checkpoint(build_net(), str(checkpoint))
    run_config = MindFormerConfig(
        only_save_strategy=False, load_ckpt_format="ckpt", auto_trans_ckpt=False, load_ckpt_async=False,
        checkpoint={"load_path": str(checkpoint)}, runner_config={"step_scale": None}, model={"model_config": {}},
        load_checkpoint=str(checkpoint),  # where MindFormers before 1.7 reads the path
    )  # fmt: skip
    net = build_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    before = time.time_ns()
    base_trainer.transform_and_load_checkpoint(run_config, None, net, None, optimizer=optimizer)
    after = time.time_ns()
    capture = Capture()
    Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer).train(
        1, training.build_dataset(4), callbacks=[capture.callback(config(workdir, interval=2))], dataset_sink_mode=False
    )
    (load,) = capture.finished(LOAD_SPAN)  # MindSpore's load inside MindFormers' is not a second one
    assert load.attributes[ATTR_CHECKPOINT_PATH] == str(checkpoint)
    assert load.attributes[ATTR_CHECKPOINT_SIZE] == os.path.getsize(checkpoint)
    assert load.attributes[ATTR_CHECKPOINT_RESUME] is True
    assert _within(load, (before, after)), (load.start_time, load.end_time, before, after)

    instrumentor = MindFormersInstrumentor()
    instrumentor.unregister()
    try:
        _, loads = mindformers_api.resume_loads()  # 1.6 has no new-format `load_checkpoint`
        assert "transform_and_load_checkpoint" in loads
        assert not any(hasattr(getattr(base_trainer, name), "__wrapped__") for name in loads)
    finally:
        instrumentor.register()
    assert hasattr(base_trainer.transform_and_load_checkpoint, "__wrapped__")


def test_phases_before_the_run_are_in_its_wall_time_and_not_also_in_its_startup(workdir):
    checkpoint = workdir / "saved.ckpt"
    ms.save_checkpoint(build_net(), str(checkpoint))
    with otel_mindformers.phase("prepare"):  # a user phase before training, as long as a big load
        time.sleep(0.2)
    capture, _ = _train_after_loading(workdir, checkpoint)

    (load,) = capture.finished(LOAD_SPAN)
    (prepare,) = capture.finished("mindformers.phase.prepare")
    (startup,) = capture.finished("mindformers.phase.startup")
    # Start-up spans the run's origin to the first step; the origin is never after a phase
    # that the run counts (in a process's later run the origin is the run's start, and
    # both phases came before it).
    assert startup.start_time <= prepare.start_time < load.start_time
    first = json.loads((workdir / "m.json").read_text().splitlines()[0])["time"]
    before = first["checkpoint.load"] + first["user.prepare"]
    assert before > 0.2
    # Start-up is what no other phase covers: its span's length less the phases inside it.
    assert (startup.end_time - startup.start_time) / 1e9 - first["startup"] == pytest.approx(before, abs=1e-3)
    assert first["productive"] + sum(v for k, v in first.items() if k not in ("wall", "productive")) == (
        pytest.approx(first["wall"], abs=1e-9)
    )
