"""OpenTelemetry's declarative configuration: the SDK from the file `OTEL_CONFIG_FILE` names.

With `OTEL_CONFIG_FILE` set, the file configures the process's SDK (`file_format: "1.0"`):
its tracer, meter and logger providers and their exporters, the resource and the
propagators, and the spec has the SDK's other `OTEL_*` variables ignored. Three doors lead
here, and the first one configures the SDK for the process, before training:
the `mindformers` configurator under `opentelemetry-instrument`, `otel_mindformers.instrument()`,
and a `MonitorCallback` built without providers. What the file does not configure (a signal
without its section) stays a no-op, as the spec says: no provider of ours replaces it.

- Our resource attributes are added to the file's: the `mindformers` resource detector runs
  first in the file's `detection/development` list, so the file's own detectors and its
  explicit attributes win (a `service.name` the file sets stays).
- Our instrumentor's options may live in the file, under `instrumentation/development:
  python: mindformers:` (a `monitor_config` section, `enabled: false` turning it off). They
  are taken out of what the SDK applies (it would call our instrumentor with them and log
  a traceback for a bad one) and returned to the instrumentor, which validates them.
- A problem (opentelemetry-configuration missing, a file that does not load or apply) is
  one `ConfigError` naming the file and what to do; it is kept, so each door reports the same.

Needs `opentelemetry-configuration` (0.66b0 or later, the release of the installed SDK): the
`file-configuration` extra.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import _logs, metrics, trace

from otel_mindformers.config import ConfigError, MonitorConfig
from otel_mindformers.config.coercion import parse_section
from otel_mindformers.config.extras import install_hint
from otel_mindformers.config.limits import MAX_CONFIG_BYTES, PROMETHEUS_PORT
from otel_mindformers.config.redaction import Redactor
from otel_mindformers.config.yaml_loader import parse_yaml
from otel_mindformers.core.bounded_read import read_small_file
from otel_mindformers.job.identity import Identity, detect_identity, runs_no_training
from otel_mindformers.names.semconv import DEFAULT_SERVICE_NAME

VARIABLE = "OTEL_CONFIG_FILE"
MODULE = "opentelemetry.configuration"
# Our entry points' name: the instrumentor the file's options are for, the resource detector.
NAME = "mindformers"
OPTIONS_KEY = f"instrumentation/development.python.{NAME}"
# The package's loader logs what it raises, with a traceback: our one error says it instead.
_LOADER_LOGGER = "opentelemetry.configuration.file._loader"
# A substitution reference with the spec's `env:` prefix, or a `$$` escape to step over.
_ENV_PREFIXED = re.compile(r"\$\$|\$\{env:(?=[A-Za-z_])")
# The variables a file reads: their values (tokens in headers) are masked in our messages.
_REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)")
# A value this short is no secret, and masking it would garble the message.
_MIN_SECRET_CHARS = 4


@dataclass(frozen=True)
class FileConfiguration:
    """The file that configured the SDK: its path and our instrumentor's entry in it (None:
    the file has none), `enabled: false` taken out into `enabled`."""

    path: str
    options: dict[str, Any] | None
    enabled: bool = True

    def monitor_config(self) -> MonitorConfig | None:
        """Our entry as a `monitor_config` (each problem naming its key there), None when the
        file has none. A custom monitor is looked for beside the file, as beside any YAML
        `load_monitor_config` reads: the run and `validate` find the same one."""
        if self.options is None:
            return None
        config = parse_section(MonitorConfig, self.options, OPTIONS_KEY)
        config.source_dir = os.path.dirname(os.path.abspath(self.path))
        return config


_lock = threading.Lock()
_applied: FileConfiguration | None = None
_problem: ConfigError | None = None


def path() -> str | None:
    """The file `OTEL_CONFIG_FILE` names, or None."""
    value = os.environ.get(VARIABLE, "").strip()
    return value or None


def applied() -> FileConfiguration | None:
    """The file that configured this process's SDK, or None."""
    return _applied


def configure_for(config: MonitorConfig) -> FileConfiguration | None:
    """`configure` for a MonitorCallback built without providers: the resource says who this
    process is as the run will (its `service_name`, its `job_id`)."""
    if path() is None:
        return None
    identity = detect_identity()
    if config.job_id:
        identity = dataclasses.replace(identity, job_id=config.job_id)
    return configure({"service.name": config.service_name or DEFAULT_SERVICE_NAME, **identity.attributes()})


def configure(resource_attributes: Mapping[str, Any] | None = None) -> FileConfiguration | None:
    """Configure the SDK from `OTEL_CONFIG_FILE`, once per process; None when it is unset.
    `resource_attributes`: ours to add to the file's (None: the `mindformers` detector's,
    read from the environment). An SDK someone configured already is left as it is (the
    file is still read for our options). Raises the ConfigError of a missing package or a
    file that does not load, the same one on every call."""
    global _applied, _problem
    file = path()
    if file is None:
        return None
    with _lock:
        if _problem is not None:
            raise _problem
        if _applied is not None and _applied.path == file:
            return _applied
        try:
            _applied = _configure(file, resource_attributes)
        except ConfigError as exc:
            _problem = exc
            raise
        return _applied


def _error(file: str, problem: str) -> ConfigError:
    return ConfigError(f"{VARIABLE}={file}: {problem}")


def read() -> FileConfiguration | None:
    """Our entry in `OTEL_CONFIG_FILE` without configuring anything (the caller brings its
    own providers); None when it is unset. Raises the file's ConfigError."""
    file = path()
    if file is None:
        return None
    return read_file(file)


def read_file(file: str) -> FileConfiguration:
    """What a declarative configuration file says of us, loaded as `OTEL_CONFIG_FILE` would
    be (`otel-mindformers validate` checks one); nothing is configured. Raises its ConfigError."""
    _, declared, _ = _load(file)
    return declared


def _load(file: str) -> tuple[Any, FileConfiguration, str | None]:
    """The file's model (our entry taken out), what it says of us, and its text as read
    (None where the loader read it itself), whose variables an error message masks."""
    try:
        import opentelemetry.configuration as configuration
    except ModuleNotFoundError as exc:
        if exc.name is None or not MODULE.startswith(exc.name):  # something it imports is missing
            raise _error(file, f"{MODULE} fails on import ({exc})") from None
        raise _error(
            file,
            f"OpenTelemetry's declarative configuration needs opentelemetry-configuration, which is not "
            f"installed: {install_hint(MODULE)}",
        ) from None
    except Exception as exc:  # an installed package that cannot be imported
        raise _error(file, f"{MODULE} fails on import ({type(exc).__name__}: {_one_line(exc)})") from None
    text = _bounded_text(file)
    with _quiet(_LOADER_LOGGER), _env_prefix_read(file, text) as readable:
        try:
            model = configuration.load_config_file(readable)
        except Exception as exc:  # ConfigurationError, and whatever a broken file makes the loader raise
            raise _error(file, _masked(text, _one_line(exc).replace(readable, file))) from None
    options = _take_our_options(model)
    enabled = True
    if options is not None:
        enabled = options.pop("enabled", True) is not False
    return model, FileConfiguration(file, options, enabled), text


def _bounded_text(file: str) -> str | None:
    """The file's text, held to our configuration's bounds before the loader (which reads any
    size, and builds every expansion of an alias) sees it: a regular file (a FIFO would block
    the process) of at most MAX_CONFIG_BYTES, YAML within the node and nesting bounds, a syntax
    error without the parser's quote of the line. None: the loader says what is wrong."""
    try:
        data = read_small_file(file, MAX_CONFIG_BYTES)
    except OSError:
        return None
    if data is None:
        raise _error(file, f"not a regular file of at most {MAX_CONFIG_BYTES // 2**20} MiB; not read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if Path(file).suffix.lower() in (".yaml", ".yml"):
        try:
            parse_yaml(Path(file), text)
        except ConfigError as exc:
            raise _error(file, str(exc).removeprefix(f"{file}: ")) from None
    return text


def _masked(text: str | None, message: str) -> str:
    """`message` without the values of the variables the file reads: the loader's schema error
    quotes a value (a numeric token), the SDK's a setting it refuses."""
    names = set(_REFERENCE.findall(text or ""))
    values = (os.environ.get(name, "").strip() for name in names)
    return Redactor(value for value in values if len(value) >= _MIN_SECRET_CHARS)(message)


@contextlib.contextmanager
def _env_prefix_read(file: str, text: str | None) -> Iterator[str]:
    """The file, or a copy of its `text` whose `${env:VAR}` references read `${VAR}`: the spec's
    substitution takes both spellings, opentelemetry-configuration (0.66b2) only the second,
    and would leave an endpoint `${env:COLLECTOR}/v1/traces` as written. `$$` stays an escape.
    The copy holds the references, never their values, in a folder only this user can read."""
    if text is None:  # the loader says what is wrong with it
        yield file
        return
    rewritten = _ENV_PREFIXED.sub(lambda match: "${" if match.group(0) != "$$" else "$$", text)
    if rewritten == text:
        yield file
        return
    with tempfile.TemporaryDirectory(prefix="otel_config_file.") as folder:
        copy = Path(folder) / Path(file).name  # the loader reads the format from the suffix
        copy.write_text(rewritten, encoding="utf-8")
        yield str(copy)


def _configure(file: str, resource_attributes: Mapping[str, Any] | None) -> FileConfiguration:
    model, declared, text = _load(file)
    # msrun's launcher and scheduler: a pull reader there would take local rank 0's port.
    if _sdk_configured() or runs_no_training():
        return declared
    import opentelemetry.configuration as configuration
    from opentelemetry.configuration import models

    detector: dict[str, Any] = {}
    if resource_attributes is not None:
        detector["attributes"] = dict(resource_attributes)
    elif declared.options and isinstance(declared.options.get("service_name"), str):  # our entry names the service
        detector["service_name"] = declared.options["service_name"]
    resource = model.resource or models.Resource()
    detection = resource.detection_development or models.ExperimentalResourceDetection()
    # First in the list: the file's own detectors run after ours and win, its attributes over all.
    detection.detectors = [models.ExperimentalResourceDetector(**{NAME: detector}), *(detection.detectors or [])]
    resource.detection_development, model.resource = detection, resource
    listens = _rank_ports(model, detect_identity())
    try:
        configuration.configure_sdk(model)
    except Exception as exc:  # an exporter or sampler the file names that cannot be built
        where = f" (its Prometheus pull readers listen on {', '.join(listens)})" if listens else ""
        raise _error(file, f"cannot apply it: {_masked(text, _one_line(exc))}{where}") from None
    return declared


def _rank_ports(model: Any, identity: Identity) -> list[str]:
    """Ranks sharing a node cannot share a port: as the `prometheus` output does, with several
    ranks, local rank r's Prometheus pull reader listens on the file's port + r (9464 + r where
    it names none), port 0 staying "any". Returns where each pull reader will listen."""
    readers = model.meter_provider.readers if model.meter_provider is not None else None
    listens = []
    for reader in readers or []:
        exporter = reader.pull.exporter.prometheus_development if reader.pull is not None else None
        if exporter is None:
            continue
        exporter.port = identity.node_port(PROMETHEUS_PORT if exporter.port is None else exporter.port)
        listens.append(f"{exporter.host or 'localhost'}:{exporter.port}")
    return listens


def _take_our_options(model: Any) -> dict[str, Any] | None:
    """Our instrumentor's entry, taken out of the model (the schema made it a mapping), or
    None when absent."""
    instrumentation = model.instrumentation_development
    python = getattr(instrumentation, "python", None) if instrumentation is not None else None
    if not python or NAME not in python:
        return None
    return dict(python.pop(NAME))


def _sdk_configured() -> bool:
    """Some SDK provider is the global one already (another configurator read the file)."""
    providers = (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider())
    return any(type(provider).__module__.startswith("opentelemetry.sdk") for provider in providers)


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


__all__ = [
    "NAME",
    "OPTIONS_KEY",
    "VARIABLE",
    "FileConfiguration",
    "applied",
    "configure",
    "configure_for",
    "path",
    "read",
    "read_file",
]
