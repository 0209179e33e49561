"""End to end through a real OTLP collector: a MindSpore training exports OTLP to `rotel`
(a Rust OTel collector from PyPI), which batches and forwards it, gzip-compressed, to a
real OTLP receiver. The rank attributes must survive the hop."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support import trainer_process
from tests.support.backends import unavailable
from tests.support.prometheus import free_port, stop_process

RANK, WORLD = 3, 4
STEPS, INTERVAL = 12, 5


pytestmark = [pytest.mark.slow, pytest.mark.integration]  # real training against a backend process


def rotel_binary() -> str:
    try:
        from rotel.agent import Agent
    except ImportError:
        unavailable("rotel is not installed (pip install rotel)")
    return str(Agent.agent_path)


def _wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rotel exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"rotel did not listen on {port} within {timeout:.0f} s")


@contextmanager
def rotel(workdir: Path, exporter_protocol: str, exporter_endpoint: str) -> Iterator[int]:
    """rotel in the foreground on 127.0.0.1; yields its OTLP gRPC port."""
    grpc_port, http_port = free_port(), free_port()
    log = workdir / "rotel.log"
    argv = [
        rotel_binary(),
        "start",
        "--otlp-grpc-endpoint",
        f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint",
        f"127.0.0.1:{http_port}",
        "--exporter",
        "otlp",
        "--otlp-exporter-endpoint",
        exporter_endpoint,
        "--otlp-exporter-protocol",
        exporter_protocol,
        "--otlp-exporter-compression",
        "gzip",
        "--pid-file",
        str(workdir / "rotel.pid"),
        "--log-file",
        str(log),
    ]
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_listening(grpc_port, process, log)
        yield grpc_port
    finally:
        stop_process(process)


def train_into(workdir: Path, grpc_port: int) -> None:
    config = workdir / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "interval": INTERVAL,
                    "output_type": ["otlp"],
                    "report_ranks": "all",
                    "service_name": "rotel-e2e",
                    "otlp": {"endpoint": f"http://127.0.0.1:{grpc_port}", "protocol": "grpc", "export_interval": 0.5},
                }
            }
        )
    )
    trainer = trainer_process.spawn(config, workdir, steps=STEPS, env={"RANK_ID": str(RANK), "RANK_SIZE": str(WORLD)})
    assert trainer.wait(timeout=180) == 0, trainer_process.log_tail(workdir)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_spans_and_metrics_keep_their_rank_through_rotel(tmp_path, otlp_receiver, protocol):
    forward_to = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    with rotel(tmp_path, protocol, forward_to) as grpc_port:
        train_into(tmp_path, grpc_port)
        # Sampled steps: the first, every INTERVAL-th and the last.
        expected_steps = {1, *range(INTERVAL, STEPS + 1, INTERVAL), STEPS}
        arrived = otlp_receiver.wait_for(
            lambda rx: (
                {s.attributes.get(semconv.ATTR_STEP) for s in rx.spans(semconv.SPAN_STEP)} >= expected_steps
                and rx.spans(semconv.SPAN_RUN)
                and rx.points(tm.instrument_name(tm.LOSS))
            ),
            timeout=30,
        )
    assert arrived, f"received spans: {[s.name for s in otlp_receiver.spans()]}\n{trainer_process.log_tail(tmp_path)}"

    (run,) = otlp_receiver.spans(semconv.SPAN_RUN)
    steps = otlp_receiver.spans(semconv.SPAN_STEP)
    for span in [run, *steps]:
        assert span.resource[semconv.ATTR_RANK] == RANK
        assert span.resource[semconv.ATTR_WORLD_SIZE] == WORLD
        assert span.resource["service.name"] == "rotel-e2e"
    instance_ids = {span.resource["service.instance.id"] for span in [run, *steps]}
    assert len(instance_ids) == 1, "the rank's stable instance id changed on the way"
    # One trace per step, linked back to the run span.
    for span in steps:
        assert span.links == [(run.trace_id, run.span_id)]
        assert span.trace_id != run.trace_id
    loss_points = otlp_receiver.points(tm.instrument_name(tm.LOSS))
    assert all(p.attributes[semconv.ATTR_RANK] == RANK for p in loss_points)
    assert all(p.resource[semconv.ATTR_RANK] == RANK for p in loss_points)
