"""Who the job is: the parallel layout (MindSpore's auto-parallel context, MindFormers'
parallel_config) and the software versions, as resource attributes."""

import mindspore
import pytest
import yaml

from otel_mindformers.job import layout, versions
from otel_mindformers.job.identity import detect_identity
from otel_mindformers.job.layout import record_mindformers_run
from otel_mindformers.names import semconv
from tests.support.instrumented import child_env, run
from tests.support.mindformers_trainer import CPU_RUNNER, write_trainer
from tests.support.paths import REFERENCE_YAML


@pytest.fixture(autouse=True)
def no_recorded_run(monkeypatch, tmp_path):
    monkeypatch.setattr(layout, "_mindformers_run", {})
    monkeypatch.setattr(versions, "ASCEND_HOME", tmp_path / "Ascend")  # no CANN on this machine
    yield
    mindspore.reset_auto_parallel_context()


def attributes():
    return detect_identity({}).attributes()


def test_mindformers_parallel_config_and_the_global_batch():
    record_mindformers_run(
        {
            "parallel_config": {
                "data_parallel": 4,
                "model_parallel": 2,
                "pipeline_stage": 2,
                "context_parallel": 1,
                "expert_parallel": 8,
                "micro_batch_num": 16,
            },
            "runner_config": {"batch_size": 2, "gradient_accumulation_steps": 4},
            "model": {"model_config": {"seq_length": 4096}},
        }
    )
    attrs = attributes()
    assert {
        key: attrs[key] for key in attrs if key.startswith("training.parallel.") and key != semconv.ATTR_PARALLEL_MODE
    } == {
        semconv.ATTR_PARALLEL_DATA: 4,
        semconv.ATTR_PARALLEL_TENSOR: 2,
        semconv.ATTR_PARALLEL_PIPELINE: 2,
        semconv.ATTR_PARALLEL_CONTEXT: 1,
        semconv.ATTR_PARALLEL_EXPERT: 8,
    }
    assert attrs[semconv.ATTR_MICRO_BATCHES] == 16 and attrs[semconv.ATTR_SEQUENCE_LENGTH] == 4096
    assert attrs[semconv.ATTR_GLOBAL_BATCH_SIZE] == 2 * 4 * 4  # batch x data parallel x accumulation


def test_global_batch_mindformers_already_computed_in_auto_parallel():
    # MindFormers' auto-parallel check keeps the per-device batch as mini_batch_size and
    # writes the global one into batch_size.
    record_mindformers_run(
        {"parallel_config": {"data_parallel": 4}, "runner_config": {"batch_size": 128, "mini_batch_size": 2}}
    )
    assert attributes()[semconv.ATTR_GLOBAL_BATCH_SIZE] == 128


def test_mindspore_auto_parallel_context():
    assert attributes()[semconv.ATTR_PARALLEL_MODE] == "stand_alone"
    assert semconv.ATTR_PARALLEL_DEVICES not in attributes()
    mindspore.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8, pipeline_stages=2)
    attrs = attributes()
    assert (
        attrs[semconv.ATTR_PARALLEL_MODE],
        attrs[semconv.ATTR_PARALLEL_DEVICES],
        attrs[semconv.ATTR_PARALLEL_PIPELINE],
    ) == ("semi_auto_parallel", 8, 2)
    mindspore.set_auto_parallel_context(parallel_mode="data_parallel", device_num=16, pipeline_stages=1)
    assert attributes()[semconv.ATTR_PARALLEL_DATA] == 16


def test_software_versions_from_packages_and_ascend_version_files(tmp_path, monkeypatch):
    # The Ascend files' documented forms (MindCluster's fault-diagnosis guide).
    home = tmp_path / "Ascend"
    for path, text in (
        ("driver/version.info", "Version=24.1.rc1\nascendhal_version=7.35.19\n"),
        ("firmware/version.info", "Version=7.1.0.11.220\nfirmware_version=1.0\n"),
        ("toolkit/ascend_toolkit_install.info", "package_name=Ascend-cann-toolkit\nversion=8.5.0\n"),
    ):
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(text)
    attrs = detect_identity({"ASCEND_TOOLKIT_HOME": str(home / "toolkit")}).attributes()
    assert attrs[semconv.ATTR_MINDSPORE_VERSION] == mindspore.__version__
    assert attrs[semconv.ATTR_MINDFORMERS_VERSION] == "1.9.0"
    assert (
        attrs[semconv.ATTR_CANN_VERSION],
        attrs[semconv.ATTR_DRIVER_VERSION],
        attrs[semconv.ATTR_FIRMWARE_VERSION],
    ) == ("8.5.0", "24.1.rc1", "7.1.0.11.220")
    assert semconv.ATTR_CANN_VERSION not in attributes()  # no file, no attribute


@pytest.mark.slow
def test_a_mindformers_trainer_run_exports_its_layout_on_the_resource(workdir, otlp_receiver):
    document = yaml.safe_load(REFERENCE_YAML.read_text())
    document["parallel_config"] = {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1, "micro_batch_num": 1}
    document["monitor_config"].update(
        output_type=["otlp"], otlp={"endpoint": otlp_receiver.grpc_endpoint, "protocol": "grpc"}
    )
    run([*CPU_RUNNER, write_trainer(workdir, yaml.safe_dump(document), rows=4)], child_env(), workdir)

    (run_span,) = otlp_receiver.spans(semconv.SPAN_RUN)
    resource = run_span.resource
    assert {
        key: resource.get(key)
        for key in (
            semconv.ATTR_PARALLEL_MODE,
            semconv.ATTR_PARALLEL_DATA,
            semconv.ATTR_PARALLEL_TENSOR,
            semconv.ATTR_PARALLEL_PIPELINE,
            semconv.ATTR_MICRO_BATCHES,
            semconv.ATTR_SEQUENCE_LENGTH,
            semconv.ATTR_GLOBAL_BATCH_SIZE,
            semconv.ATTR_MINDFORMERS_VERSION,
        )
    } == {
        semconv.ATTR_PARALLEL_MODE: "stand_alone",
        semconv.ATTR_PARALLEL_DATA: 1,
        semconv.ATTR_PARALLEL_TENSOR: 1,
        semconv.ATTR_PARALLEL_PIPELINE: 1,
        semconv.ATTR_MICRO_BATCHES: 1,
        semconv.ATTR_SEQUENCE_LENGTH: 16,
        semconv.ATTR_GLOBAL_BATCH_SIZE: 2,
        semconv.ATTR_MINDFORMERS_VERSION: "1.9.0",
    }
    assert run_span.attributes[semconv.ATTR_SEQUENCE_LENGTH] == 16  # the run span carries it too
