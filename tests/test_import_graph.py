"""The package's shape, read statically from its imports (docs/architecture.md draws it).

Layers from the bottom up; a module may import its own layer and the layers below, never one
above. Within the package there is no import cycle. `names` imports only `names`, and no
runtime module imports `analysis` (the offline readers). Module-level imports make the graph
(a cycle is only a problem where modules import each other as they load); the upward rule
also reads the imports inside functions, so a late import cannot hide a dependency that
runs the wrong way. Imports under `TYPE_CHECKING` count too: an annotation that names a module
above is a dependency that runs the wrong way, and a cycle through one is a cycle for the
type checker and the reader.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "otel_mindformers"
ROOT = "otel_mindformers"

# Bottom first. `version` imports nothing and is read by every layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("names", "version"),
    ("config",),
    # compat: the MindSpore / MindFormers APIs that are private or moved, one adapter each.
    ("core", "job", "compat"),
    ("telemetry",),
    # The features, each in one folder from its live part to its offline readers (`offline/`).
    (
        "outputs",
        "devices",
        "model_state",
        "timing",
        "restarts",
        "captures",
        "stragglers",
        "hangs",
        "nonfinite",
        "flight_recorder",
        "cluster",
    ),
    ("alerts",),
    ("runtime",),
    ("integration",),
    # Each feature's offline readers and command (`<feature>/offline/`), over the JSON-lines
    # reader (outputs/jsonl_reader.py) below them; `report`, `plot` and the page on top.
    (OFFLINE := "offline",),
    ("analysis",),
    ("cli", ""),  # the command line and the package's public API module
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(node: ast.AST, module_level_only: bool) -> set[str]:
    found: set[str] = set()
    nodes = _module_level(node.body) if module_level_only and isinstance(node, ast.Module) else list(ast.walk(node))
    for child in nodes:
        if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith(ROOT) and not child.level:
            found.add(child.module)
            found.update(f"{child.module}.{alias.name}" for alias in child.names)
        elif isinstance(child, ast.Import):
            found.update(a.name for a in child.names if a.name.startswith(ROOT))
    return found


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run as the module loads, `if` blocks (TYPE_CHECKING's) included."""
    found: list[ast.stmt] = []
    for statement in body:
        found.append(statement)
        if isinstance(statement, (ast.If, ast.Try)):
            for inner in (statement.body, statement.orelse, getattr(statement, "finalbody", [])):
                found.extend(_module_level(inner))
            for handler in getattr(statement, "handlers", []):
                found.extend(_module_level(handler.body))
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache  # the tree is parsed once per session; the graph is only read
def import_graph(module_level_only: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {t for t in _imports(tree, module_level_only) if t in modules}
        # Importing a submodule runs its packages' __init__ first, except the importer's own
        # packages, which are already running.
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target in list(targets):
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in modules)
        graph[name] = targets - {name} - own
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def layer_of(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else ""
    if OFFLINE in module.split(".")[2:]:
        top = OFFLINE
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{module}: in no layer of LAYERS; place its folder in the architecture")


def test_every_module_has_a_layer_and_the_root_holds_only_the_public_modules():
    for module in _modules():
        layer_of(module)
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "cli.py", "version.py"], loose


def test_no_import_cycle():
    graph = import_graph()
    for module in graph:
        assert module not in reachable(graph, module), f"{module} imports itself back"


def folder_of(module: str) -> str:
    """The folder a module is drawn in: its top folder, a feature's `offline/` apart from
    its live part (`restarts.offline`), a root module itself (`cli`)."""
    parts = module.split(".")[1:] or [""]
    if len(parts) > 2 and parts[1] == OFFLINE:
        return f"{parts[0]}.{OFFLINE}"
    return parts[0]


def test_no_folder_imports_another_that_imports_it_back():
    """Folder by folder, every import counted (inside functions and under TYPE_CHECKING too):
    no two folders depend on each other, however long the loop."""
    folders: dict[str, set[str]] = {}
    for module, targets in import_graph(module_level_only=False).items():
        edges = folders.setdefault(folder_of(module), set())
        edges.update(folder_of(target) for target in targets)
    for folder, edges in folders.items():
        edges.discard(folder)
    loops = sorted(folder for folder in folders if folder in reachable(folders, folder))
    assert not loops, f"folders in an import loop: {loops}"


def test_the_folder_check_sees_a_loop():
    assert folder_of(f"{ROOT}.restarts.offline.attempts_report") == "restarts.offline"
    assert folder_of(f"{ROOT}.restarts.run_attempt") == "restarts"
    assert folder_of(f"{ROOT}.cli") == "cli"
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert "a" in reachable(loop, "a") and "d" not in reachable(loop, "d")


def test_no_module_cycle_in_outputs_even_through_a_function_level_import():
    """outputs/ is tied in no loop at all: a late import that closes a circle (runs.py once
    imported jsonl.py inside a function, jsonl.py imported runs.py) is still one."""
    outputs = f"{ROOT}.outputs"
    graph = {
        module: {target for target in targets if target.startswith(outputs)}
        for module, targets in import_graph(module_level_only=False).items()
        if module.startswith(outputs)
    }
    for module in graph:
        assert module not in reachable(graph, module), f"{module} imports itself back"


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module level", "with function-level imports"])
def test_nothing_imports_upward(module_level_only):
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph(module_level_only).items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )
    assert not upward, "\n".join(upward)


def test_names_import_only_names():
    graph = import_graph(module_level_only=False)
    outside = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(f"{ROOT}.names")
        for target in targets
        if not target.startswith(f"{ROOT}.names")
    }
    assert not outside, sorted(outside)


def test_the_adapters_import_only_names_config_and_core():
    """compat/ sits beside core and job, and every layer above reaches MindSpore's and
    MindFormers' moving parts through it: it must not lean on anything but the bottom."""
    graph = import_graph(module_level_only=False)
    outside = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(f"{ROOT}.compat")
        for target in targets
        if target.split(".")[1] not in {"compat", "names", "config", "core"}
    }
    assert not outside, sorted(outside)


def test_no_runtime_module_imports_the_offline_analysis():
    graph = import_graph(module_level_only=False)
    runtime = [m for m in graph if layer_of(m) < layer_of(f"{ROOT}.analysis")]
    offenders = {f"{m} -> {t}" for m in runtime for t in graph[m] if t.startswith(f"{ROOT}.analysis")}
    assert not offenders, sorted(offenders)


def test_parsing_a_config_pulls_in_no_runtime():
    below = reachable(import_graph(), f"{ROOT}.config")
    assert {m.split(".")[1] for m in below} <= {"config", "names"}, sorted(below)


def test_the_run_sets_every_attribute_in_its_constructor():
    """MonitorRun's state is declared in `__init__`: the hot path reads `run.cadence` and
    `run.clock`, and a start that fails half-way closes what exists, so no attribute may
    appear later."""
    tree = ast.parse((PACKAGE / "runtime" / "run.py").read_text(encoding="utf-8"))
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "MonitorRun"]

    def assigned(function: ast.AST) -> set[str]:
        return {
            target.attr
            for node in ast.walk(function)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for target in ast.walk(target)
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
        }

    methods = [node for node in cls.body if isinstance(node, ast.FunctionDef)]
    in_init = assigned(next(m for m in methods if m.name == "__init__"))
    later = set().union(*(assigned(m) for m in methods if m.name != "__init__"))
    assert later <= in_init, sorted(later - in_init)


ARCHITECTURE = REPO / "docs" / "architecture.md"


def _module_map_rows() -> dict[str, str]:
    """docs/architecture.md's module map: a folder's row text, by folder ("" for the root)."""
    rows: dict[str, str] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| **`") and line.count("|") >= 3:
            folder = line.split("`")[1].rstrip("/")
            rows[folder] = line
        elif line.startswith("| `") and line.split("`")[1].endswith(".py"):
            rows.setdefault("", "")
            rows[""] += line
    return rows


def test_the_architecture_doc_maps_every_module_and_layer():
    """Each module is named in its folder's row of the module map (an `offline/` module as
    `offline/name.py`), each folder has a row, and the layers block names every folder."""
    rows = _module_map_rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and len(relative.parts) > 1:
            continue  # a folder's __init__ is its row
        folder = relative.parts[0] if len(relative.parts) > 1 else ""
        name = "/".join(relative.parts[1:]) if folder else relative.name
        if folder not in rows:
            missing.append(f"{folder}/: no row in the module map")
        elif f"`{name}`" not in rows[folder]:
            missing.append(f"{relative}: not named in the `{folder or 'root'}` row")
    text = ARCHITECTURE.read_text(encoding="utf-8")
    layers_block = text[text.index("## Layers") : text.index("Where a change goes")]
    folders = [top for layer in LAYERS for top in layer if top and (PACKAGE / top).is_dir()]
    missing += [f"{top}/: not in the layers block" for top in folders if f"{top}/" not in layers_block]
    assert not missing, "\n".join(missing)
