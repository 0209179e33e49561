"""The job's parallel layout: MindSpore's auto-parallel context, refined by the run config a
MindFormers Trainer starts with (data / tensor / pipeline / expert / context parallelism,
micro-batches, sequence length, global batch). No convention exists for these; like the rank
they live under `training.` (names/semconv.py)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from otel_mindformers.names import semconv

# MindFormers' parallel_config key -> attribute (its `model_parallel` is tensor parallelism).
_PARALLEL_CONFIG = (
    ("data_parallel", semconv.ATTR_PARALLEL_DATA),
    ("model_parallel", semconv.ATTR_PARALLEL_TENSOR),
    ("pipeline_stage", semconv.ATTR_PARALLEL_PIPELINE),
    ("expert_parallel", semconv.ATTR_PARALLEL_EXPERT),
    ("context_parallel", semconv.ATTR_PARALLEL_CONTEXT),
    ("micro_batch_num", semconv.ATTR_MICRO_BATCHES),
)
# What the MindFormers glue recorded for the run about to train (record_mindformers_run).
_mindformers_run: dict[str, int] = {}


def record_mindformers_run(run_config: Any) -> None:
    """Remember a MindFormers Trainer's layout as it starts training, for the identities
    detected from then on (until the next Trainer run records its own).

    `run_config` is the run's MindFormerConfig: `parallel_config`, `runner_config`,
    `model.model_config.seq_length`. In (semi-)auto parallel MindFormers has already
    replaced `runner_config.batch_size` by the global batch and kept the per-device one as
    `mini_batch_size`; otherwise the global batch is batch size x data parallel x gradient
    accumulation steps, as MindFormers computes it."""
    layout: dict[str, int] = {}
    parallel = _get(run_config, "parallel_config")
    for key, attribute in _PARALLEL_CONFIG:
        if (value := _positive(_get(parallel, key))) is not None:
            layout[attribute] = value
    model_config = _get(_get(run_config, "model"), "model_config")
    if (seq_length := _positive(_get(model_config, "seq_length"))) is not None:
        layout[semconv.ATTR_SEQUENCE_LENGTH] = seq_length
    runner = _get(run_config, "runner_config")
    if (batch := _positive(_get(runner, "batch_size"))) is not None:
        if _get(runner, "mini_batch_size") is None:
            batch *= layout.get(semconv.ATTR_PARALLEL_DATA, 1) * (
                _positive(_get(runner, "gradient_accumulation_steps")) or 1
            )
        layout[semconv.ATTR_GLOBAL_BATCH_SIZE] = batch
    _mindformers_run.clear()
    _mindformers_run.update(layout)


def _get(section: Any, key: str) -> Any:
    if section is None:
        return None
    if isinstance(section, Mapping):
        return section.get(key)
    return getattr(section, key, None)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _parallel_context() -> dict[str, str | int]:
    """MindSpore's auto-parallel context, when the script has imported MindSpore and left
    stand-alone mode: the mode, the device count and the pipeline stages."""
    mindspore = sys.modules.get("mindspore")
    if mindspore is None:
        return {}
    try:
        mode = str(mindspore.get_auto_parallel_context("parallel_mode"))
        attrs: dict[str, str | int] = {semconv.ATTR_PARALLEL_MODE: mode}
        if mode != "stand_alone":
            attrs[semconv.ATTR_PARALLEL_DEVICES] = _devices(mindspore)
            attrs[semconv.ATTR_PARALLEL_PIPELINE] = int(mindspore.get_auto_parallel_context("pipeline_stages"))
            if mode == "data_parallel":
                attrs[semconv.ATTR_PARALLEL_DATA] = attrs[semconv.ATTR_PARALLEL_DEVICES]
        return attrs
    except Exception:  # a MindSpore without this context: no layout, not a failure
        return {}


def _devices(mindspore: Any) -> int:
    """The devices in the parallel group: `device_num` when the script set it, else (it stays
    at its default of 1 after `init()`) the communication group's size."""
    devices = int(mindspore.get_auto_parallel_context("device_num"))
    if devices > 1:
        return devices
    try:
        from mindspore.communication import get_group_size

        return int(get_group_size())
    except Exception:  # communication not initialised: one device
        return devices


def layout_attributes() -> dict[str, str | int]:
    """MindSpore's context, refined by the last MindFormers run recorded."""
    return {**_parallel_context(), **_mindformers_run}
