"""`mindspore.nn.Cell` internals the gradient-norm probe (model_state/grad_norm_probe.py)
and the FLOPs model lookup (timing/efficiency.py) rely on.

- `compiled`: whether a cell's graph-mode graph was built already (`Cell.compile_cache`, the
  phases it compiled): a graph built before the probe was put in never calls it;
- `own_cells`: a cell's direct children by attribute name (`Cell._cells`), read from the
  instance without `Cell.__getattr__`, so it also works on a cell still being built;
- `put_child`: `Cell.insert_child_to_cell`, which replaces a child without prefixing the
  child's Parameters with the attribute's name (attribute assignment on a cell with
  `auto_prefix` would rename them, and with them the checkpoints' names).

tests/test_compat.py checks them on the installed release, and that no module outside
compat/ names them.
"""

from __future__ import annotations

from typing import Any

from otel_mindformers.compat import releases
from otel_mindformers.compat.lookup import ApiNotFound, find

COMPILE_CACHE = "compile_cache"
CHILDREN = "_cells"
_NEEDED_FOR = "grad_monitor's gradient-norm probe"


def compiled(cell: Any) -> bool:
    """True once `cell`'s graph was compiled (graph mode, or a `jit` construct)."""
    return bool(getattr(cell, COMPILE_CACHE, None))


def own_cells(cell: Any) -> dict[str, Any]:
    """`cell`'s direct child cells by attribute name ({} for anything else)."""
    children = getattr(cell, "__dict__", {}).get(CHILDREN)
    return children if isinstance(children, dict) else {}


def put_child(cell: Any, name: str, child: Any) -> None:
    """Make `child` `cell`'s child `name`, in place of the one there; its Parameters keep
    their names."""
    cell.insert_child_to_cell(name, child)


def check_cell_api() -> None:
    """ApiNotFound naming the release unless a fresh `nn.Cell` has each name this adapter uses."""
    find("mindspore.nn:Cell.insert_child_to_cell", package=releases.MINDSPORE, needed_for=_NEEDED_FOR)
    find(f"mindspore.nn:Cell.{COMPILE_CACHE}", package=releases.MINDSPORE, needed_for=_NEEDED_FOR)
    from mindspore import nn

    if not isinstance(getattr(nn.Cell(), "__dict__", {}).get(CHILDREN), dict):
        raise ApiNotFound(
            f"{releases.release(releases.MINDSPORE)}: mindspore.nn:Cell keeps no `{CHILDREN}` dict of its "
            f"child cells; {_NEEDED_FOR} needs it (tested: {releases.LABELS[releases.MINDSPORE]} "
            f"{releases.tested_range(releases.MINDSPORE)})"
        )


__all__ = ["CHILDREN", "COMPILE_CACHE", "check_cell_api", "compiled", "own_cells", "put_child"]
