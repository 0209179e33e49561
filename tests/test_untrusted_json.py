"""JSON that other processes write (logs and ledgers in a shared output folder, capture
requests, a webhook's reply) nested deeper than the parser can follow: `json.loads` raises
RecursionError, not ValueError, and each reader's `except ValueError` let it through. One
line of `[`s stopped `report`, a training's start reading its log's tail or the job ledger,
and the capture watcher. Now it is bad JSON like any other (core/safe_json.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_mindformers.alerts.notifiers import build_notifiers
from otel_mindformers.captures.store import RequestWatcher
from otel_mindformers.config import NotifierConfig
from otel_mindformers.outputs import diagnosis_file
from otel_mindformers.outputs.diagnosis_schema import read_records
from otel_mindformers.outputs.jsonl import last_step_line
from otel_mindformers.outputs.jsonl_reader import LogReadError, read_logs
from otel_mindformers.restarts.ledger_file import read_ledger
from tests.support.cli import cli

DEEP = "[" * 100_000  # within every reader's size bound (64 KiB reads take 65,536 of them)
TAIL_DEEP = "[" * 60_000


def _step(step: int) -> str:
    return json.dumps({"step": step, "job_id": "j1", "rank": 0, "loss": 1.0, "timestamp": 1.0e9 + step})


def test_the_log_readers_take_a_deep_line_as_bad_json(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(f"{_step(1)}\n{TAIL_DEEP}\n")  # last line: a killed writer's half record
    assert last_step_line(log)["step"] == 1  # a next attempt's start
    (series,) = read_logs([log])
    assert [point.step for point in series.points] == [1]
    log.write_text(f"{_step(1)}\n{DEEP}\n{_step(2)}\n")
    with pytest.raises(LogReadError, match=r"metrics.jsonl:2: not a JSON line \(nested too deep"):
        read_logs([log])


def test_a_deep_ledger_is_corrupt(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(TAIL_DEEP)
    assert read_ledger(ledger, repair=False) is None


def test_a_deep_capture_request_is_no_request(tmp_path):
    watcher = RequestWatcher(tmp_path)
    Path(watcher.path).write_text(TAIL_DEEP)
    assert watcher.poll() == []


def test_a_deep_diagnosis_line_is_skipped(tmp_path):
    path = tmp_path / "diagnosis.jsonl"
    path.write_text(f"{DEEP}\n" + json.dumps({"kind": "stall"}) + "\n")
    assert [record["kind"] for record in diagnosis_file.read(path)] == ["stall"]


def test_a_deep_webhook_reply_is_no_verdict():
    (notifier,) = build_notifiers([NotifierConfig(type="wecom", url="http://127.0.0.1:9/robot")])
    notifier.check_reply(TAIL_DEEP.encode())  # no errcode read: nothing to raise


@pytest.mark.slow
def test_report_on_a_log_with_a_deep_line_says_where(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(f"{_step(1)}\n{DEEP}\n{_step(2)}\n")
    done = cli("report", str(log))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode != 0 and "metrics.jsonl:2: not a JSON line (nested too deep" in done.stderr, done


def test_a_line_of_many_megabytes_is_not_held(tmp_path):
    """One line of 80 MiB (no step line comes near 16): skipped over a bounded piece at a
    time, named as not read; before, it was read whole and handed to the parser."""
    import tracemalloc

    from otel_mindformers.core.safe_json import MAX_LINE_CHARS

    log = tmp_path / "metrics.jsonl"
    with log.open("w") as out:
        out.write(_step(1) + "\n" + '{"step": 2, "pad": "')
        for _ in range(80):
            out.write("x" * 2**20)
        out.write('"}\n' + _step(3) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(LogReadError, match=r"metrics.jsonl:2: not a JSON line \(longer than 16 MiB; not read\)"):
            read_logs([log])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_CHARS, peak  # the line is 80 MiB


def test_a_diagnosis_line_of_many_megabytes_is_skipped_with_a_note(tmp_path):
    """The diagnosis files' reader (report, hang-report) read a line whole whatever its
    length; now one past 16 MiB is skipped over a bounded piece at a time, with one note."""
    import tracemalloc

    from otel_mindformers.core.safe_json import MAX_LINE_CHARS

    path = tmp_path / "diagnosis_rank_0.jsonl"
    kept = {"kind": "nonfinite", "rank": 0, "step": 3, "metrics": ["loss"]}
    with path.open("w") as out:
        out.write('{"kind": "stacks", "rank": 0, "step": 2, "pad": "')
        for _ in range(40):
            out.write("x" * 2**20)
        out.write('"}\n' + json.dumps(kept) + "\n")
    tracemalloc.start()
    try:
        read = read_records([path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read.records == [kept]
    assert read.notes == [f"{path}:1: diagnosis record skipped (longer than 16 MiB; not read)"]
    assert peak < 4 * MAX_LINE_CHARS, peak  # the line is 40 MiB
    # The whole long line is skipped: the record after it is line 2, not a piece of it.
    assert list(diagnosis_file.numbered_records(path, [])) == [(2, kept)]


def test_a_line_of_the_bound_is_read_one_past_it_is_not():
    import io

    from otel_mindformers.core.safe_json import MAX_LINE_CHARS, bounded_lines

    whole, over = "a" * (MAX_LINE_CHARS - 1) + "\n", "b" * MAX_LINE_CHARS + "\n"
    assert list(bounded_lines(io.StringIO(whole + over + "c"))) == [(1, whole), (2, None), (3, "c")]


def test_a_diagnosis_line_without_a_kind_is_no_record(tmp_path):
    path = tmp_path / "diagnosis_rank_0.jsonl"
    kept = {"kind": "nonfinite", "rank": 0, "step": 3, "metrics": ["loss"]}
    path.write_text("".join(json.dumps(line) + "\n" for line in ({"rank": 0, "step": 2}, {"kind": 1}, kept)))
    assert list(diagnosis_file.numbered_records(path, [])) == [(3, kept)]
    assert list(diagnosis_file.read(path)) == [kept]
