"""Real 2-rank msrun jobs exporting to real OTLP receivers: one trace per sampled step across
the ranks, under one root; a resumed attempt's steps in new traces; and what each rank sends
under each export strategy (`export_ranks`).

Three msrun runs in all, shared by the assertions: attempt 1 of a job (crashes at step 15)
and attempt 2 (resumes from the step-10 checkpoint), each to its own receiver; and one job of
its own for the remaining strategies."""

from __future__ import annotations

import json
import subprocess

import pytest

from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import PHASE_DURATION
from otel_mindformers.telemetry.export_ranks import rank_share
from tests.support import restart_worker
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.job_traces import job_step_traces
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api, pytest.mark.msrun_job]

WORKER = REPO / "tests" / "support" / "msrun_restart_worker.py"
STEPS = 10  # per epoch and rank
# What every rank sends whatever `export_ranks.metrics` says (the job's view of each rank).
KEPT = {"mindformers.rank.section.time", "mindformers.progress.step", "mindformers.job.info"}
TRAINING = {spec.name for spec in tm.INSTRUMENTS} | {PHASE_DURATION.name}
# The fraction that picks exactly one of ranks 0 and 1 (the one whose hash is lower).
ONE_OF_TWO = (rank_share(0) + rank_share(1)) / 2
PICKED_BY_ONE_OF_TWO = min((0, 1), key=rank_share)


def _msrun(workdir, spec: dict) -> subprocess.CompletedProcess:
    command = [
        str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--join=True",
        f"--log_dir={workdir / 'msrun_log'}", str(WORKER), json.dumps(spec),
    ]  # fmt: skip
    return subprocess.run(command, cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=600)


def _logs(workdir) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted((workdir / "msrun_log").glob("*.log")))


def _config(receiver: OtlpReceiver, **extra) -> dict:
    return {
        "interval": 5, "output_type": ["json_file", "otlp"], "json_log_path": "./output/train_metric.json",
        "restarts": {"heartbeat_interval": 0.1},
        "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc", "export_interval": 0.2}, **extra,
    }  # fmt: skip


def _sent(receiver: OtlpReceiver, rank: int) -> set[str]:
    """The metric names rank `rank` sent."""
    return {p.metric for p in receiver.points() if p.resource.get(semconv.ATTR_RANK) == rank}


@pytest.fixture(scope="module")
def attempts():
    """Attempt 1: every rank sends spans, `metrics: report_ranks` with `report_ranks: [1]`;
    it crashes at step 15. Attempt 2 resumes from step 10 with `metrics` a fraction that picks
    one rank. The receivers hold what each attempt sent."""
    with restart_worker.private_dir() as workdir, OtlpReceiver() as first, OtlpReceiver() as second:
        export = {"spans": "all", "metrics": "report_ranks"}
        spec = {"epochs": 2, "steps": STEPS, "crash_at": 15}
        crashed = _msrun(workdir, {**spec, "config": _config(first, report_ranks=[1], export_ranks=export)})
        assert crashed.returncode != 0 and "injected crash at step 15" in _logs(workdir)
        export = {"spans": "all", "metrics": ONE_OF_TWO}
        resumed = _msrun(workdir, {"epochs": 2, "steps": STEPS, "initial_epoch": 1,
                                   "config": _config(second, report_ranks="all", export_ranks=export)})  # fmt: skip
        assert resumed.returncode == 0, _logs(workdir)
        ledger = json.loads((workdir / "output" / "train_metric.job.rank_0.ledger").read_text())
        yield first, second, ledger["job_id"]


@pytest.fixture(scope="module")
def outside_ranks():
    """A job where only rank 1 sends step spans (`spans: [1]`) and only the first rank of the
    node its training metrics (`metrics: first_per_node`)."""
    with restart_worker.private_dir() as workdir, OtlpReceiver() as receiver:
        export = {"spans": [1], "metrics": "first_per_node"}
        done = _msrun(workdir, {"epochs": 1, "steps": STEPS, "config": _config(receiver, export_ranks=export)})
        assert done.returncode == 0, _logs(workdir)
        yield receiver


def test_every_sampled_step_is_one_trace_of_both_ranks_under_its_root(attempts):
    first, second, job_id = attempts
    for attempt, receiver, steps in ((1, first, [1, 5, 10, 15]), (2, second, [11, 15, 20])):
        traces = job_step_traces(receiver)
        assert sorted(trace.step for trace in traces.values()) == steps, f"attempt {attempt}: one trace per step"
        for trace in traces.values():
            assert trace.ranks == [0, 1], (attempt, trace.step, trace.ranks)
            assert trace.under_its_root(), (attempt, trace.step)
            (root,) = trace.roots
            assert root.resource[semconv.ATTR_RANK] == 0, "the lowest rank that sends step spans emits the root"
            assert (root.attributes[semconv.ATTR_STEP], root.attributes["training.job.attempt"]) == (
                trace.step,
                attempt,
            )
            assert root.attributes[semconv.ATTR_JOB_ID] == job_id
            # Each rank's step span still links to its own run span.
            runs = {(s.resource[semconv.ATTR_RANK], s.span_id) for s in receiver.spans(semconv.SPAN_RUN)}
            assert {(s.resource[semconv.ATTR_RANK], s.links[0][1]) for s in trace.steps} <= runs


def test_a_resumed_attempts_steps_are_in_new_traces(attempts):
    first, second, _ = attempts
    before, after = job_step_traces(first), job_step_traces(second)
    assert not set(before) & set(after)
    # Step 15 ran in both attempts, in the same window (10, 15]: two traces, one per attempt.
    assert [t.step for t in before.values()].count(15) == 1 and [t.step for t in after.values()].count(15) == 1


def test_metrics_report_ranks_and_a_fraction_send_training_series_from_their_ranks_only(attempts):
    first, second, _ = attempts
    for receiver, senders in ((first, {1}), (second, {PICKED_BY_ONE_OF_TWO})):
        for rank in (0, 1):
            sent = _sent(receiver, rank)
            assert sent >= KEPT, (rank, KEPT - sent)
            assert bool(sent & TRAINING) == (rank in senders), (rank, sorted(sent & TRAINING))


def test_spans_of_listed_ranks_and_metrics_of_the_first_rank_of_each_node(outside_ranks):
    receiver = outside_ranks
    traces = job_step_traces(receiver)
    assert sorted(trace.step for trace in traces.values()) == [1, 5, 10]
    for trace in traces.values():
        assert trace.ranks == [1], "rank 0 is outside `spans`: no step span of a healthy step"
        assert trace.under_its_root()
        assert trace.roots[0].resource[semconv.ATTR_RANK] == 1, "rank 1 is the lowest rank of `spans`"
    assert {s.resource[semconv.ATTR_RANK] for s in receiver.spans(semconv.SPAN_RUN)} == {0, 1}
    assert bool(_sent(receiver, 0) & TRAINING) and not _sent(receiver, 1) & TRAINING
    assert _sent(receiver, 1) >= KEPT
