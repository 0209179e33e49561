"""`BaseMonitor`: the custom-monitor API of the monitor_config article, and loading one by dotted path.

Hooks (all optional, all called on the training thread, in this order):
- `on_train_begin(run_context)` — once, after the monitor pipeline is up;
- `on_train_step_end(run_context)` — after EVERY step (your code decides its own cadence;
  reading a tensor with `.asnumpy()` synchronises the device, so do it sparingly);
- `on_train_epoch_end(run_context)` — after every epoch;
- `on_train_end(run_context)` — once, before the pipeline flushes.

`run_context.original_args()` is MindSpore's cb_params: `cur_step_num`, `cur_epoch_num`,
`net_outputs`, `batch_num`, `epoch_num`, ... plus, as the monitor_config article's example reads them,
`train_loss` (the step's loss tensor) and `learning_rate` (the learning rate the step used).
Nothing is read back unless you call `.asnumpy()`; where the optimizer computes the rate
from a schedule, `learning_rate` is a lazy handle that evaluates the schedule only when read
(`.asnumpy()`, `float()`, `numpy.asarray()` or any Tensor attribute).

A hook that raises does not stop training: the first failure of each hook is logged as one
warning (with the exception), later ones are counted and the count is logged at train end;
the monitor's later hooks still run.

`self.raise_alert(rule, message, ...)` reports an anomaly through the same alert engine as
the built-in rules (rate limit, notifiers, span event, log record, counter).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_mindformers.config import ConfigError, MonitorConfig
from otel_mindformers.core.guarded_log import get_logger

if TYPE_CHECKING:
    from otel_mindformers.alerts import AlertEngine

CUSTOM_MONITOR_KEY = "monitor_config.custom_monitor_callback"
# The monitor_config article's custom monitor imports its base class from here; MindFormers
# has no such module, so that import is the one line the article's file needs changed.
_ARTICLE_BASE_MODULE = "mindformers.monitor"

_logger = get_logger(__name__)


class BaseMonitor:
    """Subclass and override the hooks you need; `self.monitor_config` is the MonitorConfig."""

    # Set by MonitorCallback at train begin; None while alerts are off.
    alert_engine: AlertEngine | None = None

    def __init__(self, monitor_config: MonitorConfig) -> None:
        self.monitor_config = monitor_config

    def raise_alert(
        self,
        rule: str,
        message: str,
        *,
        value: float | None = None,
        threshold: float | None = None,
        severity: str = "warning",
    ) -> None:
        """Alert at the last finished step under the name `rule` ("warning" or "critical").

        Rate-limited per rule by `alert_config.alert_interval`; a no-op when alerts are off.
        """
        if self.alert_engine is not None:
            self.alert_engine.raise_alert(rule, message, value=value, threshold=threshold, severity=severity)

    def on_train_begin(self, run_context: Any) -> None:
        pass

    def on_train_step_end(self, run_context: Any) -> None:
        pass

    def on_train_epoch_end(self, run_context: Any) -> None:
        pass

    def on_train_end(self, run_context: Any) -> None:
        pass


@contextmanager
def _importable(*directories: str | None) -> Iterator[None]:
    """The working directory and the config file's directory are importable while loading."""
    added = [str(Path(d).resolve()) for d in directories if d and str(Path(d).resolve()) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for directory in added:
            sys.path.remove(directory)


def load_monitor_class(config: MonitorConfig) -> type[BaseMonitor] | None:
    """Import the class named by `custom_monitor_callback` (at run start, or by `validate`);
    ConfigError if it cannot be imported or is not a BaseMonitor subclass."""
    dotted = config.custom_monitor_callback
    if not dotted:
        return None
    module_name, _, class_name = dotted.rpartition(".")
    with _importable(".", config.source_dir):
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any import-time failure is the config's problem to report
            fix = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == _ARTICLE_BASE_MODULE:
                fix = "; write `from otel_mindformers import BaseMonitor` there (docs/custom_monitors.md)"
            raise ConfigError(
                f"{CUSTOM_MONITOR_KEY}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}){fix}"
            ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{CUSTOM_MONITOR_KEY}: module {module_name!r} has no class {class_name!r}")
    if not issubclass(cls, BaseMonitor):
        # MonitorCallback builds it as cls(config), sets its alert engine and calls its
        # hooks: a class that is not a BaseMonitor fails at run time, so it is refused here.
        raise ConfigError(f"{CUSTOM_MONITOR_KEY}: {dotted!r} is not a subclass of otel_mindformers.BaseMonitor")
    return cls


class MonitorCalls:
    """The run's custom monitors, isolated: one that raises is reported once per hook (with
    the count at the run's end) and training goes on; its later calls still run. Both doors
    (the callback, the run API) call their hooks through it."""

    def __init__(self, monitors: list[BaseMonitor]) -> None:
        self.monitors = monitors
        self._failures: dict[str, int] = {}

    def call(self, hook: str, run_context: Any) -> None:
        for monitor in self.monitors:
            try:
                getattr(monitor, hook)(run_context)
            except Exception as exc:
                key = f"{type(monitor).__name__}.{hook}"
                count = self._failures[key] = self._failures.get(key, 0) + 1
                if count == 1:
                    _logger.warning(
                        "otel_mindformers: custom monitor %s raised %s: %s; training continues "
                        "(further failures of this hook are counted, not logged)",
                        key,
                        type(exc).__name__,
                        exc,
                    )

    def report_failures(self) -> None:
        """At the run's end: the hooks that failed more than once, with their counts."""
        for key, count in self._failures.items():
            if count > 1:
                _logger.warning("otel_mindformers: custom monitor %s failed %d times in this run", key, count)
        self._failures.clear()


def build_monitor(cls: type[BaseMonitor], config: MonitorConfig) -> BaseMonitor:
    """`cls(config)`; ConfigError naming the key (and the exception) if the constructor raises."""
    try:
        return cls(config)
    except Exception as exc:
        raise ConfigError(
            f"{CUSTOM_MONITOR_KEY}: building {config.custom_monitor_callback!r} raised {type(exc).__name__}: {exc}"
        ) from exc
