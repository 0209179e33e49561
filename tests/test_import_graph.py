"""The package's module-level import graph: config.py sits at the bottom.

Parsing a `monitor_config` must not pull in the runtime (MindSpore, exporters, threads), and
no module that config.py imports may import config.py back: such a cycle once ran
config → monitor → alerts → config. Read statically from the sources (imports inside
functions and under TYPE_CHECKING are deliberate late imports and are left out).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "otel_mindformers"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:  # module level only
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otel_mindformers"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("otel_mindformers"))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = {t for t in _top_level_imports(path) if t in modules}
        # Importing a submodule runs its packages' __init__ first.
        for target in list(targets):
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in modules)
        graph[name] = targets - {name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_nothing_config_imports_imports_config_back():
    graph = import_graph()
    below = reachable(graph, "otel_mindformers.config")
    assert "otel_mindformers.config" not in below, sorted(below)
    assert not {m for m in below if m.startswith(("otel_mindformers.alerts", "otel_mindformers.telemetry"))}


def test_the_training_metric_table_depends_on_nothing_but_metric_specs():
    graph = import_graph()
    assert reachable(graph, "otel_mindformers.training_metrics") <= {
        "otel_mindformers.metric_spec", "otel_mindformers.model_state", "otel_mindformers.model_state.specs",
    }
