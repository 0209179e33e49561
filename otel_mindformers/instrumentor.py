"""Zero-code monitoring: `MindFormersInstrumentor`, the `mindformers` instrumentor.

`opentelemetry-instrument python train.py` loads it (entry point group
`opentelemetry_instrumentor`); `otel_mindformers.instrument()` does the same from code.
Every `mindspore.train.Model.train` / `Model.fit` call then gets exactly one
`MonitorCallback`, appended unless the call already has one; MindFormers' Trainer decides
for its own runs (see mindformers_glue.py), so its `Model.train` call is left as it is.

Its configuration: `instrument(config=...)`, else the YAML named by
`OTEL_PYTHON_MINDFORMERS_CONFIG`, else a MindFormers YAML's `monitor_config`, else the
defaults. The callback records through the providers passed to `instrument()`, else the
ones `opentelemetry-instrument` configured from the OTEL_* variables.

`mindspore.train.model` is patched when it is imported, so a process that never trains
(the msrun launcher, tools) never pays for importing MindSpore. msrun's scheduler
(`MS_ROLE=MS_SCHED`) runs the script only to coordinate workers and is left alone.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Collection

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap

from otel_mindformers import mindformers_glue
from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.environment_variables import OTEL_PYTHON_MINDFORMERS_CONFIG
from otel_mindformers.package import _instruments

_logger = logging.getLogger(__name__)

_PROVIDERS = ("tracer_provider", "meter_provider", "logger_provider")
_TRAINING_METHODS = ("train", "fit")


class MindFormersInstrumentor(BaseInstrumentor):
    """Injects one MonitorCallback into every MindSpore / MindFormers training run."""

    _settings: mindformers_glue.ZeroCode | None = None  # set while instrumented
    _model_class: type | None = None  # the Model class whose methods are wrapped
    _installed_glue = False  # the MindFormers integration was off before instrument()

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        """kwargs: `config` (a YAML path, mapping or MonitorConfig; raises ConfigError),
        `tracer_provider`, `meter_provider`, `logger_provider`."""
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            return
        if kwargs.get("config") is not None:
            config = load_monitor_config(kwargs["config"])
        else:
            try:
                config = _config_from_environment()
            except ConfigError as exc:
                # Under opentelemetry-instrument an exception here would also skip every other
                # instrumentor: say it once and let training run unmonitored.
                _logger.error(
                    "otel_mindformers: %s=%s is invalid, training runs without monitoring: %s",
                    OTEL_PYTHON_MINDFORMERS_CONFIG, os.environ[OTEL_PYTHON_MINDFORMERS_CONFIG], exc,
                )
                return
        self._settings = mindformers_glue.ZeroCode(
            config=config, providers={name: kwargs.get(name) for name in _PROVIDERS}
        )
        mindformers_glue.set_zero_code(self._settings)
        # `import otel_mindformers` installed it already, unless someone uninstalled it since.
        self._installed_glue = mindformers_glue.install()
        wrapt.register_post_import_hook(self._patch_model, "mindspore.train.model")

    def _uninstrument(self, **kwargs: Any) -> None:
        self._settings = None
        mindformers_glue.set_zero_code(None)
        if self._installed_glue:
            mindformers_glue.uninstall()
            self._installed_glue = False
        model = self._model_class
        if model is not None:
            for method in _TRAINING_METHODS:
                unwrap(model, method)
            self._model_class = None

    def _patch_model(self, module: Any) -> None:
        # The import hook outlives uninstrument(): it patches only while instrumented.
        if self._settings is None or self._model_class is not None:
            return
        for method in _TRAINING_METHODS:
            wrapt.wrap_function_wrapper(module.Model, method, self._with_monitor)
        self._model_class = module.Model

    def _with_monitor(self, wrapped: Callable, _model: Any, args: tuple, kwargs: dict) -> Any:
        settings = self._settings
        if settings is None or mindformers_glue.inside_trainer():
            return wrapped(*args, **kwargs)
        from otel_mindformers.callback import MonitorCallback

        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        listed = mindformers_glue.callback_list(bound.arguments.get("callbacks"))
        config = settings.config if settings.config is not None else MonitorConfig()
        if config.enable and not any(isinstance(cb, MonitorCallback) for cb in listed):
            bound.arguments["callbacks"] = listed + [MonitorCallback(config, **settings.callback_kwargs())]
        return wrapped(*bound.args, **bound.kwargs)


def _config_from_environment() -> MonitorConfig | None:
    path = os.environ.get(OTEL_PYTHON_MINDFORMERS_CONFIG)
    return load_monitor_config(path) if path else None
