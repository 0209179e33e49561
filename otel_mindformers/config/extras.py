"""Optional packages: which extra of `otel-mindformers` installs each, and who needs it.

Kept equal to `[project.optional-dependencies]` in pyproject.toml (a test compares them).
`validate` names the extra a configuration needs; at run time an output whose package is
missing, or installed but failing on import, is turned off with one warning naming the
package, the error and the same `pip install` line.

Every import of an optional package goes through `import_optional`: an installed package
can fail on import with anything (its own `ImportError`, protobuf's `TypeError:
Descriptors cannot be created directly`, a `RuntimeError` from a compiled part), and none
of that may reach training.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Iterable
from types import ModuleType

from otel_mindformers.config import MonitorConfig

# Top-level module → (distribution, extra that installs it).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "tensorboardX": ("tensorboardX", "tensorboard"),
    "opentelemetry.exporter.prometheus": ("opentelemetry-exporter-prometheus", "prometheus"),
    "prometheus_client": ("prometheus-client", "prometheus"),
    "psutil": ("psutil", "devices"),
    "pynvml": ("nvidia-ml-py", "devices"),
    "matplotlib": ("matplotlib", "analysis"),
    # OTEL_CONFIG_FILE: OTel's declarative configuration (telemetry/config_file.py).
    "opentelemetry.configuration": ("opentelemetry-configuration", "file-configuration"),
}


# What the TensorBoard output imports (the package, and the protobuf modules a protobuf mismatch breaks):
# each must import before the output is turned on.
TENSORBOARD_MODULES = (
    "tensorboardX",
    "tensorboardX.event_file_writer",
    "tensorboardX.proto.event_pb2",
    "tensorboardX.proto.summary_pb2",
)


PROMETHEUS_MODULES = ("prometheus_client", "opentelemetry.exporter.prometheus")  # the one the other imports first

# What the drawing commands import (`plot`, `plot --attempts`, `capture --plot`).
MATPLOTLIB_MODULES = ("matplotlib", "matplotlib.figure")


def install_hint(module: str) -> str:
    """`pip install 'otel-mindformers[extra]'` for a module of an extra; else for the module."""
    top = next((name for name in EXTRA_OF_MODULE if module == name or module.startswith(name + ".")), None)
    if top is None:
        return f"pip install {module.split('.')[0]}"
    return f"pip install 'otel-mindformers[{EXTRA_OF_MODULE[top][1]}]'"


_IMPORTED: dict[str, tuple[ModuleType | None, str | None]] = {}
_IMPORT_LOCK = threading.Lock()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def import_optional(module: str) -> tuple[ModuleType | None, str | None]:
    """(the module, None), or (None, why not): "is not installed" or "fails on import
    (TypeError: ...)", to follow the module's name. Any exception of the import is caught;
    the answer is kept, so a broken package is imported (and reported) once per process."""
    with _IMPORT_LOCK:
        if module not in _IMPORTED:
            if not is_installed(module):
                _IMPORTED[module] = (None, "is not installed")
            else:
                try:
                    _IMPORTED[module] = (importlib.import_module(module), None)
                # Whatever an installed package raises on import, sys.exit() included (a
                # package that exits when its own dependency is wrong); not Ctrl-C.
                except (Exception, SystemExit) as exc:
                    _IMPORTED[module] = (None, f"fails on import ({_first_line(exc)})")
        return _IMPORTED[module]


def is_installed(module: str) -> bool:
    """Importable, without importing it (a module set to None in sys.modules is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package; a None entry in sys.modules
        return False


def first_problem(modules: Iterable[str]) -> tuple[str, str] | None:
    """The first of `modules` that is missing or fails on import, and why (import_optional's
    words); None when all import."""
    for module in modules:
        _, problem = import_optional(module)
        if problem is not None:
            return module, problem
    return None


def output_off_warning(output: str, modules: tuple[str, ...]) -> str | None:
    """The one warning that turns `output` off when one of its `modules` is missing or fails
    on import; None when all import."""
    found = first_problem(modules)
    if found is None:
        return None
    module, problem = found
    return (
        f"otel_mindformers: the {output} output (monitor_config.output_type) is off: "
        f"{module} {problem}; {install_hint(module)}"
    )


def _needed_modules(config: MonitorConfig) -> list[tuple[str, str]]:
    """(key, module) of every optional module an enabled part of `config` imports."""
    needed = []
    if "tensorboard" in config.output_type:
        needed += [("monitor_config.output_type: tensorboard", module) for module in TENSORBOARD_MODULES]
    if "prometheus" in config.output_type:
        needed += [("monitor_config.output_type: prometheus", module) for module in PROMETHEUS_MODULES]
    if config.device_monitor:
        sources = set(config.device_config.sources)
        if sources & {"auto", "host"}:
            needed.append(("monitor_config.device_monitor", "psutil"))
        if "nvidia" in sources:
            needed.append(("monitor_config.device_config.sources: nvidia", "pynvml"))
    return needed


def needs_line(who: str, module: str, problem: str) -> str:
    """ "`who` needs `module`, which `problem`: pip install ...", the one line of `validate`
    and the CLI for a package that is missing or broken."""
    return f"{who} needs {module}, which {problem}: {install_hint(module)}"


def missing_package(who: str, modules: Iterable[str]) -> str | None:
    """`needs_line` for the first of `modules` that is missing or fails on import; None when
    all import."""
    found = first_problem(modules)
    return None if found is None else needs_line(who, *found)


def missing_extras(config: MonitorConfig) -> list[str]:
    """One line per enabled part of `config` whose package is not installed or fails on
    import (`validate` imports them: a broken package is found before training)."""
    if not config.enable:
        return []
    problems: dict[str, str] = {}
    for key, module in _needed_modules(config):
        if key in problems:
            continue  # one line per part: the modules after the first that fails fail with it
        problem = missing_package(key, (module,))
        if problem is not None:
            problems[key] = problem
    return list(problems.values())
