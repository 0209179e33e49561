"""Distributed runs: rank identity from launchers' environments, and a real 2-rank msrun job
monitored with environment variables alone, correlated with the launcher's trace."""

import json
import os
import re
import subprocess
import urllib.request

import pytest

from otel_mindformers.job.identity import detect_identity
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support.instrumented import (
    BIN,
    LAUNCHER_SPAN_ID,
    REPO,
    TRACE_ID,
    TRACEPARENT,
    child_env,
    free_port,
    free_ports,
    run,
)
from tests.support.job_traces import job_step_traces
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mindspore_api

# What msrun exported to its second worker in a real 2-worker run on one machine.
MSRUN_WORKER_1 = {
    "RANK_ID": "1",
    "RANK_SIZE": "2",
    "DEVICE_ID": "1",
    "MS_WORKER_NUM": "2",
    "MS_NODE_ID": "1",
    "MS_ROLE": "MS_WORKER",
    "MS_SCHED_HOST": "127.0.0.1",
    "MS_SCHED_PORT": "8118",
}


@pytest.mark.parametrize(
    ("environment", "inside"),
    [
        ({"OTEL_METRICS_EXPORTER": "otlp, prometheus", **MSRUN_WORKER_1}, "9465"),
        ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "19464", **MSRUN_WORKER_1}, "19465"),
        ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "0", **MSRUN_WORKER_1}, "0"),
        ({"OTEL_METRICS_EXPORTER": "otlp", **MSRUN_WORKER_1}, None),
        ({"OTEL_METRICS_EXPORTER": "prometheus", "DEVICE_ID": "1"}, None),  # a process alone keeps the port
    ],
)
def test_the_sdks_prometheus_port_moves_by_the_local_rank_for_the_configuration_only(monkeypatch, environment, inside):
    """`OTEL_METRICS_EXPORTER=prometheus` under msrun: worker 1 of a node serves on the port + 1
    while the SDK is configured; the variable is as it was afterwards (its children's)."""
    from otel_mindformers.integration.distro import _prometheus_port_per_rank

    monkeypatch.setattr(os, "environ", dict(environment))
    with _prometheus_port_per_rank():
        assert os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT") == (
            inside or environment.get("OTEL_EXPORTER_PROMETHEUS_PORT")
        )
    assert os.environ == environment


@pytest.mark.slow
def test_msrun_worker_identity():
    identity = detect_identity(MSRUN_WORKER_1)
    assert (identity.rank, identity.world_size, identity.local_rank, identity.device_id, identity.launcher) == (
        1,
        2,
        1,
        1,
        "msrun",
    )
    # MS_NODE_ID is the worker's id in the cluster, not the machine's index.
    assert identity.node_rank is None and semconv.ATTR_NODE_RANK not in identity.attributes()
    # Node-level series then name the machine by its host.
    assert identity.node_attributes() == {"host.name": identity.host_name}


def test_mindcluster_identity():
    env = {
        **MSRUN_WORKER_1,
        "MS_NODE_RANK": "3",
        "MINDX_TASK_ID": "job-42",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "llama-pretrain-worker-3",
        "POD_NAMESPACE": "training",
        "NODE_NAME": "ascend-node-7",
    }
    attributes = detect_identity(env).attributes()
    assert {
        k: attributes[k]
        for k in (
            semconv.ATTR_NODE_RANK,
            semconv.ATTR_JOB_ID,
            semconv.ATTR_LAUNCHER,
            "k8s.pod.name",
            "k8s.namespace.name",
            "k8s.node.name",
        )
    } == {
        semconv.ATTR_NODE_RANK: 3,
        semconv.ATTR_JOB_ID: "job-42",
        semconv.ATTR_LAUNCHER: "mindcluster",
        "k8s.pod.name": "llama-pretrain-worker-3",
        "k8s.namespace.name": "training",
        "k8s.node.name": "ascend-node-7",
    }
    assert detect_identity(env).node_attributes() == {semconv.ATTR_NODE_RANK: 3}


def test_slurm_identity():
    env = {"SLURM_JOB_ID": "7781", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}
    identity = detect_identity(env)
    assert (
        identity.rank,
        identity.world_size,
        identity.local_rank,
        identity.node_rank,
        identity.job_id,
        identity.launcher,
    ) == (5, 8, 1, 2, "7781", "slurm")


def test_kubernetes_attributes_only_inside_kubernetes():
    assert not any(k.startswith("k8s.") for k in detect_identity({"HOSTNAME": "laptop"}).attributes())


def test_ranks_of_one_job_have_distinct_stable_instance_ids(tmp_path, monkeypatch):
    ids = {detect_identity({**MSRUN_WORKER_1, "RANK_ID": str(r)}).instance_id for r in range(4)}
    assert len(ids) == 4
    assert detect_identity(MSRUN_WORKER_1).instance_id == detect_identity(MSRUN_WORKER_1).instance_id
    # No launcher names the job: two jobs on one host, each from its own folder, stay apart;
    # a job restarted from its folder keeps its ids.
    assert "MS_JOB_ID" not in MSRUN_WORKER_1
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    by_folder = {}
    for folder in ("a", "b", "a"):
        monkeypatch.chdir(tmp_path / folder)
        by_folder.setdefault(folder, set()).add(detect_identity(MSRUN_WORKER_1).instance_id)
    assert len(by_folder["a"]) == 1 and by_folder["a"] != by_folder["b"]


@pytest.mark.slow
@pytest.mark.msrun_job
@pytest.mark.msrun_api  # the launcher's environment: every rank knows who it is
def test_two_rank_msrun_job_monitored_with_environment_variables_alone(workdir, otlp_receiver):
    """examples/msrun_train.sh: opentelemetry-instrument around msrun, TRACEPARENT from the launcher."""
    env = child_env(
        otlp_receiver,
        TRACEPARENT=TRACEPARENT,
        OTEL_SERVICE_NAME="msrun-test",
        MASTER_PORT=str(free_port()),
        MSRUN_LOG_DIR=str(workdir / "msrun_log"),
    )
    run([str(REPO / "examples" / "msrun_train.sh"), "--steps", "6"], env, workdir)

    # Every process of the job loaded the `mindformers` resource detector: the SDK logs a
    # detector that fails to import (a circular import did, in every msrun process) and skips it.
    logs = sorted((workdir / "msrun_log").glob("*.log"))
    assert [log.name for log in logs] == ["scheduler.log", "worker_0.log", "worker_1.log"]
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Failed to load resource detector" not in text and "Traceback" not in text, (log.name, text[:3000])

    # Per-rank JSON files; training metrics from rank 0 only, step time and host readings from both.
    output = workdir / "output"
    assert sorted(p.name for p in output.glob("*.json")) == ["train_metric_rank_0.json", "train_metric_rank_1.json"]
    files = {
        rank: [json.loads(line) for line in (output / f"train_metric_rank_{rank}.json").read_text().splitlines()]
        for rank in (0, 1)
    }
    for rank, lines in files.items():
        assert [line["step"] for line in lines] == [1, 2, 4, 6] and {line["rank"] for line in lines} == {rank}
        assert all("train_per_step_time" in line for line in lines)
        # Host readings from every rank (memory from the first poll; CPU needs a window behind it).
        assert any("host_rss_mb" in line for line in lines)
    assert all("loss" in line and "learning_rate" in line for line in files[0])
    assert not any("loss" in line or "learning_rate" in line for line in files[1])

    # Both ranks' run spans are children of the launcher's span, in its trace.
    runs = otlp_receiver.spans(semconv.SPAN_RUN)
    assert sorted(s.resource[semconv.ATTR_RANK] for s in runs) == [0, 1]
    assert {(s.trace_id, s.parent_span_id) for s in runs} == {(TRACE_ID, LAUNCHER_SPAN_ID)}
    # One trace per sampled step, holding both ranks' step spans under the job step's root.
    traces = job_step_traces(otlp_receiver)
    assert sorted(trace.step for trace in traces.values()) == [1, 2, 4, 6]
    assert all(trace.ranks == [0, 1] and trace.under_its_root() for trace in traces.values())
    resources = {s.resource[semconv.ATTR_RANK]: s.resource for s in runs}
    for rank, resource in resources.items():
        assert (
            resource["service.name"],
            resource[semconv.ATTR_WORLD_SIZE],
            resource[semconv.ATTR_LOCAL_RANK],
            resource[semconv.ATTR_DEVICE_ID],
            resource[semconv.ATTR_LAUNCHER],
        ) == ("msrun-test", 2, rank, rank, "msrun")
    assert resources[0]["service.instance.id"] != resources[1]["service.instance.id"]
    # The layout: data parallel over both ranks (the script sets no device_num; init() gives 2).
    for span in runs:
        layout = [
            span.attributes.get(key)
            for key in (semconv.ATTR_PARALLEL_MODE, semconv.ATTR_PARALLEL_DEVICES, semconv.ATTR_PARALLEL_DATA)
        ]
        assert layout == ["data_parallel", 2, 2], layout

    def ranks_of(metric):
        """(resource rank, point rank) of every point of `metric`."""
        points = otlp_receiver.points(metric)
        return {(p.resource[semconv.ATTR_RANK], p.attributes.get(semconv.ATTR_RANK)) for p in points}

    assert ranks_of(tm.instrument_name(tm.LOSS)) == {(0, 0)}
    assert ranks_of(tm.instrument_name(tm.STEP_TIME)) == {(0, 0), (1, 1)}
    assert {rank for rank, _ in ranks_of(semconv.PROCESS_MEMORY_USAGE)} == {0, 1}


def _scraped_ranks(port: int) -> set[str]:
    """The ranks whose heartbeat the scrape endpoint on `port` serves now."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as answer:
            text = answer.read().decode()
    except OSError:
        return set()
    return set(re.findall(r'^mindformers_progress_step\{[^}]*training_rank="(\d+)"', text, re.MULTILINE))


@pytest.mark.slow
@pytest.mark.msrun_job
def test_each_rank_of_a_node_serves_the_sdks_prometheus_exporter_on_its_own_port(workdir):
    """`OTEL_METRICS_EXPORTER=prometheus opentelemetry-instrument msrun ...`, as docs/zero_code.md
    advises for a scrape endpoint: msrun itself took the port first, and every rank that lost it
    skipped every instrumentor ("Failed to auto initialize OpenTelemetry"): no rank was
    monitored. Local rank r serves on the port + r; msrun and its scheduler serve none."""
    port = free_ports(2)
    env = child_env(
        OTEL_METRICS_EXPORTER="prometheus",
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_MINDFORMERS_CONFIG=str(REPO / "examples" / "msrun_monitor.yaml"),
    )
    command = [
        str(BIN / "opentelemetry-instrument"), "msrun", "--worker_num=2", "--local_worker_num=2",
        f"--master_port={free_port()}", "--join=True", f"--log_dir={workdir / 'msrun_log'}",
        str(REPO / "examples" / "msrun_worker.py"), "--steps", "400",
    ]  # fmt: skip
    job = subprocess.Popen(command, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for rank in (0, 1):
            wait_until(lambda r=rank: _scraped_ranks(port + r) == {str(r)}, f"rank {rank} on port + {rank}", job, 240)
        assert job.wait(timeout=240) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    for log in sorted((workdir / "msrun_log").glob("*.log")):
        assert "Failed to auto initialize" not in log.read_text(errors="replace"), log.name
