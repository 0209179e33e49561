"""The global gradient norm of any MindSpore train cell, measured where the gradients are.

`grad_monitor: True` on a train cell that does not return the norm (everything but
MindFormers' cells): each optimizer the cell holds (any `nn.Optimizer` among its cells, so
`optimizer` and a `head_optimizer`, or wide & deep's `optimizer_w` and `optimizer_d`) is
wrapped, at train begin, in a `GradNormProbe`. On every call, inside the step's graph (graph
mode) or with the step's ops (PyNative), it takes the L2 norm of the gradients the optimizer
receives (`global_norm`) and assigns it into one Parameter, and counts the call in another:
no host sync. The run reads them back on sampled steps only (model_state/grad_norm_reader.py).

Which gradients: what the cell hands its optimizer, so after the data-parallel all-reduce
(`grad_reducer`: every rank holds the job's norm), after the cell's loss-scale division
(`TrainOneStepWithLossScaleCell`) and after any clipping the cell does (docs/model_state.md).
An optimizer built with `loss_scale=S` (what `FixedLossScaleManager(drop_overflow_update=False)`
asks for) divides inside its update: the probe divides by S too. Sparse gradients (a
`RowTensor`, from `EmbeddingLookup(sparse=True)`) count as the dense gradients they stand for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from otel_mindformers.compat import mindspore_cell

# The probe's Parameters are named `otel_mindformers_grad_norm.<place>` (and `.calls`).
PARAMETER_PREFIX = "otel_mindformers_grad_norm"

_square_sum = ops.MultitypeFuncGraph("otel_square_sum")


@_square_sum.register("Tensor")
def _tensor_square_sum(gradient: Any) -> Any:
    """One kernel per gradient: the dot product of the flattened gradient with itself, a
    MatMul (BLAS on the CPU, the cube on Ascend). Square then ReduceSum is two kernels and a
    temporary the gradient's size, measured 4 times dearer on the CPU (docs/model_state.md).
    In float32 whatever the gradient's type: a half-precision sum of squares overflows."""
    if gradient.dtype != ms.float32:  # decided when the graph is built
        gradient = ops.cast(gradient, ms.float32)
    return ops.matmul(ops.reshape(gradient, (1, -1)), ops.reshape(gradient, (-1, 1)))


@_square_sum.register("RowTensor")
def _row_tensor_square_sum(gradient: Any) -> Any:
    """A sparse gradient: row `values[i]` of the dense gradient at row `indices[i]`, and the
    rows of a repeated index add up (an id twice in a batch). Summed per distinct index
    (as MindSpore's optimizers deduplicate), its square sum is the dense gradient's."""
    indices = gradient.indices
    _, slots = ops.unique(indices)  # each row's place among the distinct indices
    return _tensor_square_sum(ops.unsorted_segment_sum(gradient.values, slots, indices.shape[0]))


def global_norm(gradients: Any) -> Any:
    """The L2 norm over a tuple of gradients (dense tensors and RowTensors), as a one-element
    float32 tensor, in graph mode (inside `construct` or `jit`) and in PyNative.

    A running sum rather than one AddN: beside a sparse gradient the gradients' kinds are
    still "Undetermined" while the step's graph is built, which AddN refuses (the tensor
    sum waits for them); on the CPU it measured no slower than AddN on an 84-gradient MLP."""
    total = ops.zeros((1, 1), ms.float32)
    for square_sum in ops.HyperMap()(_square_sum, gradients):
        total = total + square_sum
    return ops.sqrt(total)


# The write of the norm, dispatched on its kind like the gradients: a Parameter assigned from
# a value whose kind is still Undetermined crashes MindSpore's graph compiler (2.9, beside a
# sparse gradient); through a MultitypeFuncGraph the assignment waits until it is known.
_store = ops.MultitypeFuncGraph("otel_store_norm")


@_store.register("Tensor", "Tensor")
def _store_norm(parameter: Any, norm: Any) -> Any:
    return ops.assign(parameter, ops.reshape(norm, (1,)))


class GradNormProbe(nn.Cell):
    """The optimizer, as the train cell calls it, with the gradients' global norm written
    into `norm` (a one-element float32 Parameter) and the call counted in `calls` (int32) on
    each call. Attributes it lacks are the optimizer's (`learning_rate`, `global_step`,
    `get_lr`: what callbacks read from `train_network.optimizer`)."""

    def __init__(self, optimizer: nn.Optimizer, place: str = "optimizer") -> None:
        # auto_prefix=False: the optimizer's Parameters keep their names (checkpoints).
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        loss_scale = float(getattr(optimizer, "loss_scale", 1.0) or 1.0)
        self.unscale = loss_scale != 1.0
        self.reciprocal_scale = 1.0 / loss_scale
        # Named after the optimizer's place in the train network (`optimizer`): one name per
        # probe where a network holds two, the same name in every run (checkpoints).
        prefix = f"{PARAMETER_PREFIX}.{place}"
        self.norm = Parameter(Tensor([0.0], ms.float32), name=prefix, requires_grad=False)
        self.calls = Parameter(Tensor([0], ms.int32), name=f"{prefix}.calls", requires_grad=False)
        self.one = Tensor([1], ms.int32)

    def construct(self, gradients: Any) -> Any:
        norm = global_norm(gradients)
        if self.unscale:  # a Python constant: no branch in the graph
            norm = norm * self.reciprocal_scale
        _store(self.norm, norm)
        ops.assign_add(self.calls, self.one)
        return self.optimizer(gradients)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            optimizer = mindspore_cell.own_cells(self).get("optimizer")
            if optimizer is None:  # still being built
                raise
            return getattr(optimizer, name)


class _Place(NamedTuple):
    """Where the train network holds an optimizer: `parent.attribute`, `name` dotted from
    the train network (`optimizer`, `inner.head_optimizer`)."""

    parent: Any
    attribute: str
    name: str


@dataclasses.dataclass(frozen=True)
class Probed:
    """One optimizer's probe and every place the train network holds it."""

    probe: GradNormProbe
    places: tuple[_Place, ...]

    @property
    def name(self) -> str:
        return self.places[0].name


def _optimizers(train_network: nn.Cell) -> dict[int, tuple[Any, list[_Place]]]:
    """Every optimizer (or probe of an earlier run) among the network's cells, by identity,
    with its places. Optimizers are not searched inside."""
    found: dict[int, tuple[Any, list[_Place]]] = {}
    seen = {id(train_network)}
    frontier: list[tuple[Any, str]] = [(train_network, "")]
    while frontier:
        parent, path = frontier.pop(0)
        for attribute, child in mindspore_cell.own_cells(parent).items():
            if isinstance(child, (GradNormProbe, nn.Optimizer)):
                found.setdefault(id(child), (child, []))[1].append(_Place(parent, attribute, path + attribute))
            elif isinstance(child, nn.Cell) and id(child) not in seen:
                seen.add(id(child))
                frontier.append((child, f"{path}{attribute}."))
    return found


def _updates_map_parameters(optimizer: Any) -> bool:
    """Dynamic embeddings (`MapParameter`): their gradients are MapTensors, which the probe
    does not measure."""
    try:
        from mindspore.experimental import MapParameter
    except ImportError:  # a release without them
        return False
    return isinstance(optimizer, nn.Optimizer) and any(isinstance(p, MapParameter) for p in optimizer.parameters)


def install_probes(train_network: Any) -> tuple[list[Probed], str]:
    """Wrap each optimizer the train network holds in a probe, or find the ones a previous
    run put there (graph mode keeps them). Returns the probes, or [] and why not."""
    optimizers = list(_optimizers(train_network).values()) if isinstance(train_network, nn.Cell) else []
    if not optimizers:
        return [], "the train network holds no mindspore.nn.Optimizer cell"
    fresh = [cell for cell, _ in optimizers if not isinstance(cell, GradNormProbe)]
    if fresh and ms.get_context("mode") == ms.GRAPH_MODE and mindspore_cell.compiled(train_network):
        return [], "the train network's graph was compiled before monitoring started (Model.build, or an earlier train)"
    for cell, places in optimizers:
        if _updates_map_parameters(cell):
            return (
                [],
                f"`{places[0].name}` updates MapParameters (dynamic embeddings), whose gradients it cannot measure",
            )
    probed = []
    for cell, places in optimizers:
        probe = cell if isinstance(cell, GradNormProbe) else GradNormProbe(cell, places[0].name)
        for place in places:
            # Not `parent.attribute = probe`: a cell with auto_prefix would rename the
            # optimizer's Parameters under the new attribute (its checkpoints' names).
            mindspore_cell.put_child(place.parent, place.attribute, probe)
        probed.append(Probed(probe, tuple(places)))
    return probed, ""


def remove_probes(probed: list[Probed]) -> None:
    """Give the train network its optimizers back where nothing compiled holds the probes
    (PyNative); a compiled graph keeps them, and the next run reuses them."""
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return
    for one in probed:
        for place in one.places:
            if mindspore_cell.own_cells(place.parent).get(place.attribute) is one.probe:
                mindspore_cell.put_child(place.parent, place.attribute, one.probe.optimizer)


__all__ = ["PARAMETER_PREFIX", "GradNormProbe", "Probed", "global_norm", "install_probes", "remove_probes"]
