"""Local outputs selected by `output_type`: stdout, json_file, tensorboard."""

from __future__ import annotations

from otel_mindformers.config import MonitorConfig
from otel_mindformers.identity import Identity
from otel_mindformers.outputs.base import BackgroundDispatcher, OutputSink
from otel_mindformers.outputs.jsonl import JsonLinesSink, rank_path
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, rank_dir


def build_sinks(config: MonitorConfig, identity: Identity, reports_training: bool) -> list[OutputSink]:
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
        sinks.append(TensorBoardSink(rank_dir(config.tensorboard_path, identity), config.log_rotation))
    return sinks


__all__ = ["BackgroundDispatcher", "OutputSink", "build_sinks"]
