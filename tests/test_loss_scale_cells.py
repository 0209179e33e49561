"""MindSpore's own fp16 loss-scale cells, not a stand-in: `TrainOneStepWithLossScaleCell` with a
`DynamicLossScaleUpdateCell` and with a `FixedLossScaleUpdateCell` (what `Model(...,
loss_scale_manager=...)` builds), trained for real. The CPU backend lacks the cell's
NPUGetFloatStatusV2, so its overflow check is replaced by the same answer computed from the
gradients (tests/support/mindformers_cpu.py); everything else is MindSpore's.

A huge loss scale overflows fp32 gradients as fp16 scaling does: those steps skip their
update, lower the dynamic scale, and are reported as overflow, not as non-finite values."""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.nn.wrap.loss_scale import TrainOneStepWithLossScaleCell
from mindspore.train import Model

from otel_mindformers import MonitorCallback
from tests.support import mindformers_cpu

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

FEATURES, BATCH, STEPS = 8, 4, 16
# Near fp32's largest: a gradient above 1.13 overflows. A long window: the lowered scale is
# never raised again (raised past fp32's range it would become inf, MindSpore does not cap it).
SCALE, FACTOR, WINDOW = 3.0e38, 2.0**10, 1000


def _train(workdir, monkeypatch, scale_sense) -> list[dict]:
    monkeypatch.setattr(TrainOneStepWithLossScaleCell, "get_overflow_status", mindformers_cpu._cpu_overflow)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")  # as tests/support/training.py does: later tests set it again
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((STEPS * BATCH, 8)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
    data = GeneratorDataset(list(zip(x, y)), column_names=["x", "y"], shuffle=False).batch(BATCH)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    cell = TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, scale_sense=scale_sense)
    callback = MonitorCallback(
        {
            "interval": 1,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(workdir / "m.json"),
            "tensorboard_path": str(workdir / "tb"),
            "alert_config": {"enable_alert": True, "overflow_streak": 2},
        }
    )
    Model(cell).train(1, data, callbacks=[callback], dataset_sink_mode=False)
    return [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]


def _scalars(workdir, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(workdir / "tb" / "rank_0"))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars(tag)]


def test_dynamic_scale_overflow_steps_lower_the_scale_and_are_not_faults(workdir, monkeypatch):
    update = nn.DynamicLossScaleUpdateCell(loss_scale_value=SCALE, scale_factor=FACTOR, scale_window=WINDOW)
    lines = _train(workdir, monkeypatch, update)

    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    overflowed = [line["step"] for line in lines if line["overflow"]]
    assert overflowed and len(overflowed) < STEPS
    previous = SCALE
    for line in lines:
        # The scale the cell returns is the one after the step's update: an overflow step
        # reports the lowered scale (as telemetry.md's table says), a good one the same.
        assert line["loss_scale"] == pytest.approx(previous / FACTOR if line["overflow"] else previous)
        previous = line["loss_scale"]
        assert "nonfinite" not in line and "nonfinite" not in line.get("alerts", [])
    assert _scalars(workdir, "overflow") == [1.0 if line["overflow"] else 0.0 for line in lines]
    assert _scalars(workdir, "loss_scale") == pytest.approx([line["loss_scale"] for line in lines])


def test_fixed_scale_keeps_its_scale_and_alerts_a_streak_of_overflows(workdir, monkeypatch):
    lines = _train(workdir, monkeypatch, nn.FixedLossScaleUpdateCell(loss_scale_value=SCALE))

    assert [line["loss_scale"] for line in lines] == pytest.approx([SCALE] * STEPS)
    overflowed = [line["step"] for line in lines if line["overflow"]]
    assert overflowed
    streaks = [line["step"] for line in lines if "overflow_streak" in line.get("alerts", [])]
    # The streak rule fires on the second overflowed step in a row, never on a lone one.
    assert streaks == [s for s in overflowed if s - 1 in overflowed]
    assert not any("nonfinite" in line for line in lines)
