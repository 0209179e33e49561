"""Reading the step's outputs back to the host (runtime/extract.py) on real MindSpore tensors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from otel_mindformers.config import GradNorm
from otel_mindformers.names import training as tm
from otel_mindformers.runtime.extract import OutputReader, to_host

pytestmark = pytest.mark.mindspore_api


@pytest.mark.parametrize(
    "value",
    [
        ms.Tensor(np.array([1.0, 2.0, 6.0], dtype=np.float32)),  # a per-micro-batch loss
        ms.Tensor(np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32) * 0.75 + 0.25 * 3.0),
        np.array([0.5, 5.5, 3.0]),
    ],
    ids=["micro-batches", "2-d", "numpy"],
)
def test_a_multi_element_loss_is_its_mean(value):
    assert to_host(value) == pytest.approx(3.0)


def test_the_recorded_loss_of_a_per_micro_batch_output_is_their_mean():
    loss = ms.Tensor(np.array([2.0, 4.0, 9.0], dtype=np.float32))
    outputs = OutputReader([tm.LOSS], GradNorm.OFF)
    assert outputs.read({"net_outputs": (loss, ms.Tensor(False), ms.Tensor(1024.0))}, step=1)[tm.LOSS] == 5.0


def test_a_one_element_tensor_and_an_empty_one():
    assert to_host(ms.Tensor(np.array([[2.5]], dtype=np.float32))) == 2.5
    with pytest.raises(ValueError, match="empty"):
        to_host(np.array([]))


def test_a_custom_monitors_learning_rate_converts_with_numpy_1_and_2_alike():
    """numpy 2 passes `copy` to `__array__` and warns about an `__array__` without it."""
    import warnings

    from mindspore import nn

    from otel_mindformers.runtime.extract import LazyLearningRate

    net = nn.Dense(2, 1)
    rate = LazyLearningRate(nn.Momentum(net.trainable_params(), 0.125, 0.9)).at(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.asarray(rate) == pytest.approx(0.125)
        copied = np.array(rate, copy=True, dtype=np.float64)
    assert copied.dtype == np.float64 and copied == pytest.approx(0.125)


def test_a_custom_monitor_reads_a_one_element_output_with_float_under_numpy_2():
    """MindFormers' cells return the loss as `(1,)`, and the monitor_config article's monitor
    calls `float(cb_params.train_loss.asnumpy())`, which numpy 2.4 refuses for a `(1,)` array."""
    from mindspore import Tensor

    from otel_mindformers.runtime.extract import StepTensor

    loss = StepTensor().at(Tensor(np.array([2.5], np.float32)))
    assert loss.asnumpy().shape == ()
    assert float(loss.asnumpy()) == 2.5 and float(loss) == 2.5 and loss.shape == (1,)
    batch = StepTensor().at(Tensor(np.array([1.0, 3.0], np.float32)))
    assert batch.asnumpy().shape == (2,) and float(batch) == 2.0  # several elements: as they are


def test_a_probe_that_cannot_be_read_back_leaves_the_norm_out_with_one_warning(caplog):
    """The probes' Parameters read back on sampled steps: one that fails (here a value that is
    no tensor where its count should be) costs the norm, said once, never the step."""
    import logging

    from otel_mindformers.core.clock import StepClock
    from otel_mindformers.model_state.grad_norm_reader import GradNormReader

    class Probe:  # a GradNormProbe's two Parameters, after one call
        norm = ms.Parameter(ms.Tensor([2.0], ms.float32), name="norm")
        calls = ms.Parameter(ms.Tensor([0], ms.int32), name="calls")

    reader = OutputReader([tm.LOSS, tm.GRAD_NORM], GradNorm.MEASURED)
    reader.grad_norm_probe = probes = GradNormReader([Probe()], ["optimizer"], StepClock(), first_step=0)
    Probe.calls.set_data(ms.Tensor([1], ms.int32))
    cb_params = {"net_outputs": ms.Tensor([0.5], ms.float32)}
    assert reader.read(cb_params, step=1) == {tm.LOSS: 0.5, tm.GRAD_NORM: 2.0}
    probes._calls = ("not a tensor",)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        for step in (2, 3):
            assert reader.read(cb_params, step=step) == {tm.LOSS: 0.5}
        probes.close()
    said = [r.getMessage() for r in caplog.records if "grad_monitor" in r.getMessage()]
    assert len(said) == 1 and "cannot read the gradient-norm probe" in said[0], said
