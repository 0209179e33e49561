"""Under `opentelemetry-instrument`, a failing collector is reported and bounded as on the code path.

The SDK's own providers (built from OTEL_*) export there: their failures make the same one
warning as ours, exit waits `shutdown_timeout` rather than the exporters' own timeout and
retries, and settings of `monitor_config` that the SDK's environment overrides are named
once at start.
"""

from __future__ import annotations

import json
import re

import pytest

from otel_mindformers.names import semconv
from tests.support.blackhole import Blackhole
from tests.support.instrumented import child_env, free_port, instrumented, run
from tests.support.paths import PLAIN_TRAIN

# real training under opentelemetry-instrument
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api]

SHUTDOWN_TIMEOUT = 1.0
EXPORT_TIMEOUT = 30  # OTEL_EXPORTER_OTLP_TIMEOUT, seconds: what exit must not wait for

# plain_train.py, then the wall time at which training ended.
TIMED_TRAIN = f"""
import runpy, sys, time
sys.argv = [{str(PLAIN_TRAIN)!r}, "--steps", "6"]
runpy.run_path(sys.argv[0], run_name="__main__")
print("TRAINED", time.time(), flush=True)
"""

SDK_NOISE = ("Transient error", "Failed to export", "Exception while exporting", "Queue full")


def _train(workdir, endpoint: str, monitor_config: dict, **env: str):
    (workdir / "monitor.yaml").write_text(json.dumps({"monitor_config": monitor_config}))
    (workdir / "timed_train.py").write_text(TIMED_TRAIN)
    result = run(
        instrumented("python", "timed_train.py"),
        child_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_PYTHON_MINDFORMERS_CONFIG=str(workdir / "monitor.yaml"),
            OTEL_METRIC_EXPORT_INTERVAL="200",
            OTEL_BSP_SCHEDULE_DELAY="100",
            **env,
        ),
        workdir,
    )
    return result


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("otel_mindformers:")]


def _quiet(**overrides) -> dict:
    return {
        "interval": 1,
        "output_type": ["json_file"],
        "grad_monitor": False,
        "shutdown_timeout": SHUTDOWN_TIMEOUT,
        # A loaded host's data wait would add the stragglers' input-bound warning to ours.
        "stragglers": {"signal": False},
        **overrides,
    }


@pytest.mark.parametrize("collector", ["down", "blackholed"])
def test_a_failing_collector_is_one_warning_and_exit_waits_the_shutdown_timeout(workdir, collector):
    import time

    hole = Blackhole() if collector == "blackholed" else None
    try:
        endpoint = f"http://127.0.0.1:{hole.port if hole else free_port()}"
        result = _train(workdir, endpoint, _quiet(), OTEL_EXPORTER_OTLP_TIMEOUT=str(EXPORT_TIMEOUT))
        exited = time.time()
    finally:
        if hole is not None:
            hole.close()
    assert "training finished" in result.stdout
    (trained,) = [float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("TRAINED")]
    # Our bounded flush plus interpreter teardown; never the exporters' 30 s timeout and retries.
    assert exited - trained < SHUTDOWN_TIMEOUT + 10.0, result.stderr[-3000:]
    (warning,) = _ours(result.stderr)
    assert f"OTLP export to {endpoint}" in warning
    assert not [
        line for line in result.stderr.splitlines() if line != warning and any(noise in line for noise in SDK_NOISE)
    ]
    # The local output is complete whatever the collector does.
    lines = (workdir / "output" / "train_metric.json").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6]


def test_a_healthy_collector_gets_everything_and_nothing_is_said(workdir, otlp_receiver):
    result = _train(workdir, otlp_receiver.grpc_endpoint, _quiet())
    assert _ours(result.stderr) == []
    assert otlp_receiver.wait_for(lambda rx: len(rx.spans(semconv.SPAN_STEP)) == 6)
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in otlp_receiver.spans(semconv.SPAN_STEP)) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("outputs", [["json_file", "otlp", "prometheus"], ["stdout", "prometheus"]])
def test_settings_the_sdk_environment_overrides_are_named_once(workdir, otlp_receiver, outputs):
    # The otlp section is named with or without `otlp` in output_type: the SDK's exporters
    # send everything where its environment says, never where the section says.
    port = free_port()
    result = _train(
        workdir,
        otlp_receiver.grpc_endpoint,
        _quiet(
            output_type=outputs,
            service_name="from-yaml",
            otlp={"endpoint": "http://127.0.0.1:1", "protocol": "http/protobuf"},
            prometheus={"port": port},
        ),
    )
    (notice,) = [line for line in _ours(result.stderr) if "ignored" in line]
    for named in (
        "output_type 'prometheus'",
        "OTEL_METRICS_EXPORTER=prometheus",
        "otlp section",
        "OTEL_EXPORTER_OTLP_",
        "service_name",
        "OTEL_SERVICE_NAME",
    ):
        assert named in notice
    # The SDK's environment is what counts: spans reached its endpoint, under its service name.
    assert otlp_receiver.wait_for(lambda rx: rx.spans(semconv.SPAN_RUN))
    (run_span,) = otlp_receiver.spans(semconv.SPAN_RUN)
    assert run_span.resource["service.name"] != "from-yaml"


def test_a_plain_config_under_zero_code_names_nothing(workdir, otlp_receiver):
    result = _train(workdir, otlp_receiver.grpc_endpoint, _quiet(output_type=["json_file", "otlp"]))
    assert not [line for line in _ours(result.stderr) if re.search("ignored", line)]


def test_a_plain_script_with_no_configuration_hears_nothing(workdir, otlp_receiver):
    """No monitor_config at all: the defaults must not warn about what nobody asked for
    (a plain network returns no gradient norm)."""
    result = run(instrumented("python", str(PLAIN_TRAIN), "--steps", "3"), child_env(otlp_receiver), workdir)
    assert "training finished" in result.stdout
    assert _ours(result.stderr) == []
