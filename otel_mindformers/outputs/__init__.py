"""Local outputs selected by `output_type`: stdout, json_file, tensorboard."""

from __future__ import annotations

import logging

from otel_mindformers.config import OutputsConfig
from otel_mindformers.extras import install_hint, is_installed
from otel_mindformers.identity import Identity
from otel_mindformers.outputs.base import OutputSink, SinkFanout
from otel_mindformers.outputs.jsonl import JsonLinesSink, rank_path
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, rank_dir

_logger = logging.getLogger(__name__)


def build_sinks(config: OutputsConfig, identity: Identity, reports_training: bool) -> list[OutputSink]:
    """Files are per rank (JSON file, TensorBoard folder), so every rank keeps its own;
    stdout belongs to reporting ranks, so an 8-rank job prints one set of lines, not eight
    (the article's policy)."""
    kinds = config.output_type
    sinks: list[OutputSink] = []
    if "stdout" in kinds and reports_training:
        sinks.append(StdoutSink())
    if "json_file" in kinds:
        sinks.append(JsonLinesSink(rank_path(config.json_log_path, identity), config.log_rotation))
    if "tensorboard" in kinds:
        if is_installed("tensorboardX"):
            sinks.append(TensorBoardSink(rank_dir(config.tensorboard_path, identity), config.log_rotation))
        else:  # an optional extra: training goes on without this output
            _logger.warning(
                "otel_mindformers: the tensorboard output (monitor_config.output_type) is off: "
                "tensorboardX is not installed; %s", install_hint("tensorboardX"),
            )
    return sinks


__all__ = ["OutputSink", "SinkFanout", "build_sinks"]
