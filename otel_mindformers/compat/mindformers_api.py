"""MindFormers' internals this package patches or reads, each found where this release has it.

- the trainer's run (`BaseTrainer.training_process`), its config templates (`Config.apply`,
  the `MonitorConfig` section class) and its YAML reader (`MindFormerConfig._file2dict`),
  which the integration wraps (integration/mindformers_glue.py);
- the resume loads of `mindformers.trainer.base_trainer` (integration/checkpoint_load.py);
- the training-state monitor and MoE callbacks whose readings become series (model_state/);
- the attributes its callbacks hold the resumed step in (job/resume.py);
- its callback registry, from which a YAML's `callbacks:` entry is built (integration/patches.py).

Each finder raises `ApiNotFound` naming the installed MindFormers when the name has moved;
the caller turns its feature off with one message (`lookup.feature_off`).
"""

from __future__ import annotations

from typing import Any

from otel_mindformers.compat import releases
from otel_mindformers.compat.lookup import find

REGISTER = "mindformers.tools.register"
CONFIG = "mindformers.tools.register.config"
BASE_TRAINER = "mindformers.trainer.base_trainer"
TEMPLATE = "mindformers.tools.register.template"
CALLBACKS = "mindformers.core.callback.callback"
# The loads `BaseTrainer` calls through its module, looked up at call time; a release has
# those of its checkpoint formats (1.6 has no `load_checkpoint`: no new-format checkpoints).
RESUME_LOADS = ("transform_and_load_checkpoint", "load_checkpoint")
# MindFormers callbacks and the attribute holding the step they resumed from.
INITIAL_STEP_ATTRIBUTES = (
    ("CheckpointMonitor", "_append_step_num"),
    ("MFLossMonitor", "initial_step"),
    ("TrainingStateMonitor", "initial_step"),
)
# (class, method) of CALLBACKS wrapped for model-state readings, and the feature each feeds.
STATE_HOOKS = (
    ("TrainingStateMonitor", "_output", "MindFormers' training-state readings as series"),
    ("TopkBiasBalanceCallback", "_update_topk_bias", "the MoE expert-load series"),
    ("MoEDropRateCallback", "_callback_droprate", "the MoE drop-rate series"),
    ("MoEDropRateCallback", "on_train_step_end", "the MoE drop-rate series"),
)


def _find(path: str, needed_for: str) -> Any:
    return find(path, package=releases.MINDFORMERS, needed_for=needed_for)


def base_trainer() -> Any:
    """`BaseTrainer`, whose `training_process` runs one Trainer run."""
    _find(f"{BASE_TRAINER}:BaseTrainer.training_process", "one callback per Trainer run")
    return _find(f"{BASE_TRAINER}:BaseTrainer", "one callback per Trainer run")


def config_template() -> Any:
    """`Config`, the base of the YAML section classes, whose `apply` fills a section's defaults."""
    _find(f"{TEMPLATE}:Config.apply", "the article's keys in a MindFormers monitor_config")
    return _find(f"{TEMPLATE}:Config", "the article's keys in a MindFormers monitor_config")


def config_file_reader() -> Any:
    """`MindFormerConfig`, whose static `_file2dict(filename)` reads a YAML file (and its bases)."""
    needed_for = "a custom monitor beside a MindFormers YAML"
    _find(f"{CONFIG}:MindFormerConfig._file2dict", needed_for)
    return _find(f"{CONFIG}:MindFormerConfig", needed_for)


def monitor_section() -> Any:
    """MindFormers' `monitor_config` section class."""
    return _find(f"{TEMPLATE}:MonitorConfig", "the article's keys in a MindFormers monitor_config")


def resume_loads() -> tuple[Any, list[str]]:
    """The `base_trainer` module and the RESUME_LOADS names this release has."""
    module = _find(BASE_TRAINER, "checkpoint.load phases of a Trainer resume")
    return module, [name for name in RESUME_LOADS if name in vars(module)]


def state_hook(class_name: str, method: str, needed_for: str) -> Any:
    """The class of CALLBACKS that defines `method` (raises ApiNotFound if either is gone)."""
    _find(f"{CALLBACKS}:{class_name}.{method}", needed_for)
    return _find(f"{CALLBACKS}:{class_name}", needed_for)


def callback_registry() -> tuple[Any, Any]:
    """`MindFormerRegister` and its callback module type (`register_cls`, `is_exist` are public)."""
    needed_for = "`callbacks: - type: MonitorCallback` in a MindFormers YAML"
    return _find(f"{REGISTER}:MindFormerRegister", needed_for), _find(
        f"{REGISTER}:MindFormerModuleType.CALLBACK", needed_for
    )


def forget_callback(name: str) -> None:
    """Take a callback class out of the registry: MindFormers has no public call for it, so
    its two private tables (the classes and the search names) are edited."""
    register, kind = callback_registry()
    register.registry[kind].pop(name, None)
    register.search_names_map.pop((kind, name), None)
