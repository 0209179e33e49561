"""The hardened YAML reader: a safe loader, bounded size, nesting and alias expansion, and no key
given twice in one mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from otel_mindformers.config.errors import ConfigError
from otel_mindformers.config.limits import MAX_CONFIG_BYTES, MAX_NESTING, MAX_YAML_NODES

# libyaml when it is there: the pure-Python parser takes minutes over a file of megabytes.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    """The document in `path`, read within the bounds above, with no duplicate key."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not read as a configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: not UTF-8 (byte {exc.start})") from None
    return parse_yaml(path, text)


def parse_yaml(path: Path, text: str) -> Any:
    """The document in `text` (read from `path`, named in errors), within the node, nesting and
    duplicate-key bounds above; a syntax error names its line and column, never quotes the line."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_graph(path, node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        # The problem and its position only: the parser's excerpt of the line could show a secret.
        where = getattr(exc, "problem_mark", None)
        position = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML{position}: {problem}") from None
    finally:
        loader.dispose()


def _check_node_graph(path: Path, root: yaml.Node) -> None:
    """Before anything is built from the document: no nesting past MAX_NESTING, no more than
    MAX_YAML_NODES values once aliases are expanded (an "alias bomb" of a few lines stands
    for billions), and no key given twice in one mapping (PyYAML keeps the last silently)."""
    expanded: dict[int, int] = {}  # node id → its size with aliases expanded
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"{path}: nested more than {MAX_NESTING} levels deep at line {node.start_mark.line + 1}")
        children = _children(node)
        if children_done:
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in children)
            if expanded[id(node)] > MAX_YAML_NODES:
                raise ConfigError(
                    f"{path}: more than {MAX_YAML_NODES} values once its aliases are expanded "
                    f"(line {node.start_mark.line + 1}); not read as a configuration"
                )
            continue
        if id(node) in expanded:
            continue  # an alias of a node already measured
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(path, node)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children if id(child) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _refuse_duplicate_keys(path: Path, node: yaml.MappingNode) -> None:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            raise ConfigError(
                f"{path}: line {line}: key {key_node.value!r} given twice in one mapping "
                f"(first at line {seen[key_node.value]}); remove one"
            )
        seen[key_node.value] = line
