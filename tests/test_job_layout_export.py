"""The job's parallel layout reaches the backend on every path (code or zero-code,
`Model.train` or the MindFormers Trainer): as the attributes of `mindformers.job.info`
(always 1, joined to any series on `training.rank`) and of the run span. Under
`opentelemetry-instrument` the SDK builds the resource before MindSpore is imported and
before the Trainer reads its YAML, so the resource cannot carry it there."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import yaml

from otel_mindformers.names import semconv
from tests.support.instrumented import REPO, child_env, instrumented, run

# real training against a real OTLP receiver
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api]

REFERENCE_YAML = REPO / "tests" / "fixtures" / "mindformers-tiny-llama-cpu.yaml"
CPU_RUNNER = ["python", "-m", "tests.support.mindformers_cpu"]
PLAIN_TRAIN = str(REPO / "examples" / "plain_train.py")

# The Trainer's layout as the reference YAML (edited below) and MindFormers make it.
TRAINER_LAYOUT = {
    semconv.ATTR_PARALLEL_MODE: "stand_alone",
    semconv.ATTR_PARALLEL_DATA: 1,
    semconv.ATTR_PARALLEL_TENSOR: 1,
    semconv.ATTR_PARALLEL_PIPELINE: 1,
    semconv.ATTR_MICRO_BATCHES: 1,
    semconv.ATTR_SEQUENCE_LENGTH: 16,
    semconv.ATTR_GLOBAL_BATCH_SIZE: 2,
}
# A plain Model.train in one process: MindSpore's context says stand-alone.
PLAIN_LAYOUT = {semconv.ATTR_PARALLEL_MODE: "stand_alone"}

TRAINER_SCRIPT = """
import numpy as np
{import_line}
from mindformers import MindFormerConfig, Trainer
from mindspore.dataset import GeneratorDataset

config = MindFormerConfig("reference.yaml")
rows = np.random.default_rng(0).integers(0, 64, size=(4, 17), dtype=np.int32)
Trainer(args=config, train_dataset=GeneratorDataset([(r,) for r in rows], column_names=["input_ids"]).batch(2)).train()
"""


def _trainer_files(workdir, receiver, zero_code: bool) -> None:
    document = yaml.safe_load(REFERENCE_YAML.read_text())
    document["parallel_config"] = {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1, "micro_batch_num": 1}
    if zero_code:  # the SDK's exporters, from OTEL_*
        document["monitor_config"].update(output_type=["json_file"])
    else:
        document["monitor_config"].update(
            output_type=["otlp"], otlp={"endpoint": receiver.grpc_endpoint, "protocol": "grpc"}
        )
    (workdir / "reference.yaml").write_text(yaml.safe_dump(document))
    # Zero-code: the script does not import us at all.
    import_line = "" if zero_code else "import otel_mindformers  # noqa: F401"
    (workdir / "train.py").write_text(TRAINER_SCRIPT.format(import_line=import_line))


def _trainer_layout() -> dict:
    """TRAINER_LAYOUT and the MindFormers release that ran it."""
    return {**TRAINER_LAYOUT, semconv.ATTR_MINDFORMERS_VERSION: importlib.metadata.version("mindformers")}


def _assert_layout(receiver, layout: dict) -> None:
    assert receiver.wait_for(lambda r: r.spans(semconv.SPAN_RUN) and r.points(semconv.JOB_INFO.name))
    (run_span,) = receiver.spans(semconv.SPAN_RUN)
    points = receiver.points(semconv.JOB_INFO.name)
    for point in points:
        assert point.value == 1
        assert point.attributes[semconv.ATTR_RANK] == 0
        assert {key: point.attributes.get(key) for key in layout} == layout, point.attributes
    assert {key: run_span.attributes.get(key) for key in layout} == layout, run_span.attributes


@pytest.mark.mindformers
def test_code_path_trainer_run_exports_its_layout_on_the_job_info_metric(workdir, otlp_receiver):
    _trainer_files(workdir, otlp_receiver, zero_code=False)
    run([*CPU_RUNNER, "train.py"], child_env(), workdir)
    _assert_layout(otlp_receiver, _trainer_layout())


@pytest.mark.mindformers
def test_zero_code_trainer_run_exports_its_layout_on_the_job_info_metric(workdir, otlp_receiver):
    _trainer_files(workdir, otlp_receiver, zero_code=True)
    run(instrumented(*CPU_RUNNER, "train.py"), child_env(otlp_receiver), workdir)
    _assert_layout(otlp_receiver, _trainer_layout())


def test_zero_code_model_train_exports_its_parallel_mode(workdir, otlp_receiver):
    run(instrumented("python", PLAIN_TRAIN, "--steps", "4"), child_env(otlp_receiver), workdir)
    _assert_layout(otlp_receiver, PLAIN_LAYOUT)


def test_code_path_model_train_exports_its_parallel_mode(workdir, otlp_receiver):
    (workdir / "monitor.yaml").write_text(
        json.dumps(
            {
                "monitor_config": {
                    "interval": 1,
                    "output_type": ["otlp"],
                    "otlp": {"endpoint": otlp_receiver.grpc_endpoint, "protocol": "grpc"},
                }
            }
        )
    )
    run(["python", "-m", "tests.support.trainer_process", "monitor.yaml", "--steps", "4"], child_env(), workdir)
    _assert_layout(otlp_receiver, PLAIN_LAYOUT)


@pytest.mark.mindformers
def test_zero_code_trainer_refuses_to_train_with_an_invalid_monitor_config(workdir, otlp_receiver):
    """docs/zero_code.md: one bad key in OTEL_PYTHON_MINDFORMERS_CONFIG is said at start-up
    and stops the Trainer's run before its first step, as `Model.train`'s (test_instrumentor)."""
    import subprocess

    _trainer_files(workdir, otlp_receiver, zero_code=True)
    (workdir / "bad.yaml").write_text("monitor_config:\n  logs: {enable: true, levle: INFO}\n")
    env = child_env(otlp_receiver, OTEL_PYTHON_MINDFORMERS_CONFIG=str(workdir / "bad.yaml"))
    done = subprocess.run(
        instrumented(*CPU_RUNNER, "train.py"), env=env, cwd=workdir, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0
    refusal = f"OTEL_PYTHON_MINDFORMERS_CONFIG={workdir / 'bad.yaml'} is invalid, so training is refused"
    assert done.stderr.count(refusal) >= 2, done.stderr[-3000:]  # logged at start, raised by the run
    assert "monitor_config.logs.levle: unknown key (did you mean 'level'?)" in done.stderr
    assert "ConfigError" in done.stderr
    assert not list(workdir.rglob("train_metric*.json"))  # no step ran under our callback
