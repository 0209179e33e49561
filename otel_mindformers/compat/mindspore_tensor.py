"""How a one-element MindSpore tensor is read back to the host on a sampled step.

`Tensor.item()` is a Python method that wraps the C method `Tensor._item`; inside
`Model.train` that wrapper's frame is cold after every compiled step (docs/performance.md),
so the read plan (runtime/extract.py) and the gradient-norm reader call `_item` itself, as
the unbound C method (a C call: the hot-path count test sees each one). `_item` is private:
`scalar_reader` takes it where the release has it and the public `item` where it does not,
so a release that drops it costs a frame, not the readings. tests/test_compat.py checks it on
the installed release, and that no module outside compat/ names `_item`.
"""

from __future__ import annotations

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


def readable(value: Any) -> bool:
    """True for what `read_scalar` reads: a MindSpore tensor (a Parameter too)."""
    return isinstance(value, Tensor)


__all__ = ["PRIVATE_READ", "PUBLIC_READ", "read_scalar", "readable", "scalar_reader"]
