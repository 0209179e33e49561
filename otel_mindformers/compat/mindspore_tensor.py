"""How a one-element MindSpore tensor is read back to the host on a sampled step.

`Tensor.item()` is a Python method that wraps the C method `Tensor._item`; inside
`Model.train` that wrapper's frame is cold after every compiled step (docs/performance.md),
so the read plan (runtime/extract.py) and the gradient-norm reader call `_item` itself.
`_item` is private: `read_scalar` calls it where this release has it and the public `item()`
where it does not, so a release that drops it costs a frame, not the readings.
tests/test_compat.py checks it on the installed release, and that no module outside
compat/ names `_item`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

PRIVATE_READ = "_item"  # the C method
PUBLIC_READ = "item"


def scalar_method(tensor_type: type) -> str:
    """The name of `tensor_type`'s one-element read: `_item` where it has one, else `item`."""
    return PRIVATE_READ if callable(getattr(tensor_type, PRIVATE_READ, None)) else PUBLIC_READ


def _installed_tensor() -> type:
    from mindspore import Tensor

    return Tensor


# The method the readback calls (a value the read plan can read has it), and the readback
# itself, `read_scalar(tensor)`: a C-level call, no Python frame; a Python float or int.
SCALAR_METHOD: str = scalar_method(_installed_tensor())
read_scalar: Callable[[Any], Any] = operator.methodcaller(SCALAR_METHOD)

__all__ = ["PRIVATE_READ", "PUBLIC_READ", "SCALAR_METHOD", "read_scalar", "scalar_method"]
