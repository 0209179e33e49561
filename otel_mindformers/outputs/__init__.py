"""Local outputs selected by `output_type`: stdout, json_file, tensorboard."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from otel_mindformers.config import ConfigError, OutputsConfig
from otel_mindformers.config.extras import TENSORBOARD_MODULES, install_hint, output_off_warning
from otel_mindformers.core.file_lock import FileLocked
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs import tensorboard
from otel_mindformers.outputs.jsonl import JsonLinesSink, rank_path
from otel_mindformers.outputs.paths import JSON_LOG_KEY, TENSORBOARD_KEY
from otel_mindformers.outputs.runs import is_resumed, set_previous_run_aside
from otel_mindformers.outputs.sink import OutputSink, SinkFanout
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, rank_dir

_logger = get_logger(__name__)


def build_sinks(
    config: OutputsConfig, identity: Identity, reports_training: bool, first_step: int = 0, *, recovered: bool = False
) -> list[OutputSink]:
    """Files are per rank (JSON file, TensorBoard folder), so every rank keeps its own;
    stdout belongs to reporting ranks, so an 8-rank job prints one set of lines, not eight
    (the monitor_config article's policy). Files hold one run: a run starting at step 0 sets the previous
    run's aside, a resumed one (`first_step` > 0) writes on after it (outputs/runs.py).
    `recovered`: the files of a run that died, for the records its flight ring kept
    (flight_recorder/): written on after what they hold, with no restart marker (the recovery
    writes its own), no stdout, and no second warning for an output the run itself turns off."""
    kinds = config.output_type
    resumed = recovered or is_resumed(first_step)
    sinks: list[OutputSink] = []
    try:
        if "stdout" in kinds and reports_training and not recovered:
            sinks.append(StdoutSink())
        if "json_file" in kinds:
            json_sink = _json_sink(config, identity, resumed, recovered)
            if json_sink is not None:
                sinks.append(json_sink)
        if "tensorboard" in kinds:
            tensorboard_sink = _tensorboard_sink(config, identity, resumed, first_step, recovered)
            if tensorboard_sink is not None:
                sinks.append(tensorboard_sink)
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def _json_sink(config: OutputsConfig, identity: Identity, resumed: bool, recovered: bool) -> JsonLinesSink | None:
    """The JSON log's sink, or None with one warning when another process holds the log's
    lock past the bounded wait (a writer frozen while writing): telemetry, so training goes
    on. For `recovered` records FileLocked is raised: their ring stays for a later reader."""
    path = rank_path(config.json_log_path, identity)
    try:
        if not resumed:
            set_previous_run_aside(path)
        with _naming(JSON_LOG_KEY, path):
            return JsonLinesSink(path, config.log_rotation)
    except FileLocked as exc:
        if recovered:
            raise
        _logger.warning(
            "otel_mindformers: the json_file output (monitor_config.output_type) is off for this run: %s", exc
        )
        return None


def _tensorboard_sink(
    config: OutputsConfig, identity: Identity, resumed: bool, first_step: int, recovered: bool = False
) -> TensorBoardSink | None:
    """The TensorBoard output, or None with one warning when its packages are missing or
    broken: an optional extra, so training goes on without it."""
    unavailable = output_off_warning("tensorboard", TENSORBOARD_MODULES)
    if unavailable:
        if not recovered:  # the run's own outputs say it
            _logger.warning(unavailable)
        return None
    logdir = rank_dir(config.tensorboard_path, identity)
    if not resumed:
        tensorboard.set_previous_run_aside(logdir)
    try:
        with _naming(TENSORBOARD_KEY, logdir):
            return TensorBoardSink(logdir, config.log_rotation, first_step + 1 if resumed and not recovered else None)
    except ConfigError:
        raise
    except Exception as exc:  # tensorboardX imported, then failed in its writer (a broken crc32c, protobuf)
        if recovered:  # the run's own outputs say it
            return None
        _logger.warning(
            "otel_mindformers: the tensorboard output (monitor_config.output_type) is off: "
            "its event writer failed (%s: %s); %s",
            type(exc).__name__,
            exc,
            install_hint("tensorboardX"),
        )
        return None


@contextmanager
def _naming(key: str, path: Path) -> Iterator[None]:
    """A path the checks passed but the system refused (root past permission bits, a
    read-only mount, /proc): the ConfigError that names the key, before the first step."""
    try:
        yield
    except FileLocked:
        raise  # not the path: a process that holds its lock
    except OSError as exc:
        raise ConfigError(f"{key}: cannot write {str(path)!r}: {exc.strerror or exc}") from None


__all__ = ["OutputSink", "SinkFanout", "build_sinks"]
