"""Local outputs selected by `output_type`: stdout, json_file, tensorboard."""

from __future__ import annotations

from otel_mindformers.config import OutputsConfig
from otel_mindformers.config.extras import TENSORBOARD_MODULES, output_off_warning
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs import jsonl, tensorboard
from otel_mindformers.outputs.base import OutputSink, SinkFanout
from otel_mindformers.outputs.jsonl import JsonLinesSink, rank_path
from otel_mindformers.outputs.runs import is_resumed
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, rank_dir

_logger = get_logger(__name__)


def build_sinks(
    config: OutputsConfig, identity: Identity, reports_training: bool, first_step: int = 0
) -> list[OutputSink]:
    """Files are per rank (JSON file, TensorBoard folder), so every rank keeps its own;
    stdout belongs to reporting ranks, so an 8-rank job prints one set of lines, not eight
    (the article's policy). Files hold one run: a run starting at step 0 sets the previous
    run's aside, a resumed one (`first_step` > 0) writes on after it (outputs/runs.py)."""
    kinds = config.output_type
    resumed = is_resumed(first_step)
    sinks: list[OutputSink] = []
    if "stdout" in kinds and reports_training:
        sinks.append(StdoutSink())
    if "json_file" in kinds:
        path = rank_path(config.json_log_path, identity)
        if not resumed:
            jsonl.set_previous_run_aside(path)
        sinks.append(JsonLinesSink(path, config.log_rotation))
    if "tensorboard" in kinds:
        unavailable = output_off_warning("tensorboard", TENSORBOARD_MODULES)
        if unavailable:  # an optional extra: training goes on without this output
            _logger.warning(unavailable)
        else:
            logdir = rank_dir(config.tensorboard_path, identity)
            if not resumed:
                tensorboard.set_previous_run_aside(logdir)
            sinks.append(TensorBoardSink(logdir, config.log_rotation, first_step + 1 if resumed else None))
    return sinks


__all__ = ["OutputSink", "SinkFanout", "build_sinks"]
