"""Optional packages: which extra of `otel-mindformers` installs each, and who needs it.

Kept equal to `[project.optional-dependencies]` in pyproject.toml (a test compares them).
`validate` names the extra a configuration needs; at run time an output whose package is
missing is turned off with one warning naming the same `pip install` line.
"""

from __future__ import annotations

import importlib.util

from otel_mindformers.config import MonitorConfig

# Top-level module → (distribution, extra that installs it).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "tensorboardX": ("tensorboardX", "tensorboard"),
    "opentelemetry.exporter.prometheus": ("opentelemetry-exporter-prometheus", "prometheus"),
    "prometheus_client": ("prometheus-client", "prometheus"),
    "psutil": ("psutil", "devices"),
    "pynvml": ("nvidia-ml-py", "devices"),
    "matplotlib": ("matplotlib", "analysis"),
}


def install_hint(module: str) -> str:
    """`pip install 'otel-mindformers[extra]'` for a module of an extra; else for the module."""
    top = next((name for name in EXTRA_OF_MODULE if module == name or module.startswith(name + ".")), None)
    if top is None:
        return f"pip install {module.split('.')[0]}"
    return f"pip install 'otel-mindformers[{EXTRA_OF_MODULE[top][1]}]'"


def is_installed(module: str) -> bool:
    """Importable, without importing it (a module set to None in sys.modules is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package; a None entry in sys.modules
        return False


def output_off_warning(output: str, modules: tuple[str, ...]) -> str | None:
    """The one warning that turns `output` off when one of its `modules` is missing; None
    when all are installed."""
    missing = next((module for module in modules if not is_installed(module)), None)
    if missing is None:
        return None
    return (
        f"otel_mindformers: the {output} output (monitor_config.output_type) is off: "
        f"{missing} is not installed; {install_hint(missing)}"
    )


def _needed_modules(config: MonitorConfig) -> list[tuple[str, str]]:
    """(key, module) of every optional module an enabled part of `config` imports."""
    needed = []
    if "tensorboard" in config.output_type:
        needed.append(("monitor_config.output_type: tensorboard", "tensorboardX"))
    if "prometheus" in config.output_type:
        needed += [
            ("monitor_config.output_type: prometheus", "opentelemetry.exporter.prometheus"),
            ("monitor_config.output_type: prometheus", "prometheus_client"),
        ]
    if config.device_monitor:
        sources = set(config.device_config.sources)
        if sources & {"auto", "host"}:
            needed.append(("monitor_config.device_monitor", "psutil"))
        if "nvidia" in sources:
            needed.append(("monitor_config.device_config.sources: nvidia", "pynvml"))
    return needed


def missing_extras(config: MonitorConfig) -> list[str]:
    """One line per enabled part of `config` whose package is not installed."""
    if not config.enable:
        return []
    return [
        f"{key} needs {module}, which is not installed: {install_hint(module)}"
        for key, module in _needed_modules(config)
        if not is_installed(module)
    ]
