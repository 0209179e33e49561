"""Parsing a section mapping into its dataclass, driven by the fields' type hints: the obvious
widenings, `${VAR}` expansion, secrets stripped and hidden, and every problem named by its key."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from otel_mindformers.config.errors import ConfigError, suggestion
from otel_mindformers.config.limits import MAX_INTEGER


def keys_of(config: Any) -> dict[str, Any]:
    """The config as the mapping of YAML keys it stands for."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in type(config).INTERNAL_FIELDS}


def switch_of(section: type) -> str | None:
    """The key that turns a section on and off (`enable`, or the section's `SWITCH`): a
    bool written in the section's place sets it (`logs: true` is `logs: {enable: true}`)."""
    declared = getattr(section, "SWITCH", None)
    if declared is not None:
        return declared
    return "enable" if any(f.name == "enable" for f in dataclasses.fields(section)) else None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check `value` against the annotation `tp`, allowing the obvious widenings."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        errors = []
        for option in typing.get_args(tp):
            if option is type(None):
                continue
            try:
                return _coerce(key, option, value)
            except ConfigError as exc:
                errors.append(exc)
        raise (
            errors[-1]
            if len(errors) == 1
            else ConfigError(
                f"{key}: expected {' or '.join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))}, "
                f"got {value!r}"
            )
        )
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            value = dataclasses.asdict(value)
        return parse_section(tp, value, key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]  # `output_type: stdout` means a list of one
        if isinstance(value, Mapping) and dataclasses.is_dataclass(item_tp):
            value = [value]  # `notifiers: {type: slack, url: ...}` too (and its URL stays unprinted)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        items, problems = [], []
        for i, item in enumerate(value):
            try:
                items.append(_coerce(f"{key}[{i}]", item_tp, item))
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(*problems)
        return items
    if origin is dict:
        if isinstance(value, str):  # OTEL_EXPORTER_OTLP_HEADERS style "k=v,k2=v2"
            value = _parse_kv_list(key, value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        _, value_tp = typing.get_args(tp)
        return {str(k): _coerce(f"{key}.{k}", value_tp, v) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INTEGER:
                raise ConfigError(f"{key}: must be <= {MAX_INTEGER}, got {value!r}")
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(f"{key}: expected a finite number, got {value!r}") from None
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return _expand_variables(key, value)
        if isinstance(value, int) and not isinstance(value, bool) and key.rsplit(".", 1)[-1] in _NUMBERS_AS_TEXT:
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


# Keys whose value may be written as an unquoted number and is meant as text: a Slurm or
# Volcano job id pasted into the YAML as is. Elsewhere a number where text belongs is a
# mistake worth an error (a secret, a path).
_NUMBERS_AS_TEXT = frozenset({"job_id"})


def _expand_variables(key: str, value: str) -> str:
    """`${VAR}` → its value; an unset variable is an error, not a literal `${VAR}` sent on."""
    if "${" not in value:
        return value
    expanded = os.path.expandvars(value)
    missing = re.search(r"\$\{([^}]*)\}", expanded)
    if missing:
        raise ConfigError(f"{key}: environment variable {missing.group(1)!r} is not set")
    return expanded


def _parse_kv_list(key: str, text: str) -> dict[str, str]:
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"{key}: expected 'name=value' pairs, got an entry without '='")
        pairs[name.strip()] = val.strip()
    return pairs


def _strip_secret(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {k: _strip_secret(v) for k, v in value.items()}
    return value


def _hide_value(problem: str) -> str:
    """A secret never reaches a message: keep what was expected, drop what was given
    (every message that quotes a value ends in ", got <value>")."""
    head, sep, _ = problem.partition(", got ")
    return f"{head} (value not shown)" if sep else problem


def _section_holding(cls: type, hints: dict[str, Any], key: object) -> str | None:
    """The name of `cls`'s sub-section that has a key named `key`, else None."""
    for field in dataclasses.fields(cls):
        section = hints[field.name]
        if dataclasses.is_dataclass(section) and any(f.name == key for f in dataclasses.fields(section)):
            return field.name
    return None


def parse_section(cls: type, raw: Any, path: str):
    if raw is None:
        raw = {}
    switch = switch_of(cls)
    if isinstance(raw, bool) and switch is not None:
        raw = {switch: raw}  # `logs: true`, `loss_spike: false`, `monitor_config: false`
    if not isinstance(raw, Mapping):
        # The type only: a notifier written as a bare URL string must not be echoed.
        raise ConfigError(f"{path}: expected a mapping of keys, got a {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    alias_of = {a: f.name for f in fields.values() for a in f.metadata.get("aliases", ())}
    internal: frozenset[str] = getattr(cls, "INTERNAL_FIELDS", frozenset())
    known = [name for name in fields if name not in internal] + list(alias_of)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    native: dict[str, Any] = {}
    problems: list[str] = []
    for raw_key, value in raw.items():
        name = alias_of.get(raw_key, raw_key)
        key = f"{path}.{raw_key}"
        if raw_key in alias_of and name in raw:
            # `monitor_on` beside `enable` (or `step_interval` beside `interval`): ours
            # configures us, MindFormers' own configures its TrainingStateMonitor.
            native[raw_key] = value
            continue
        if name not in fields or name in internal:
            if raw_key in getattr(cls, "NATIVE_KEYS", ()):
                native[raw_key] = value
                continue
            home = _section_holding(cls, hints, raw_key)
            if home is not None:  # `stop_on_nonfinite` beside `interval`: a key one section down
                problems.append(f"{key}: unknown key here; it is a key of {path}.{home}: write it there")
            else:
                # MindFormers' own keys are valid here too: a misspelt `dump_path` is one of them.
                candidates = [*known, *getattr(cls, "NATIVE_KEYS", ())]
                problems.append(f"{key}: unknown key{suggestion(raw_key, candidates)}")
            continue
        field = fields[name]
        try:
            coerced = _coerce(key, hints[name], value)
            if field.metadata.get("secret"):
                coerced = _strip_secret(coerced)
            if field.metadata.get("path") and isinstance(coerced, str):
                coerced = os.path.expanduser(coerced)  # `~/runs/m.json`, not a folder named `~`
            check = field.metadata.get("check")
            if check is not None:
                check(key, coerced)
        except ConfigError as exc:
            hide = field.metadata.get("secret") or field.metadata.get("url")
            problems += [_hide_value(p) for p in exc.problems] if hide else exc.problems
            continue
        values[name] = coerced
    if problems:
        raise ConfigError(*problems)
    if native:
        values["mindformers_native"] = native
    return cls(**values)
