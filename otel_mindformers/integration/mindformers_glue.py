"""MindFormers integration: what the patches do. The instrumentor (instrumentor.py) applies
them, holds their state and undoes them; this module keeps no state of its own.

These places in MindFormers are patched, each restored by `Patches.undo()`:

- `Config.apply` in `mindformers.tools.register.template`, where MindFormers validates the
  YAML's `monitor_config` (its `MonitorConfig` section) and rejects unknown keys. The
  article's keys (every key of our `MonitorConfig`) are validated by us, with a
  `ConfigError` naming the key, and kept in the section; MindFormers' native keys still go
  through MindFormers, so its own `TrainingStateMonitor` sees them as before.
- `MindFormerConfig._file2dict` in `mindformers.tools.register.config`, which reads a YAML:
  a `monitor_config` that names a `custom_monitor_callback` gets the file's folder
  (`YAML_FOLDER_KEY`), where the monitor's module is looked for, as beside any YAML we load.
- MindFormers' callback registry: `callbacks: - type: MonitorCallback` builds ours.
- `BaseTrainer.training_process`, where MindFormers builds the callback list: a run gets
  exactly one MonitorCallback — the user's instance, else the YAML's entry (given the YAML's
  `monitor_config` when it names no config), else one built from `monitor_config` when it
  says `enable: true` (or, under the instrumentor, unless it says `enable: false`).
- `TrainingStateMonitor._output` and the MoE callbacks' outputs: their readings are also
  handed to the run (model_state/mindformers_hooks.py).
- `transform_and_load_checkpoint` and `load_checkpoint` in `mindformers.trainer.base_trainer`:
  each load is a `checkpoint.load` phase (checkpoint_load.py).

Our `enable` / `interval` accept MindFormers' `monitor_on` / `step_interval` as aliases; when
both spellings are written, the monitor_config article's configures us and the native one MindFormers.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from otel_mindformers.compat import mindformers_api
from otel_mindformers.compat.lookup import ApiNotFound, feature_off
from otel_mindformers.config import MonitorConfig, load_monitor_config, parse_monitor_config
from otel_mindformers.config.loading import YAML_FOLDER_KEY
from otel_mindformers.integration.patches import Patches
from otel_mindformers.job.layout import record_mindformers_run

# The names a YAML `callbacks:` entry may use for our callback.
CALLBACK_NAMES = ("MonitorCallback", "OtelCallback")

# Every key of our section; a MindFormers YAML may use any of them inside `monitor_config`
# (and the YAML's folder is kept there beside them).
OWN_KEYS = frozenset(f.name for f in dataclasses.fields(MonitorConfig)) | {YAML_FOLDER_KEY}
# MindFormers' spelling → ours (`monitor_on` → `enable`, `step_interval` → `interval`).
NATIVE_ALIASES = {alias: f.name for f in dataclasses.fields(MonitorConfig) for alias in f.metadata.get("aliases", ())}


# True while a MindFormers Trainer runs (the instrumentor's Trainer wrapper sets it): the
# Trainer has decided on its MonitorCallback, and its run config describes the run.
TRAINER_RUNNING: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_mindformers_trainer", default=False)


def inside_trainer() -> bool:
    return TRAINER_RUNNING.get()


@dataclass(frozen=True)
class ZeroCode:
    """What the instrumentor asks of every run (see instrumentor.py).

    `config`: the operator's configuration (OTEL_PYTHON_MINDFORMERS_CONFIG or
    `instrument(config=...)`); None lets a MindFormers YAML's `monitor_config` decide, else
    the defaults. `providers`: tracer/meter/logger providers passed to `instrument()`.
    """

    config: MonitorConfig | None = None
    providers: Mapping[str, Any] = field(default_factory=dict)

    def callback_kwargs(self) -> dict[str, Any]:
        """MonitorCallback's provider arguments (unset ones left to its own resolution)."""
        return {name: provider for name, provider in self.providers.items() if provider is not None}


def patch_mindformers(training_process: Callable) -> Patches:
    """Config.apply, the callback registry, and `BaseTrainer.training_process` wrapped by
    `training_process` (a wrapt wrapper; see `TrainerRun`). A release that moved one of them
    turns that part off with one warning naming the release (compat/mindformers_api.py)."""
    patches = Patches()
    try:
        patches.wrap(mindformers_api.config_template(), "apply", _apply_config)
    except ApiNotFound as exc:
        feature_off("the article's keys in a MindFormers monitor_config", exc)
    try:
        patches.wrap(mindformers_api.config_file_reader(), "_file2dict", _note_yaml_folder)
    except ApiNotFound as exc:
        feature_off("a custom monitor beside a MindFormers YAML", exc)
    try:
        patches.wrap(mindformers_api.base_trainer(), "training_process", training_process)
    except ApiNotFound as exc:
        feature_off("one MonitorCallback per MindFormers Trainer run", exc)
    try:
        patches.register_callbacks()
    except ApiNotFound as exc:
        feature_off("`callbacks: - type: MonitorCallback` in a MindFormers YAML", exc)
    # MindFormers' state monitor and MoE callbacks hand their readings to the run (model_state/).
    from otel_mindformers.model_state import mindformers_hooks

    mindformers_hooks.install(patches.wrap)
    # Its resume loads are `checkpoint.load` phases.
    from otel_mindformers.integration import checkpoint_load

    checkpoint_load.wrap_mindformers(patches.wrap)
    return patches


# --- the section ----------------------------------------------------------------------------


def monitor_section(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """A MindFormers `monitor_config` as our parser reads it: where both spellings of a key
    are written, the monitor_config article's configures us and MindFormers keeps the native one."""
    ours = dict(section or {})
    for native, article in NATIVE_ALIASES.items():
        if article in ours:
            ours.pop(native, None)
    return ours


def _note_yaml_folder(wrapped: Callable, _cls: Any, args: tuple, kwargs: dict) -> Any:
    """Wraps `MindFormerConfig._file2dict(filename)` → the file as a dict: a `monitor_config`
    that names a custom monitor also holds the file's folder, where its module may live."""
    loaded = wrapped(*args, **kwargs)
    section = loaded.get("monitor_config") if isinstance(loaded, Mapping) else None
    filename = args[0] if args else kwargs.get("filename")
    if isinstance(section, MutableMapping) and section.get("custom_monitor_callback") and isinstance(filename, str):
        section[YAML_FOLDER_KEY] = os.path.dirname(os.path.realpath(filename))
    return loaded


def _apply_config(wrapped: Callable, cls: Any, args: tuple, kwargs: dict) -> Any:
    """Wraps MindFormers' `Config.apply(section)` → the section with defaults filled.

    The base class is wrapped because MindFormers takes every attribute of its section class
    (`MonitorConfig.__dict__`) as a key: a wrapper set there would become one."""
    if cls is not mindformers_api.monitor_section():
        return wrapped(*args, **kwargs)
    section = args[0] if args else kwargs.get("config")
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        return wrapped(*args, **kwargs)  # MindFormers reports its own type error
    parse_monitor_config(monitor_section(section))
    native = {k: v for k, v in section.items() if k not in OWN_KEYS}
    # A section holding only our keys is not empty: spare MindFormers' "config is empty" warning.
    result = wrapped(native or {"monitor_on": False})
    # MindFormers fills in a default for each native key. Two of them double as our `enable`
    # and `interval`, and a default nobody wrote must not configure us: it is left out.
    # MindFormers tests `monitor_on` only for truth (absent reads as None) and reads
    # `step_interval` only when `monitor_on` is on, so that default stays then.
    if "monitor_on" not in section:
        result.pop("monitor_on", None)
    if "step_interval" not in section and not result.get("monitor_on"):
        result.pop("step_interval", None)
    result.update({k: v for k, v in section.items() if k in OWN_KEYS})
    return result


# --- the Trainer ----------------------------------------------------------------------------


def _run_monitor_config(
    run_config: Mapping[str, Any], *, listed: bool, zero_code: ZeroCode | None
) -> MonitorConfig | None:
    """The configuration of this run's MonitorCallback; None: the run gets none.

    `listed`: the YAML's `callbacks:` names ours, so it is wanted whatever `enable` says
    (a disabled callback does nothing)."""
    section = monitor_section(run_config.get("monitor_config"))
    if zero_code is not None and zero_code.config is not None:
        config = zero_code.config
    elif listed or zero_code is not None or section.get("enable"):
        # after a plain `import otel_mindformers` only `enable: true` asks for monitoring
        config = load_monitor_config(section)
    else:
        return None
    if not (listed or config.enable):
        return None
    return config


def callback_list(callbacks: Any) -> list:
    """MindSpore's `callbacks=` argument (None, one Callback or a list) as a new list."""
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


def with_one_monitor(bound: inspect.BoundArguments, zero_code: ZeroCode | None) -> None:
    """Give the Trainer run in `bound` (`training_process`'s arguments) its one MonitorCallback."""
    from otel_mindformers.runtime.callback import MonitorCallback

    run_config = bound.arguments.get("config")
    if not isinstance(run_config, MutableMapping):
        return
    record_mindformers_run(run_config)  # the job's parallel layout, for the run's resource
    providers = zero_code.callback_kwargs() if zero_code is not None else {}
    callbacks = callback_list(bound.arguments.get("callbacks"))
    entries = [
        e
        for e in run_config.get("callbacks") or []
        if isinstance(e, MutableMapping) and e.get("type") in CALLBACK_NAMES
    ]
    mine = any(isinstance(cb, MonitorCallback) for cb in callbacks)
    if entries and (mine or len(entries) > 1):
        # One callback per run: the user's instance wins over YAML entries, the first entry over the rest.
        drop = entries if mine else entries[1:]
        run_config["callbacks"] = [e for e in run_config["callbacks"] if not any(e is d for d in drop)]
        entries = [] if mine else entries[:1]
    if entries:
        entry = entries[0]
        if "config" not in entry:
            entry["config"] = _run_monitor_config(run_config, listed=True, zero_code=zero_code)
        for name, provider in providers.items():
            entry.setdefault(name, provider)
    elif not mine:
        config = _run_monitor_config(run_config, listed=False, zero_code=zero_code)
        if config is not None:
            bound.arguments["callbacks"] = callbacks + [MonitorCallback(config, **providers)]
