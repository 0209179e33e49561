"""`load_monitor_config` / `parse_monitor_config`: a YAML path, a mapping, a MindFormers config or
a `MonitorConfig` in, a validated `MonitorConfig` out. Nothing is created or imported.

Output folders are created at run start (`outputs.paths.prepare_output_paths`), the custom
monitor class imported then too (`runtime.custom_monitors.load_monitor_class`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_mindformers.config.coercion import parse_section
from otel_mindformers.config.errors import ConfigError
from otel_mindformers.config.limits import MAX_NESTING, MAX_YAML_NODES
from otel_mindformers.config.schema import MonitorConfig
from otel_mindformers.config.yaml_loader import read_yaml

# The folder of the MindFormers YAML a section was loaded from (MindFormers' config keeps no
# file name): the integration writes it into the section it loads, so that a custom monitor
# beside the YAML is found, as `load_monitor_config(path)` finds it.
YAML_FOLDER_KEY = "otel_mindformers_yaml_folder"


def parse_monitor_config(section: Mapping[str, Any] | None, source_dir: str | None = None) -> MonitorConfig:
    """Validate a `monitor_config` mapping (already extracted from its YAML file)."""
    if isinstance(section, Mapping) and YAML_FOLDER_KEY in section:
        section = dict(section)
        folder = section.pop(YAML_FOLDER_KEY)
        if source_dir is None and isinstance(folder, str):
            source_dir = folder
    config = parse_section(MonitorConfig, _plain(section, "monitor_config"), "monitor_config")
    config.source_dir = source_dir
    return config


def _own_keys() -> frozenset[str]:
    fields = dataclasses.fields(MonitorConfig)
    return frozenset(f.name for f in fields if f.name not in MonitorConfig.INTERNAL_FIELDS) | frozenset(
        alias for f in fields for alias in f.metadata.get("aliases", ())
    )


def _section_from_yaml(path: Path) -> Mapping[str, Any] | None:
    document = read_yaml(path)
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(document).__name__}")
    if "monitor_config" in document:
        return document["monitor_config"]
    if document and not _own_keys() & {k for k in document if isinstance(k, str)}:
        # A training YAML without the section, not a section with only unknown keys.
        top = ", ".join(sorted(str(k) for k in document)[:8])
        raise ConfigError(f"{path}: no monitor_config section (its top-level keys: {top})")
    return document  # the file is the section itself


def load_monitor_config(source: Any = None, *, source_dir: str | None = None) -> MonitorConfig:
    """Load and validate a monitor configuration; nothing is created or imported.

    `source` may be a YAML path (a file with a top-level `monitor_config:` section, or a file
    that is the section itself), a mapping, a MindFormers `MindFormerConfig` (or its
    `monitor_config` entry), an existing `MonitorConfig` (re-validated), or None for defaults.
    `source_dir` is where a custom monitor module may live (default: the YAML file's folder).
    Raises `ConfigError` listing every problem, each naming its key.
    """
    if source is None:
        config = MonitorConfig()
    elif isinstance(source, MonitorConfig):
        config = source.validate()
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        config = parse_monitor_config(_section_from_yaml(path), source_dir=str(path.resolve().parent))
    elif isinstance(source, Mapping):
        section = source.get("monitor_config", source) if "monitor_config" in source else source
        config = parse_monitor_config(section)
    else:
        raise ConfigError(
            f"monitor_config: expected a YAML path, a mapping or a MonitorConfig, got {type(source).__name__}"
        )
    if source_dir is not None:
        config.source_dir = source_dir
    return config


def _plain(value: Any, path: str) -> Any:
    """Plain dicts and lists of `value` (MindFormerConfig is a dict subclass with attribute
    access), within the bounds a YAML file has: shared objects (what a YAML alias becomes)
    are counted each time they are reached, so an alias bomb stops here too."""
    budget = [MAX_YAML_NODES]

    def copy(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError(f"{path}: more than {MAX_YAML_NODES} values (counting repeated references)")
        if depth > MAX_NESTING:
            raise ConfigError(f"{path}: nested more than {MAX_NESTING} levels deep")
        if isinstance(item, Mapping):
            return {k: copy(v, depth + 1) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [copy(v, depth + 1) for v in item]
        return item

    return copy(value, 1)
