"""The global gradient norm of any MindSpore train cell, measured where the gradients are.

`grad_monitor: True` on a train cell that does not return the norm (everything but
MindFormers' cells): the cell's optimizer is wrapped, at train begin, in a `GradNormProbe`.
On every step, inside the step's graph (graph mode) or with the step's ops (PyNative), it
takes the L2 norm of the gradients the optimizer receives and assigns it into one
Parameter: no host sync. The run reads that Parameter back on sampled steps only.

Which gradients: what the cell hands its optimizer, so after the data-parallel all-reduce
(`grad_reducer`: every rank holds the job's norm) and after the cell's loss-scale division
(`TrainOneStepWithLossScaleCell`). An optimizer built with `loss_scale=S` (what
`FixedLossScaleManager(drop_overflow_update=False)` asks for) divides inside its update: the
probe divides by S too. A step whose cell skips the optimizer (an overflow) leaves the
Parameter as it was; the reader reports such a step as non-finite (runtime/extract.py).
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

# Never a norm: the value of a probe its compiled graph does not hold (it never wrote).
NEVER_WRITTEN = -1.0

_square_sum = ops.MultitypeFuncGraph("otel_square_sum")


@_square_sum.register("Tensor")
def _tensor_square_sum(gradient: Any) -> Any:
    """One kernel per gradient: the dot product of the flattened gradient with itself, a
    MatMul (BLAS on the CPU, the cube on Ascend). Square then ReduceSum is two kernels and a
    temporary the gradient's size: +7.2 ms a step against +1.7 ms on the 1024-wide MLP of
    benchmarks/_mlp.py on the CPU, its train cell called directly. In float32 whatever the gradient's type: a half-precision
    sum of squares overflows."""
    if gradient.dtype != ms.float32:  # decided when the graph is built
        gradient = ops.cast(gradient, ms.float32)
    return ops.matmul(ops.reshape(gradient, (1, -1)), ops.reshape(gradient, (-1, 1)))


class GradNormProbe(nn.Cell):
    """The optimizer, as the train cell calls it, with the gradients' global norm written
    into `norm` (a one-element float32 Parameter) on each call. Attributes it lacks are the
    optimizer's (`learning_rate`, `global_step`, `get_lr`: what callbacks read from
    `train_network.optimizer`)."""

    def __init__(self, optimizer: nn.Optimizer) -> None:
        # auto_prefix=False: the optimizer's Parameters keep their names (checkpoints).
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.hyper_map = ops.HyperMap()
        loss_scale = float(getattr(optimizer, "loss_scale", 1.0) or 1.0)
        self.unscale = loss_scale != 1.0
        self.reciprocal_scale = 1.0 / loss_scale
        self.norm = Parameter(
            Tensor([NEVER_WRITTEN], ms.float32), name="otel_mindformers_grad_norm", requires_grad=False
        )

    def construct(self, gradients: Any) -> Any:
        norm = ops.sqrt(ops.addn(self.hyper_map(_square_sum, gradients))).reshape((1,))
        if self.unscale:  # a Python constant: no branch in the graph
            norm = norm * self.reciprocal_scale
        ops.assign(self.norm, norm)
        return self.optimizer(gradients)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            optimizer = self.__dict__.get("_cells", {}).get("optimizer")
            if optimizer is None:  # still being built
                raise
            return getattr(optimizer, name)


def install_probe(train_network: Any) -> tuple[GradNormProbe | None, str]:
    """Wrap the optimizer `train_network` calls (its `optimizer` attribute, as in every
    `nn.TrainOneStepCell`) in a probe, or find the one a previous run put there. Returns the
    probe, or None and why not."""
    optimizer = train_network.name_cells().get("optimizer") if isinstance(train_network, nn.Cell) else None
    if isinstance(optimizer, GradNormProbe):
        return optimizer, ""  # the compiled graph, if any, holds this one
    if not isinstance(optimizer, nn.Optimizer):
        return None, "the train network has no `optimizer` cell that is a mindspore.nn.Optimizer"
    if ms.get_context("mode") == ms.GRAPH_MODE and getattr(train_network, "compile_cache", None):
        return (
            None,
            "the train network's graph was compiled before monitoring started (Model.build, or an earlier train)",
        )
    probe = GradNormProbe(optimizer)
    # Not `train_network.optimizer = probe`: a cell with auto_prefix would rename the
    # optimizer's Parameters under the new attribute (its checkpoints' names).
    train_network.insert_child_to_cell("optimizer", probe)
    return probe, ""


def remove_probe(train_network: Any, probe: GradNormProbe) -> None:
    """Give the train network its optimizer back where nothing compiled holds the probe
    (PyNative); a compiled graph keeps it, and the next run reuses it."""
    if ms.get_context("mode") != ms.GRAPH_MODE and getattr(train_network, "optimizer", None) is probe:
        train_network.insert_child_to_cell("optimizer", probe.optimizer)


__all__ = ["NEVER_WRITTEN", "GradNormProbe", "install_probe", "remove_probe"]
