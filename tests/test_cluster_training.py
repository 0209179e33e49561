"""MindCluster's ClusterD heard and told by real trainings (docs/mindcluster.md).

A ClusterD on 127.0.0.1 (tests/support/clusterd.py: the fault and public-fault services from
the stubs of ClusterD's .proto files), a real OTLP receiver, and the Ascend Operator's
variables (MINDX_TASK_ID, MINDX_SERVER_IP, NODE_NAME, ASCEND_VISIBLE_DEVICES) set:

- a 2-rank msrun job: rank 0 alone subscribes; a fault signal sent mid-run lands on rank 0's
  run span, log and counter; rank 1's own loss goes NaN three times (its device, the others'
  parameters untouched) and ClusterD gets one public fault with rank 1's node and NPU, then
  its recover;
- one rank, ClusterD down at start, then up, sending garbage, killed, back answering slowly:
  training completes, each problem is one warning, no thread of the package is left; a stall
  is told as `stalled_rank` and recovered; MindSpore's SDC line in its log is an alert;
- one rank killed (SIGKILL) right after ClusterD's fault: `report` and its HTML page say the
  attempt ended by it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_mindformers.names import cluster_names as names
from otel_mindformers.names import semconv
from tests.support.clusterd import ClusterD, fault_signal, told
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api]

JOB = "mindx-llama-0042"
NODE = "ascend-node-7"
WAIT = 120.0
# What the Ascend Operator, the downward API and the device plugin put into the container.
OPERATOR = {
    "MINDX_TASK_ID": JOB,
    "MINDX_SERVER_IP": "127.0.0.1",
    "MINDX_SERVER_DOMAIN": "clusterd-grpc-svc.mindx-dl.svc.cluster.local",
    "NODE_NAME": NODE,
    "ASCEND_VISIBLE_DEVICES": "4-5",
}


def _config(workdir: Path, receiver: OtlpReceiver, port: int, **sections) -> Path:
    monitor = {
        "interval": 1,
        "output_type": ["json_file", "otlp"],
        "json_log_path": str(workdir / "output" / "train_metric.json"),
        "otlp": {"endpoint": receiver.grpc_endpoint, "insecure": True, "export_interval": 0.5},
        "cluster": {"port": port, "timeout": 0.5, "retry_max": 0.5, **sections.pop("cluster", {})},
        **sections,
    }
    path = workdir / "monitor.yaml"
    path.write_text(yaml.safe_dump({"monitor_config": monitor}))
    return path


def _log(workdir: Path) -> str:
    path = workdir / "trainer.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _spawn(workdir: Path, config: Path, **env: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "tests.support.cluster_worker", str(config),
        "--stop-file", str(workdir / "stop"), "--pause-file", str(workdir / "pause"),
    ]  # fmt: skip
    # Appending, as the test writes MindSpore's lines into it too: a child writing at its own
    # offset would overwrite a line the test appended past it before the watcher read it.
    with (workdir / "trainer.log").open("ab") as log:
        return subprocess.Popen(
            argv, cwd=workdir, env=child_env(**OPERATOR, **env), stdout=log, stderr=subprocess.STDOUT
        )


def _lines(workdir: Path) -> list[str]:
    path = workdir / "output" / "train_metric.json"
    return path.read_text().splitlines() if path.exists() else []


def _cli(*args: str) -> str:
    result = subprocess.run(
        [str(BIN / "otel-mindformers"), *args], capture_output=True, text=True, timeout=120, env=child_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# --- a 2-rank msrun job ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def msrun_job(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster_msrun")
    with OtlpReceiver() as receiver, ClusterD(jobs={JOB}) as clusterd:
        config = _config(workdir, receiver, clusterd.port, report_ranks="all", cluster={"tell": True})
        stop_file = workdir / "stop_at"
        command = [
            str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
            "--join=True", f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "cluster_msrun_worker.py"), str(config), str(stop_file),
            "--nan-rank", "1", "--nan-at", "4,7,10",
        ]  # fmt: skip
        job = subprocess.Popen(
            command, env=child_env(**OPERATOR), cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: clusterd.subscribed(), "rank 0's subscription", job, WAIT)
            assert clusterd.send(fault_signal(JOB, "worker-3", "3", ["80818C00"], ["SeparateNPU"])) == 1
            ledger = workdir / "output" / "train_metric.job.rank_0.ledger"
            wait_until(lambda: "cluster_fault" in ledger.read_text(), "rank 0 heard the fault", job, WAIT)
            wait_until(lambda: len(clusterd.public_faults) >= 2, "rank 1's occur and recover", job, WAIT)
            lines = (workdir / "output" / "train_metric_rank_0.json").read_text().splitlines()
            # Both ranks stop together at the first step end past this one, however late either
            # reads the file (msrun_job.StopAtWrittenStep decides by an all-reduce).
            stop_file.write_text(str(json.loads(lines[-1])["step"] + 40))
            output, _ = job.communicate(timeout=WAIT)
            assert job.returncode == 0, output[-4000:]
            receiver.wait_for(lambda r: len(r.spans(semconv.SPAN_RUN)) == 2)
            yield workdir, receiver, clusterd
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()


@pytest.mark.msrun_job
def test_one_rank_of_the_job_subscribes_and_a_fault_lands_on_its_run_span_log_and_counter(msrun_job):
    workdir, receiver, clusterd = msrun_job
    assert clusterd.registrations == [(JOB, "otel-mindformers")] == clusterd.subscriptions
    runs = {span.resource[semconv.ATTR_RANK]: span for span in receiver.spans(semconv.SPAN_RUN)}
    faults = [attrs for name, attrs in runs[0].events if name == names.EVENT_FAULT]
    assert len(faults) == 1 and not any(name == names.EVENT_FAULT for name, _ in runs[1].events)
    assert {key: faults[0][key] for key in (names.ATTR_FAULT_LEVEL, names.ATTR_NODE_NAME, names.ATTR_DEVICE_ID)} == {
        names.ATTR_FAULT_LEVEL: "SeparateNPU", names.ATTR_NODE_NAME: "worker-3", names.ATTR_DEVICE_ID: "3",
    }  # fmt: skip
    codes = [value["stringValue"] for value in faults[0][names.ATTR_FAULT_CODES]["values"]]  # an OTLP array
    assert codes == ["80818C00"] and faults[0]["time"] > 0
    bodies = [log.body for log in receiver.logs() if log.attributes.get(names.ATTR_FAULT_LEVEL)]
    assert bodies == ["ClusterD: node worker-3, NPU 3, SeparateNPU, 80818C00"]
    points = receiver.points(names.CLUSTER_FAULTS.name)  # cumulative: every export repeats the total
    assert {(p.attributes[semconv.ATTR_RANK], p.attributes[names.ATTR_FAULT_LEVEL], p.value) for p in points} == {
        (0, "SeparateNPU", 1)
    }


@pytest.mark.msrun_job
def test_a_rank_whose_own_loss_goes_nan_three_times_is_told_once_with_its_node_and_npu_then_recovered(msrun_job):
    workdir, receiver, clusterd = msrun_job
    sent = told(clusterd)
    assert [(assertion, code, node, devices, rank) for _, assertion, code, node, devices, rank in sent] == [
        ("occur", "010011001", NODE, (5,), "1"),  # rank 1 is DEVICE_ID 1: the second of NPUs 4-5
        ("recover", "010011001", NODE, (5,), "1"),
    ]
    assert sent[0][0] == sent[1][0] and clusterd.refused == []
    (occur, recover) = [f for request in clusterd.public_faults for f in request.faults]
    assert occur.faultLocation["step"] == "10" and recover.faultLocation["step"] == "13"
    assert occur.faultTime == recover.faultTime and occur.faultType == "NPU"
    # On the run span and the counter of rank 1, none on rank 0.
    runs = {span.resource[semconv.ATTR_RANK]: span for span in receiver.spans(semconv.SPAN_RUN)}
    told_events = [attrs[names.ATTR_ASSERTION] for name, attrs in runs[1].events if name == names.EVENT_PUBLIC_FAULT]
    assert told_events == ["occur", "recover"] and not any(n == names.EVENT_PUBLIC_FAULT for n, _ in runs[0].events)
    # rank 1's own loss: NaN at the injected steps only (the parameters never took it).
    rank1 = [json.loads(line) for line in (workdir / "output" / "train_metric_rank_1.json").read_text().splitlines()]
    assert [line["step"] for line in rank1 if line.get("nonfinite")] == [4, 7, 10]
    rank0 = [json.loads(line) for line in (workdir / "output" / "train_metric_rank_0.json").read_text().splitlines()]
    assert not any(line.get("nonfinite") for line in rank0)


# --- one rank, a ClusterD that misbehaves ---------------------------------------------------------------
STRIKEOUT = (
    "[WARNING] DEBUG({pid},fffda37fe1e0,python):2026-12-05-10:47:18.112.011 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:356] DetectStrikeout] Feature value detection strikes "
    "out on rank 0, strikes_num: 3, CheckSum will be enabled globally.\n"
)


@pytest.fixture(scope="module")
def troubled_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster_troubled")
    # The port is held, bound but not listening (a connection is refused, as to a ClusterD that
    # is down), until ClusterD starts on it: no other process on this shared host takes it.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    with OtlpReceiver() as receiver:
        config = _config(
            workdir, receiver, port, cluster={"tell": True, "min_interval": 0, "preflight": True},
            alert_config={"enable_alert": True, "stall_timeout": 1.0, "stop_on_nonfinite": False},
        )  # fmt: skip
        # ClusterD down at start; MindSpore's feature-value detection on (its lines go to stderr).
        process = _spawn(workdir, config, NPU_ASD_ENABLE="1", DEVICE_ID="1")
        clusterd = first = ClusterD(jobs={JOB}, port=port)
        try:
            try:
                wait_until(lambda: "ClusterD unreachable" in _log(workdir), "the warning while down", process, WAIT)
                held.close()
                clusterd.start()
                wait_until(lambda: clusterd.subscribed(), "the subscription once up", process, WAIT)
                clusterd.send_garbage()
                clusterd.send(fault_signal(JOB, "worker-3", "3", ["80E21007"], ["NotHandleFault"], state="Healthy"))
                wait_until(
                    lambda: "ClusterD reports a fault" in _log(workdir), "the fault after the garbage", process, WAIT
                )
                with (workdir / "trainer.log").open("a") as log:  # MindSpore's C++ log line, as it writes it
                    log.write(STRIKEOUT.format(pid=process.pid))
                wait_until(lambda: "detection (strikeout)" in _log(workdir), "the SDC alert", process, WAIT)
                (workdir / "pause").write_text("")  # the rank stalls past stall_timeout
                wait_until(lambda: told(clusterd), "the stall told", process, WAIT)
                (workdir / "pause").unlink()
                wait_until(lambda: len(told(clusterd)) == 2, "the stall recovered", process, WAIT)
                clusterd.stop()  # killed mid-stream
                wait_until(lambda: "broke the fault stream" in _log(workdir), "the broken stream", process, WAIT)
                first, clusterd = clusterd, ClusterD(jobs={JOB}, port=port, slow_register=2.0).start()
                wait_until(lambda: "no answer within" in _log(workdir), "the slow answer", process, WAIT)
                clusterd.slow_register = 0.0
                wait_until(lambda: clusterd.subscribed(), "subscribed again", process, WAIT)
                (workdir / "stop").write_text("")
                assert process.wait(timeout=WAIT) == 0, _log(workdir)[-4000:]
                receiver.wait_for(lambda r: r.spans(semconv.SPAN_RUN))
            except AssertionError as failed:  # with what the training said
                raise AssertionError(f"{failed}\n--- the training's log ---\n{_log(workdir)[-6000:]}") from None
            yield workdir, receiver, first  # the ClusterD that was up while the stall came and went
        finally:
            held.close()
            clusterd.stop()
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_misbehaving_clusterd_is_one_warning_each_and_training_completes_without_a_thread_left(troubled_run):
    workdir, _, _ = troubled_run
    log = _log(workdir)
    warnings = [line for line in log.splitlines() if "hearing ClusterD's faults: ClusterD" in line]
    for problem in ("ClusterD unreachable", "does not parse", "broke the fault stream", "no answer within the timeout"):
        assert sum(problem in line for line in warnings) == 1, (problem, warnings)
    assert len(warnings) == 4 and all("training is not affected" in line for line in warnings)
    assert "trained to step" in log
    # No traceback through the package. (MindSpore 2.10 under numpy 2 prints numpy's "compiled
    # using NumPy 1.x" notice as a traceback of its own, from the network's first call.)
    assert not re.findall(r'File "[^"]*/otel_mindformers/', log), log[-6000:]
    (threads,) = [line for line in log.splitlines() if line.startswith("threads after training: ")]
    assert "otel-mindformers" not in threads, threads
    # The pre-flight check asked for on a CPU host: one clear line, training went on.
    (preflight,) = [line for line in log.splitlines() if "pre-flight check" in line]
    assert "not available here: MindSpore's stress test needs an Ascend device" in preflight


def test_a_stalled_rank_is_told_and_recovered_and_mindspores_sdc_line_is_an_alert(troubled_run):
    workdir, receiver, clusterd = troubled_run
    sent = told(clusterd)
    assert [(assertion, code, node, devices, rank) for _, assertion, code, node, devices, rank in sent] == [
        ("occur", "010011003", NODE, (5,), "0"),
        ("recover", "010011003", NODE, (5,), "0"),
    ]
    (run,) = receiver.spans(semconv.SPAN_RUN)
    assert run.resource[names.ATTR_ASD_ENABLED] is True and run.resource[names.ATTR_ASD_NPU_ASD_ENABLE] == "1"
    (check,) = receiver.spans(names.SPAN_PREFLIGHT)
    assert check.attributes[names.ATTR_PREFLIGHT_RESULT] == "not_available" and check.parent_span_id == run.span_id
    (detected,) = [attrs for name, attrs in run.events if name == names.EVENT_ASD]
    assert (detected[names.ATTR_ASD_KIND], detected[names.ATTR_ASD_RANK]) == ("strikeout", 0)
    alerts = [log for log in receiver.logs() if log.attributes.get(semconv.ATTR_ALERT_RULE) == names.ALERT_RULE_SDC]
    assert len(alerts) == 1 and "Feature value detection strikes out on rank 0" in alerts[0].body
    points = receiver.points(names.ASD_DETECTIONS.name)  # cumulative: every export repeats the total
    assert {(p.attributes[names.ATTR_ASD_KIND], p.value) for p in points} == {("strikeout", 1)}
    # The fault heard after the garbage, on the span with its level from ClusterD.
    (fault,) = [attrs for name, attrs in run.events if name == names.EVENT_FAULT]
    assert fault[names.ATTR_FAULT_LEVEL] == "NotHandleFault"


# --- one rank killed right after ClusterD's fault -----------------------------------------------------
@pytest.mark.analysis
def test_the_attempt_a_clusterd_fault_ended_is_named_by_report_and_its_html_page(tmp_path):
    with OtlpReceiver() as receiver, ClusterD(jobs={JOB}) as clusterd:
        config = _config(tmp_path, receiver, clusterd.port)
        process = _spawn(tmp_path, config)
        try:
            wait_until(lambda: clusterd.subscribed(), "the subscription", process, WAIT)
            wait_until(lambda: len(_lines(tmp_path)) >= 5, "five steps logged", process, WAIT)
            clusterd.send(fault_signal(JOB, "worker-3", "3", ["80818C00"], ["SeparateNPU"]))
            ledger = tmp_path / "output" / "train_metric.job.rank_0.ledger"
            wait_until(lambda: "cluster_fault" in ledger.read_text(), "the fault in the ledger", process, WAIT)
            os.kill(process.pid, signal.SIGKILL)  # what ClusterD's restart does to a pod's process
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = _cli("report", str(tmp_path / "output"))
    (line,) = [line.strip() for line in text.splitlines() if "ended: node" in line]
    assert line.startswith("attempt 1 ended: node worker-3, NPU 3, SeparateNPU, 80818C00, ")
    assert line.endswith(" s before its last heartbeat") or line.endswith(" s after its last heartbeat")
    job = json.loads(_cli("report", str(tmp_path / "output"), "--json"))["job"]
    assert job["attempts"][0]["outcome"] == "killed" and job["attempts"][0]["cluster_fault"]["codes"] == ["80818C00"]
    page = tmp_path / "run.html"
    _cli("report", str(tmp_path / "output"), "--html", str(page))
    from tests.support.html_dom import parse

    (row,) = parse(page.read_text()).all("tr", "attempt")
    cells = [cell.text() for cell in row.all("td")]
    assert cells[4].startswith("killed; ClusterD: node worker-3, NPU 3, SeparateNPU, 80818C00, "), cells
