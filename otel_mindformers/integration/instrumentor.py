"""`MindFormersInstrumentor`, the `mindformers` instrumentor: the one place that patches.

Two levels, each undone exactly by its counterpart:

- `register()` / `unregister()`: the MindFormers integration (mindformers_glue.py), and
  `checkpoint.load` phases around MindSpore's and MindFormers' checkpoint loads
  (checkpoint_load.py). A MindFormers YAML may carry the monitor_config article's `monitor_config` keys
  and name our callback, and the Trainer monitors runs whose `monitor_config` says
  `enable: true`. `import otel_mindformers` registers it unless
  OTEL_PYTHON_DISABLED_INSTRUMENTATIONS names `mindformers` (or `*`): then nothing in
  MindSpore or MindFormers is touched.
- `instrument()` / `uninstrument()` (`opentelemetry-instrument` loads it through the
  `opentelemetry_instrumentor` entry point; `otel_mindformers.instrument()` from code): every
  `mindspore.train.Model.train` / `Model.fit` call then gets exactly one `MonitorCallback`,
  appended unless the call already has one, and MindFormers' Trainer monitors every run
  unless its `monitor_config` says `enable: false`. It registers the integration if it was not.

Its configuration: `instrument(config=...)`, else the YAML named by
`OTEL_PYTHON_MINDFORMERS_CONFIG`, else a MindFormers YAML's `monitor_config`, else the
defaults. The callback records through the providers passed to `instrument()`, else the
ones `opentelemetry-instrument` configured from the OTEL_* variables.

With `OTEL_CONFIG_FILE` set (OTel's declarative configuration, telemetry/config_file.py)
the SDK comes from that file, configured at the latest here, and the configuration from its
`instrumentation/development: python: mindformers:` entry (validated as `monitor_config`;
`enabled: false` leaves everything unpatched) instead of `OTEL_PYTHON_MINDFORMERS_CONFIG`,
which the spec has ignored then, like every OTEL_* variable. A file that cannot be used is
said once and refuses training, as an invalid configuration does.

Modules are patched when they are imported, so a process that never trains (the msrun
launcher, tools) never pays for importing MindSpore. msrun's launcher and its scheduler
(`MS_ROLE=MS_SCHED`), which only coordinate the workers, are left alone
(`job/identity.runs_no_training`, as the distro's configurator leaves them).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.environment_variables import OTEL_PYTHON_DISABLED_INSTRUMENTATIONS
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_mindformers.compat import releases
from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.integration import checkpoint_load, mindformers_glue, propagation
from otel_mindformers.integration.environment_variables import (
    CONFIG_BEFORE_FLAGS,
    CONFIG_FLAG,
    OTEL_PYTHON_MINDFORMERS_CONFIG,
)
from otel_mindformers.integration.mindformers_glue import ZeroCode
from otel_mindformers.integration.package import _instruments
from otel_mindformers.integration.patches import Patches
from otel_mindformers.job.identity import runs_no_training
from otel_mindformers.telemetry import config_file

_logger = get_logger(__name__)

NAME = "mindformers"  # the entry point's name, as OTEL_PYTHON_DISABLED_INSTRUMENTATIONS lists it
_PROVIDERS = ("tracer_provider", "meter_provider", "logger_provider")
_TRAINING_METHODS = ("train", "fit")


def instrumentation_disabled() -> bool:
    """OTEL_PYTHON_DISABLED_INSTRUMENTATIONS names us (or `*`), read as opentelemetry-instrument reads it."""
    listed = {name.strip() for name in os.environ.get(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS, "").split(",")}
    return NAME in listed or "*" in listed


class MindFormersInstrumentor(BaseInstrumentor):
    """Patches MindSpore / MindFormers so that each training run gets one MonitorCallback.

    A singleton (BaseInstrumentor): its attributes are the process's patching state.
    """

    _registered = False  # register() called and not undone: patch MindFormers when imported
    _registered_by_instrument = False  # instrument() registered it, so uninstrument() unregisters
    _settings: ZeroCode | None = None  # set while instrumented
    _config_error: ConfigError | None = None  # OTEL_PYTHON_MINDFORMERS_CONFIG is invalid: training is refused
    _checked_in: str | None = None  # the working directory where _check_before_training refused it
    _mindformers: Patches | None = None  # what patching MindFormers changed
    _mindspore: Patches | None = None  # MindSpore's load_checkpoint (checkpoint_load.py)
    _model: Patches | None = None  # what patching mindspore.train.Model changed
    _exit_guard: Any = None  # telemetry.providers.SdkExitGuard while instrumented
    _hooked: frozenset[str] = frozenset()  # modules with an import hook (hooks cannot be removed)
    _subprocess: Patches | None = None  # subprocess.Popen, when OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT asks
    _declared_file: config_file.FileConfiguration | None = None  # OTEL_CONFIG_FILE, when it configured us

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    # --- the MindFormers integration ------------------------------------------------------------

    def register(self) -> bool:
        """Patch MindFormers now if it is imported, else as soon as it is. False: it already was."""
        if self._registered:
            return False
        self._registered = True
        self._when_imported("mindspore", self._patch_mindspore)
        self._when_imported("mindformers", self._patch_mindformers)
        if propagation.subprocess_context_requested():
            self._subprocess = propagation.patch_subprocess()
        return True

    def unregister(self) -> None:
        """Restore what register() patched (nothing if MindFormers was never imported)."""
        self._registered = False
        if self._subprocess is not None:
            self._subprocess.undo()
            self._subprocess = None
        if self._mindformers is not None:
            self._mindformers.undo()
            self._mindformers = None
        if self._mindspore is not None:
            self._mindspore.undo()
            self._mindspore = None

    def _patch_mindspore(self, _module: Any) -> None:
        # Like MindFormers' patch below: the import hook outlives unregister().
        if self._registered and self._mindspore is None:
            self._mindspore = checkpoint_load.patch_mindspore(lambda: self._registered)

    def _patch_mindformers(self, _module: Any) -> None:
        # The import hook outlives unregister(): it patches only while registered.
        if self._registered and self._mindformers is None:
            self._mindformers = mindformers_glue.patch_mindformers(self._training_process)

    def _training_process(self, wrapped: Callable, _instance: Any, args: tuple, kwargs: dict) -> Any:
        if (refusal := self._run_refusal()) is not None:
            raise refusal
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        mindformers_glue.with_one_monitor(bound, self._settings)
        token = mindformers_glue.TRAINER_RUNNING.set(True)
        try:
            return wrapped(*bound.args, **bound.kwargs)
        finally:
            mindformers_glue.TRAINER_RUNNING.reset(token)

    # --- zero-code ----------------------------------------------------------------------------------

    def _instrument(self, **kwargs: Any) -> None:
        """kwargs: `config` (a YAML path, mapping or MonitorConfig; raises ConfigError),
        `tracer_provider`, `meter_provider`, `logger_provider`."""
        if runs_no_training():  # msrun's launcher and scheduler, as the distro leaves them
            return
        providers = {name: kwargs.pop(name, None) for name in _PROVIDERS}
        explicit = kwargs.pop("config", None)
        self._declared_file = declared = self._declared(providers)
        if declared is not None and not declared.enabled:  # `enabled: false` in the file's entry
            return
        config: MonitorConfig | None = None
        if explicit is not None:
            config = load_monitor_config(explicit)
            _check_before_training(config)
        elif self._config_error is None:
            # Under opentelemetry-instrument an exception here would also skip every other
            # instrumentor (and stop a process that never trains): say it now, and refuse
            # the training run itself, as the code path refuses a bad config.
            try:
                config = _config_from_environment(declared)
            except ConfigError as exc:
                self._config_error = _refusal(exc, declared)
            else:
                try:
                    _check_before_training(config)
                except ConfigError as exc:
                    self._config_error, self._checked_in = _refusal(exc, declared), os.getcwd()
            if self._config_error is not None:
                _logger.error("%s", self._config_error)
        for outside in releases.first_warning():  # at process start, before the script trains
            _logger.warning("otel_mindformers: %s", outside)
        self._settings = ZeroCode(config=config, providers=providers)
        self._registered_by_instrument = self.register()
        self._when_imported("mindspore.train.model", self._patch_model)
        if all(provider is None for provider in providers.values()):
            from otel_mindformers.telemetry.providers import SdkExitGuard

            self._exit_guard = SdkExitGuard.install((config or MonitorConfig()).shutdown_timeout)

    def _declared(self, providers: dict[str, Any]) -> config_file.FileConfiguration | None:
        """With OTEL_CONFIG_FILE set: the SDK configured from it (unless providers were
        passed), and our entry in it. A file that cannot be used refuses training (said once)."""
        if config_file.path() is None:
            return None
        try:
            if all(provider is None for provider in providers.values()):
                declared = config_file.configure()
            else:  # the caller's providers: the file gives only our options
                declared = config_file.read()
        except ConfigError as exc:
            self._config_error = file_problem_said(exc)
            return None
        if OTEL_PYTHON_MINDFORMERS_CONFIG in os.environ:
            _logger.warning(
                "otel_mindformers: %s is ignored: %s is set (OTel's declarative configuration); put the monitor "
                "configuration under %s in that file",
                OTEL_PYTHON_MINDFORMERS_CONFIG, config_file.VARIABLE, config_file.OPTIONS_KEY,
            )  # fmt: skip
        return declared

    def _run_refusal(self) -> ConfigError | None:
        """The error that refuses this run, if any. The output paths and the custom monitor's
        import were checked relative to the working directory at process start: a script that
        has changed directory since is checked again, where its run will look."""
        if self._checked_in is not None and self._checked_in != os.getcwd():
            self._checked_in = None
            try:
                _check_before_training(self._settings.config if self._settings else None)
            except ConfigError as exc:
                self._config_error = _refusal(exc, self._declared_file)
            else:
                self._config_error = None
        return self._config_error

    def _uninstrument(self, **kwargs: Any) -> None:
        self._settings = None
        self._declared_file = None
        self._config_error = None
        self._checked_in = None
        if self._model is not None:
            self._model.undo()
            self._model = None
        if self._registered_by_instrument:
            self.unregister()
            self._registered_by_instrument = False
        if self._exit_guard is not None:
            self._exit_guard.uninstall()
            self._exit_guard = None

    def _patch_model(self, module: Any) -> None:
        # The import hook outlives uninstrument(): it patches only while instrumented.
        if self._settings is None or self._model is not None:
            return
        self._model = Patches()
        for method in _TRAINING_METHODS:
            self._model.wrap(module.Model, method, self._with_monitor)

    def _with_monitor(self, wrapped: Callable, _model: Any, args: tuple, kwargs: dict) -> Any:
        settings = self._settings
        if settings is None or mindformers_glue.inside_trainer():
            return wrapped(*args, **kwargs)
        if (refusal := self._run_refusal()) is not None:
            raise refusal
        from otel_mindformers.runtime.callback import MonitorCallback

        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        listed = mindformers_glue.callback_list(bound.arguments.get("callbacks"))
        config = settings.config if settings.config is not None else MonitorConfig()
        if config.enable and not any(isinstance(cb, MonitorCallback) for cb in listed):
            bound.arguments["callbacks"] = listed + [MonitorCallback(config, **settings.callback_kwargs())]
        return wrapped(*bound.args, **bound.kwargs)

    def _when_imported(self, module: str, patch: Callable[[Any], None]) -> None:
        """Run `patch(module)` now if it is imported, else when it is; one hook per module."""
        if module in self._hooked:
            if module in sys.modules:
                patch(sys.modules[module])
            return
        self._hooked = self._hooked | {module}
        wrapt.register_post_import_hook(patch, module)  # runs now if already imported


def _check_before_training(config: MonitorConfig | None) -> None:
    """What a run would refuse at its start, checked now, at process start, rather than at
    the first `Model.train`, after the script has built its data and network: the output
    paths (nothing is created) and the class `custom_monitor_callback` names (imported, with
    the script's directory importable, as it will be when the script runs). Building the
    monitor runs the user's code (the monitor_config article's opens its log file): that waits for the run.
    ConfigError with every problem found."""
    if config is None or not config.enable:
        return
    from otel_mindformers.outputs.paths import check_output_paths

    problems = check_output_paths(config)
    script = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else ""
    if config.custom_monitor_callback:
        from otel_mindformers.runtime.custom_monitors import load_monitor_class

        added = os.path.dirname(os.path.abspath(script)) if script else None
        if added is not None and added not in sys.path:
            sys.path.insert(0, added)
        else:
            added = None
        try:
            load_monitor_class(config)
        except ConfigError as exc:
            problems += exc.problems
        finally:
            if added is not None:
                sys.path.remove(added)
    if problems:
        raise ConfigError(*problems)


def _named_by() -> str:
    """How the user named the config: `--mindformers_config PATH` typed after
    opentelemetry-instrument (environment_variables.py records what the variable was before
    that command parsed its flags), else the variable."""
    path = os.environ[OTEL_PYTHON_MINDFORMERS_CONFIG]
    before = os.environ.get(CONFIG_BEFORE_FLAGS)
    if before is not None and before != path:
        return f"opentelemetry-instrument --{CONFIG_FLAG} {path}"
    return f"{OTEL_PYTHON_MINDFORMERS_CONFIG}={path}"


_DISABLE = f"to train without monitoring, set {OTEL_PYTHON_DISABLED_INSTRUMENTATIONS}=mindformers"


def _refusal(exc: ConfigError, declared: config_file.FileConfiguration | None = None) -> ConfigError:
    """The error every training run of the process raises before its first step."""
    refusal = ConfigError(*exc.problems)
    if declared is not None:
        named, check = f"{config_file.VARIABLE}={declared.path}", ""
    else:
        path = os.environ[OTEL_PYTHON_MINDFORMERS_CONFIG]
        named, check = _named_by(), f"check it with `otel-mindformers validate {path}`; "
    refusal.args = (
        f"otel_mindformers: {named} is invalid, so training is refused before its first step ({check}{_DISABLE}): {exc}",
    )
    return refusal


_file_problem_said = False


def file_problem_said(exc: ConfigError) -> ConfigError:
    """OTEL_CONFIG_FILE cannot be used: the error that refuses training, said once per
    process (by the configurator under opentelemetry-instrument, else here). With our
    instrumentation disabled nothing refuses: it says that nothing is exported instead."""
    global _file_problem_said
    if instrumentation_disabled():
        refusal = ConfigError(*exc.problems)
        refusal.args = (f"otel_mindformers: {exc}; the OpenTelemetry SDK is not configured: nothing is exported",)
    else:
        refusal = ConfigError(*exc.problems)
        refusal.args = (f"otel_mindformers: training is refused before its first step ({_DISABLE}): {exc}",)
    if not _file_problem_said:
        _file_problem_said = True
        _logger.error("%s", refusal)
    return refusal


def _config_from_environment(declared: config_file.FileConfiguration | None = None) -> MonitorConfig | None:
    """The monitor configuration without `instrument(config=...)`: the OTEL_CONFIG_FILE
    entry (validated as `monitor_config`, each problem naming its key there), else
    OTEL_PYTHON_MINDFORMERS_CONFIG (`declared` is None: no OTEL_CONFIG_FILE), else None."""
    if declared is not None:
        return declared.monitor_config()
    path = os.environ.get(OTEL_PYTHON_MINDFORMERS_CONFIG)
    return load_monitor_config(path) if path else None
