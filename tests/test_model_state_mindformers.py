"""The real MindFormers tiny LLaMA on CPU with its own training-state monitor keys: the
readings MindFormers writes to its log reach the OTLP receiver and the JSON lines, per layer
and per kind, equal to MindFormers' numbers; `target` limits the per-parameter series."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np
import pytest
import yaml

from otel_mindformers.model_state.parameters import kind_of, layer_of
from otel_mindformers.names import model_state as specs
from otel_mindformers.names import training as tm
from tests.support.instrumented import child_env, instrumented, run
from tests.support.jsonl import json_lines
from tests.support.mindformers_trainer import CPU_RUNNER, half_unit, write_trainer
from tests.support.paths import REFERENCE_YAML

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api, pytest.mark.mindformers]

# MindFormers' TrainingStateMonitor log lines: `step:[    2/    3] adam_m_norm/<param>: 0.0123`
_STATE_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\] ([\w./]+): ([-+0-9.eE]+)$", re.M)
# MFLossMonitor prints the 7-tuple's local norms (squared, per parameter) once per step.
_LOCAL_NORM = re.compile(r"local_norm:\n\[([^\]]+)\]")


def _l2(values):
    return math.sqrt(sum(v * v for v in values))


def test_mindformers_state_readings_reach_otel_equal_to_its_own_log(workdir, otlp_receiver):
    document = yaml.safe_load(REFERENCE_YAML.read_text())
    document["runner_wrapper"]["local_norm"] = True  # the 7-tuple
    document["monitor_config"].update(
        optimizer_state_format=["log"],
        weight_state_format=["log"],
        target=["layers.1.attention"],
        output_type=["stdout", "json_file"],
    )
    script = write_trainer(workdir, yaml.safe_dump(document), rows=6, register=False)
    result = run(instrumented(*CPU_RUNNER, script), child_env(otlp_receiver), workdir)
    log = result.stdout + result.stderr

    logged = defaultdict(dict)  # step -> tag -> value, as MindFormers wrote them
    off_by = defaultdict(dict)  # step -> tag -> how far the printed value may be from the reading
    for step, tag, value in _STATE_LINE.findall(log):
        logged[int(step)][tag] = float(value)
        off_by[int(step)][tag] = half_unit(value)
    lines = json_lines(workdir / "output" / "train_metric.json")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        mine, theirs, off = line["model_state"], logged[line["step"]], off_by[line["step"]]
        # MindFormers prints fewer digits before 1.9: a value it logged is as close as it printed.
        printed = max(off.values())
        assert line[tm.WEIGHT_NORM] == pytest.approx(theirs["weight_norm"], rel=1e-6, abs=printed)
        assert line[tm.THROUGHPUT_LINEARITY] == pytest.approx(theirs["throughput_linearity"], rel=1e-6, abs=printed)
        for family in (specs.ADAM_M_NORM, specs.ADAM_V_NORM):
            per_param = {t.split("/", 1)[1]: v for t, v in theirs.items() if t.startswith(family + "/")}
            assert per_param and all("layers.1.attention" in name for name in per_param)  # MindFormers' filter
            by_layer, by_kind = defaultdict(list), defaultdict(list)
            for name, value in per_param.items():
                by_layer[layer_of(name)].append(value)
                by_kind[kind_of(name)].append(value)
            # An L2 norm of n printed values is off by at most n times one of them.
            within = printed * len(per_param)
            assert mine[family]["layer"] == pytest.approx({"1": _l2(by_layer["1"])}, rel=1e-6, abs=within)
            assert mine[family]["kind"] == pytest.approx({k: _l2(v) for k, v in by_kind.items()}, rel=1e-6, abs=within)
            assert mine[family]["parameter"] == pytest.approx(per_param, rel=1e-6, abs=printed)

    # The 7-tuple's per-parameter gradient norms, as MFLossMonitor logged them (squared).
    squares = [np.array(body.split(), dtype=float) for body in _LOCAL_NORM.findall(log)]
    assert len(squares) == 3
    grad = lines[-1]["model_state"][specs.GRAD_NORM]
    logged_squares = squares[2]  # step 3
    assert grad["max"]["value"] == pytest.approx(math.sqrt(logged_squares.max()), rel=1e-6)
    assert math.sqrt(sum(v * v for v in grad["kind"].values())) == pytest.approx(
        math.sqrt(logged_squares.sum()), rel=1e-6
    )
    assert sorted(grad["parameter"]) == sorted(n for n in grad["parameter"] if "layers.1.attention" in n)

    # OTel: the same numbers at the receiver; per-parameter series only for the target's parameters.
    family = specs.BY_FAMILY[specs.ADAM_V_NORM]
    otlp_receiver.wait_for(lambda r: r.points(family.layer.name))
    exported_layer = [p for p in otlp_receiver.points(family.layer.name) if p.attributes[specs.ATTR_LAYER] == "1"]
    latest = max(exported_layer, key=lambda p: p.time_unix_nano)
    assert latest.value == pytest.approx(lines[-1]["model_state"][specs.ADAM_V_NORM]["layer"]["1"], rel=1e-9)
    exported = {
        p.attributes[specs.ATTR_PARAMETER]
        for p in otlp_receiver.points(specs.BY_FAMILY[specs.GRAD_NORM].parameter.name)
    }
    assert exported and all("layers.1.attention" in name for name in exported)
    weight = otlp_receiver.points(tm.instrument_name(tm.WEIGHT_NORM))
    assert weight[-1].value == pytest.approx(lines[-1][tm.WEIGHT_NORM], rel=1e-9)
    # stdout: aggregates only, never a per-parameter list
    assert "grad_norm_max" in log


def test_moe_readings_in_mindformers_format_become_layer_series():
    """MoEDropRateCallback logs `layer: i, drop_rate: x` (its only output) and
    TopkBiasBalanceCallback writes `expert_load/<layer>` as `{ep_i: load}`. (MindFormers 1.9's
    drop-rate callback itself raises on MindSpore 2.9 CPU: it formats a Tensor with `:.5f`.)"""
    from otel_mindformers.core import measurements as recording
    from otel_mindformers.model_state.inbox import INBOX

    INBOX.open_run()
    try:
        INBOX.put_log_line("layer: 3, drop_rate: 0.30000", 7)
        INBOX.put_expert_load("expert_load/3", {"ep_0": 4.0, "ep_1": 1.0, "ep_2": 1.0, "ep_3": 2.0}, 7)
        INBOX.put_log_line("layer: 4, drop_rate: 0.10000", 5)  # before the window: left out
        # Written for step 6 after its line was (a callback after ours): step 6's, not step 7's.
        INBOX.put_log_line("layer: 5, drop_rate: 0.20000", 6)
        INBOX.put("weight_norm", np.array(2.0, dtype=np.float32), 6)
        scalars, state = INBOX.take(after_step=6)
    finally:
        INBOX.close_run()
    measured = {
        (m.spec.name, m.attributes[specs.ATTR_LAYER]): m.value
        for m in recording.model_state_measurements(state.summary(), {})
    }
    assert measured == {(specs.DROP_RATE.name, "3"): 0.3, (specs.EXPERT_LOAD_IMBALANCE.name, "3"): 2.0}
    assert scalars == {}


def test_micro_batch_local_losses_are_one_tensorboard_scalar_their_mean(tmp_path):
    """MindFormers writes `micro_local_<x>_loss` once per micro-batch: TensorBoard shows the
    step's local loss, their mean, beside the device's accumulated one; read back with
    TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from otel_mindformers.core.step_record import StepRecord
    from otel_mindformers.model_state.inbox import INBOX
    from otel_mindformers.outputs.tensorboard import TensorBoardSink

    INBOX.open_run()
    try:
        for loss in (1.0, 2.0, 6.0):
            INBOX.put("micro_local_lm_loss", np.array(loss, dtype=np.float32), 7)
        INBOX.put("device_accum_local_lm_loss", np.array(4.5, dtype=np.float32), 7)
        _, state = INBOX.take(after_step=6)
    finally:
        INBOX.close_run()
    sink = TensorBoardSink(tmp_path / "rank_0")
    sink.write([StepRecord(step=7, epoch=1, rank=0, time_stamp=1.0, model_state=state)])
    sink.close()
    accumulator = EventAccumulator(str(tmp_path / "rank_0"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars(specs.SUMMARY_LOCAL_LOSS)] == [(7, 3.0)]
    assert [(e.step, e.value) for e in accumulator.Scalars(f"{specs.SUMMARY_DEVICE_LOCAL_LOSS}/lm")] == [(7, 4.5)]
