"""How a one-element MindSpore tensor is read back to the host on a sampled step.

`Tensor.item()` is a Python method that wraps the C method `Tensor._item`; inside
`Model.train` that wrapper's frame is cold after every compiled step (docs/performance.md),
so the read plan (runtime/extract.py) and the gradient-norm reader call `_item` itself, as
the unbound C method (a C call: the hot-path count test sees each one). `_item` is private:
`scalar_reader` takes it where the release has it and the public `item` where it does not,
so a release that drops it costs a frame, not the readings. tests/test_compat.py checks it on
the installed release, and that no module outside compat/ names `_item`.
The same for what a sampled step asks of every gradient and value: a tensor's shape and dtype
(`shape_and_dtype`: the C attributes `_shape` and `_dtype` under the public properties) and
whether a value is a tensor at all (`NATIVE_TENSOR`, the C type under `Tensor`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from mindspore import Tensor

PRIVATE_READ = "_item"
PUBLIC_READ = "item"


def scalar_reader(tensor_type: type) -> Callable[[Any], Any]:
    """`tensor_type`'s one-element read, unbound: `_item` where it has a callable one, else `item`."""
    method = getattr(tensor_type, PRIVATE_READ, None)
    return method if callable(method) else getattr(tensor_type, PUBLIC_READ)


# `read_scalar(tensor)`: a MindSpore tensor's (or Parameter's) one element, a Python float or
# int, in one readback.
read_scalar: Callable[[Any], Any] = scalar_reader(Tensor)


def native_tensor_type(tensor_type: type) -> type[Any]:
    """The C type under `tensor_type` (MindSpore's `TensorPy`: every tensor and Parameter is
    one): `isinstance` against it is one C check, where against `Tensor` a Parameter (whose
    class is made by an ABC metaclass) costs a Python call. `tensor_type` itself where no base
    comes from MindSpore's C extension."""
    for base in tensor_type.__mro__[1:]:
        if base.__module__.startswith("mindspore._c_expression") and hasattr(base, PRIVATE_READ):
            return base
    return tensor_type


# `isinstance(value, NATIVE_TENSOR)`: a MindSpore tensor or Parameter, checked without a frame.
NATIVE_TENSOR: type[Any] = native_tensor_type(Tensor)
PRIVATE_SHAPE = ("_shape", "_dtype")  # `Tensor.shape` and `.dtype` are Python properties over these


def signature_reader(tensor_type: type) -> Callable[[Any], tuple[Any, Any]]:
    """`reader(tensor)`: its (shape, dtype), from the C attributes where `tensor_type` has them
    (no Python frame per tensor: a graph's input check runs over every gradient), else from
    the public properties."""
    names = PRIVATE_SHAPE if all(hasattr(tensor_type, name) for name in PRIVATE_SHAPE) else ("shape", "dtype")
    return operator.attrgetter(*names)


# `shape_and_dtype(tensor)`: a MindSpore tensor's (shape, dtype).
shape_and_dtype: Callable[[Any], tuple[Any, Any]] = signature_reader(Tensor)


def readable(value: Any) -> bool:
    """True for what `read_scalar` reads: a MindSpore tensor (a Parameter too)."""
    return isinstance(value, Tensor)


__all__ = [
    "NATIVE_TENSOR",
    "PRIVATE_READ",
    "PRIVATE_SHAPE",
    "PUBLIC_READ",
    "native_tensor_type",
    "read_scalar",
    "readable",
    "scalar_reader",
    "shape_and_dtype",
    "signature_reader",
]
