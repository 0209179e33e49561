"""The flight recorder (docs/flight_recorder.md): when a rank dies (SIGKILL, the OOM killer,
`os._exit`, `abort()`, a segfault), the records its outputs had not written yet and the exact
step it finished survive in the ring beside its JSON log; the next attempt, `report`,
`hang-report` and `replay` recover them, once, into the log they belong to and nothing else.

The fast tests drive the rings directly (real files, real locks, real shared-memory
segments, rings made by the package's own writer or byte by byte; a death is what the kernel
does at one: the lock dropped, the segment detached and left); the slow ones kill real
MindSpore trainings with real signals, cut a live run's ring, remove its segment or end its
IPC namespace, refuse it shared memory, and run the commands on hostile rings.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from otel_mindformers.config import load_monitor_config
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.flight_recorder import recorder, recovery, shm
from otel_mindformers.flight_recorder import ring as ring_format
from otel_mindformers.flight_recorder.offline.recover_logs import recover_rings
from otel_mindformers.flight_recorder.recovery import dead_rings, finished_steps_of, take_tail
from otel_mindformers.flight_recorder.ring import (
    FILE_BYTES,
    HEADER_BYTES,
    SLOT_BYTES,
    SLOT_COUNT,
    RingWriter,
    parse_header,
    ring_name,
    rings_beside,
)
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.restarts.ledger_file import new_ledger, write_ledger
from otel_mindformers.restarts.offline.attempts_report import job_report
from otel_mindformers.telemetry.step_ids import job_step_ids, job_trace_key
from tests.support import restart_worker
from tests.support.cli import cli, cli_output
from tests.support.in_memory import Capture
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.jsonl import json_lines
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.permissions import obey_file_permissions
from tests.support.reliability_worker import finish, spawn
from tests.support.shm_segments import in_own_namespace, segments, set_owner, without_shared_memory
from tests.support.tensorboard_events import loss_steps
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mindspore_api  # cb_params, the step hook, restarts, msrun

JOB = {"id": "job-a", "attempt": 1}


def _ring(
    folder: Path,
    rank: int = 0,
    job_id: str = "job-a",
    attempt_id: str = "a1",
    attempt: int = 1,
    json_name: str = "train_metric.json",
    stem: str = "train_metric",
    **header,
) -> RingWriter:
    fields = {"perf0": 100.0, "wall0": 1_800_000_000.0, "created": time.time(), "flags": ring_format.FLAG_STEP_TIME}
    return RingWriter(
        ring_name(folder / f"{stem}.json", rank, attempt_id),
        rank=rank, job_id=job_id, attempt_id=attempt_id, attempt=attempt, json_name=json_name, **{**fields, **header},
    )  # fmt: skip


def _sampled(step: int, **values: float | bool) -> SampledStep:
    """What MonitorRun.sample hands the pipeline: a window of 2 steps ending at perf 100 + step."""
    return SampledStep(
        step=step, epoch=1, values={tm.LOSS: 1.0 / step, tm.OVERFLOW: False, **values}, model_state=None,
        is_last=False, steps=2, elapsed=0.5, previous_end=99.5 + step, step_begin=99.9 + step, end=100.0 + step,
        data_wait=0.1, phases=0.0, breakdown_at=0.0,
    )  # fmt: skip


def _die(writer: RingWriter) -> Path:
    """What the kernel does when the ring's process dies, however it dies: its files close
    (the lock goes) and its segments are detached, left for the next process."""
    os.close(writer._fd)
    if writer._segment is not None:
        writer._segment.detach()
    return writer.path


def _dead(writer: RingWriter, steps: range, written: int = 0) -> Path:
    """A run that sampled `steps`, whose outputs wrote up to `written`, killed."""
    for step in steps:
        writer.finished[0] = step
        writer.write(_sampled(step))
    if written:
        writer.written(written)
    return _die(writer)


def _in_file_alone(path: Path) -> Path:
    """A dead ring as a reader before left it: its segment read into its file and removed."""
    take_tail(path).release()
    assert parse_header(path.read_bytes()).segment.id == -1
    return path


def _segment_of(path: Path) -> int:
    return parse_header(path.read_bytes()).segment.id


def _log(path: Path, steps, job: dict | None = JOB, rank: int = 0) -> bytes:
    lines = [{"time_stamp": 1.0, "step": s, "rank": rank, **({"job": job} if job else {})} for s in steps]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path.read_bytes()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _start(folder: Path, job_id: str, attempt: int, history=None, **config) -> tuple[object, Capture]:
    """The flight recorder's part of a run's start (MonitorRun), as attempt `attempt` of `job_id` on rank 0."""
    capture = Capture()
    settings = {"output_type": ["json_file"], "json_log_path": str(folder / "train_metric.json"), **config}
    identity = Identity(rank=0, job_id=job_id, attempt=attempt, attempt_id=f"next{attempt}")
    flight = recorder.start(
        load_monitor_config(settings), identity, WallClock(), capture.tracer_provider.get_tracer("t"), history
    )
    return flight, capture


# --- the ring's files ------------------------------------------------------------------------


def test_a_dead_rings_tail_is_what_the_outputs_had_not_written_and_is_recovered_once(tmp_path):
    writer = _ring(tmp_path)
    for step in range(1, 31):
        writer.finished[0] = step
        writer.write(_sampled(step))
    writer.written(20)
    writer.finished[0] = 33  # three more steps finished, none sampled
    path = writer.path
    assert take_tail(path) is None, "a ring whose writer lives is not recovered"
    _die(writer)

    tail = take_tail(path)
    assert tail is not None and [slot.step for slot in tail.slots] == list(range(21, 31))
    lines = [record.to_json_dict() for record in tail.records()]
    assert lines[0] == {
        "time_stamp": 1_800_000_000.0 + 21,  # the run's origin + (the step's end - its perf origin)
        "step": 21, "epoch": 1, "rank": 0, "loss": pytest.approx(1 / 21), "overflow": False,
        "train_per_step_time": pytest.approx(250.0),  # 0.5 s over 2 steps
        "job": JOB, "recovered": True,
    }  # fmt: skip
    assert lines[0]["overflow"] is False, "a bool comes back a bool, not 0.0"
    tail.mark_written()
    tail.release()
    assert finished_steps_of(str(tmp_path / "train_metric.json"), 0)["a1"].step == 33
    again = take_tail(path)
    assert again is not None and again.slots == []
    again.release()


# --- the ring's shared memory -------------------------------------------------------------


def _a_run_killed_at_33(folder: Path) -> RingWriter:
    """Sampled every 5 steps; the outputs' last batch wrote up to 10 at step 12 (the worker
    copied the ring into its file then); steps 13..33 went into memory only."""
    writer = _ring(folder)
    for step in range(1, 34):
        writer.finished[0] = step
        if step % 5 == 0:
            writer.write(_sampled(step))
        if step == 12:
            writer.written(10)
    return writer


@pytest.mark.parametrize("segment", ["there", "removed after the death"])
def test_a_dead_runs_segment_holds_the_exact_tail_and_step_and_its_file_those_of_the_last_batch(
    tmp_path, caplog, segment
):
    """The training thread's stores go to shared memory (no system call); the file holds the
    ring as of the worker's last copy. After a death the segment is there: a reader gets
    the exact tail and last step from it, writes them into the file and removes it. Where it
    was removed (`ipcrm`, kernel.shm_rmid_forced), the file gives what it holds, one warning."""
    before = set(segments())
    writer = _a_run_killed_at_33(tmp_path)
    log = str(tmp_path / "train_metric.json")
    in_file = ring_format.parse_ring(writer.path.read_bytes())
    assert [slot.step for slot in in_file.slots] == [5, 10]
    assert (in_file.header.finished_step, in_file.header.written_step) == (12, 10)
    assert finished_steps_of(log, 0)["a1"] == recovery.Finished(33, 1_800_000_000.0 + 30, alive=True)
    (segment_id,) = set(segments()) - before
    assert segment_id == _segment_of(_die(writer)) and segments()[segment_id].attached == 0
    assert finished_steps_of(log, 0)["a1"].step == 33, "read from the dead run's segment, which stays"
    if segment == "removed after the death":
        shm.remove(segment_id)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tail = take_tail(writer.path)
        tail.release()
        take_tail(writer.path).release()
    assert set(segments()) == before
    now_in_file = ring_format.parse_ring(writer.path.read_bytes())
    warned = [w for w in _warnings(caplog) if "names shared memory" in w]
    if segment == "there":
        assert [slot.step for slot in tail.slots] == [15, 20, 25, 30]
        assert tail.header.finished_step == now_in_file.header.finished_step == 33
        assert [slot.step for slot in now_in_file.slots] == [5, 10, 15, 20, 25, 30]
        assert now_in_file.header.segment.id == -1 and warned == []
    else:
        assert tail.slots == [] and now_in_file == in_file
        assert finished_steps_of(log, 0)["a1"].step == 12
        assert warned == [
            f"otel_mindformers: the flight ring {writer.path} names shared memory that cannot be taken as its "
            f"own (segment {segment_id} is gone or not ours to read (shmctl({segment_id}, IPC_STAT): Invalid "
            "argument)); recovered from its "
            "file alone, as of its outputs' last batch"
        ]


@pytest.mark.parametrize("given", ["folder", "folder above", "log files"])
def test_hang_report_takes_each_ranks_exact_step_from_its_ring(tmp_path, given):
    """Rank 0 killed at step 33 (its log's last line: step 30, sampled every 5), rank 1 alive
    at step 30 (log and ring agree): the ring, not the log, says rank 1 stopped first. A
    report from the logs alone saw every rank at step 30. The rings beside logs named one
    by one are read too, and those in a folder under the one named."""
    from otel_mindformers.hangs.offline.hang_report import build_hang_report

    output = tmp_path / "output"
    output.mkdir()

    killed = _a_run_killed_at_33(output)
    alive = _ring(output, rank=1, attempt_id="b1")
    for rank, last in ((0, 30), (1, 30)):
        (output / f"train_metric_rank_{rank}.json").write_text(
            "".join(
                json.dumps({"time_stamp": 1_800_000_000.0 + step, "step": step, "rank": rank, "job": JOB}) + "\n"
                for step in range(5, last + 1, 5)
            )
        )
    for step in range(1, 31):
        alive.finished[0] = step
    _die(killed)
    try:
        inputs = {"folder": [output], "folder above": [tmp_path]}.get(given) or sorted(output.glob("*_rank_*.json"))
        beats = {beat.rank: (beat.step, beat.source) for beat in build_hang_report(inputs).heartbeats}
        assert beats == {0: (33, "flight ring"), 1: (30, "log")}
    finally:
        _die(alive)
        for ring in (killed.path, alive.path):  # their segments go with the recovery
            tail = take_tail(ring)
            if tail is not None:
                tail.release()


def _field(path: Path, offset: int, fmt: str, value) -> None:
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(struct.pack(fmt, value))


REFUSED = {
    "another ring's": "is not this ring's: its header is another ring's",
    "a damaged one": "is not this ring's: its header is no run's: flags 0x80",
    "another user's": f"is not this ring's: owned by uid 12345, created by uid {os.geteuid()}, not the file's "
    f"{os.geteuid()}",
    "open to others": "is not this ring's: mode 644: others may use it",
    "a copy of the ring": "is the ring's this file was copied from",
}


@pytest.mark.parametrize("case", [*REFUSED, "of another namespace"])
def test_a_segment_that_is_not_the_rings_own_is_left_alone_and_the_file_read(tmp_path, caplog, case):
    """A planted ring naming someone else's segment, an id the kernel gave to another
    segment, a file copied elsewhere: the segment is not read into anything nor removed (one
    warning); the ring is what its file holds. A segment of another boot or IPC namespace
    (another host, a container that ended) is not looked for: no warning."""
    writer = _a_run_killed_at_33(tmp_path)
    path, own = _die(writer), _segment_of(writer.path)
    others = tmp_path / "others"
    others.mkdir()
    theirs = _dead(_ring(others, attempt_id="b1"), range(1, 8))
    if case == "another ring's":
        _field(path, ring_format.SEGMENT_OFFSET, "<i", _segment_of(theirs))
    elif case == "a damaged one":  # the segment's own header, not the file's: an unknown flag
        attachment = shm.Attachment(own, FILE_BYTES)
        attachment.view[32] = 0x80
        attachment.detach()
    elif case == "another user's":
        set_owner(own, uid=12345)
    elif case == "open to others":
        set_owner(own, mode=0o644)
    elif case == "a copy of the ring":
        copies = tmp_path / "copies"
        copies.mkdir()
        path = Path(shutil.copy(path, copies))
    else:
        _field(path, ring_format.SEGMENT_OFFSET + 40, "<Q", shm.namespace()[1] + 1)
    named = _segment_of(path)
    before = {key: (row.uid, row.mode) for key, row in segments().items()}
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tail = take_tail(path)
        tail.release()
        take_tail(path).release()
    assert [slot.step for slot in tail.slots] == [] and tail.header.finished_step == 12  # the file's: as of step 12
    assert {key: (row.uid, row.mode) for key, row in segments().items()} == before, "no segment removed or changed"
    warned = [w for w in _warnings(caplog) if "names shared memory" in w]
    if case == "of another namespace":
        assert warned == []
    else:
        assert len(warned) == 1 and f"(segment {named} {REFUSED[case]}" in warned[0], warned
    if case in ("another user's", "open to others"):
        set_owner(own, uid=os.geteuid(), mode=0o600)
    if case == "a copy of the ring":  # the ring itself still reads its own segment
        tail = take_tail(writer.path)
        assert [slot.step for slot in tail.slots] == [15, 20, 25, 30]
        tail.release()
    for ring in (writer.path, theirs):  # nothing left in memory after the test
        take_tail(ring).release()


def test_without_shared_memory_the_ring_is_its_file_written_at_sampled_steps(tmp_path, caplog, monkeypatch):
    """shmget refused (a sandbox, kernel.shmmni reached): one warning, the ring kept in its
    file. The step hook's store is still a memory store (no system call, the file does not
    change); each sampled step's slot goes into the file as it is taken, and the worker's
    copy brings the header's step. After a death the last step is the last sampled one, or
    the step of the last copy when later."""

    def refused(size: int) -> shm.Attachment:
        raise OSError(errno.ENOSPC, "shmget: No space left on device")

    monkeypatch.setattr(shm, "create", refused)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        writer = _ring(tmp_path)
    assert [w for w in _warnings(caplog) if "no shared memory" in w] == [
        f"otel_mindformers: no shared memory for the flight ring {writer.path} (shmget: No space left on device); "
        "it is kept in its file alone, each sampled step written as it is taken: a death of this process loses "
        "the steps after the last sampled one (the last finished step it tells is the last sampled step, or the "
        "step the outputs' last batch saw)"
    ]
    log = str(tmp_path / "train_metric.json")
    assert _segment_of(writer.path) == -1
    writer.write(_sampled(5))
    empty = writer.path.read_bytes()
    writer.finished[0] = 7
    assert writer.path.read_bytes() == empty, "no write for a step that is not sampled"
    assert finished_steps_of(log, 0)["a1"].step == 5
    writer.written(5)
    assert finished_steps_of(log, 0)["a1"].step == 7
    writer.write(_sampled(10))
    assert finished_steps_of(log, 0)["a1"].step == 10
    writer.finished[0] = 13
    tail = take_tail(_die(writer))
    assert [slot.step for slot in tail.slots] == [10] and tail.header.finished_step == 7
    tail.release()
    assert finished_steps_of(log, 0)["a1"].step == 10


def test_a_sampled_steps_slot_holds_its_step(tmp_path):
    """A sampled step's slot holds its step: how far a run got is the later of the header's
    step and the last slot's (without shared memory the slot is in the file first)."""
    writer = _ring(tmp_path)
    log = str(tmp_path / "train_metric.json")
    writer.finished[0] = 9
    writer.write(_sampled(10))
    assert finished_steps_of(log, 0)["a1"].step == 10
    writer.finished[0] = 11
    assert finished_steps_of(log, 0)["a1"].step == 11
    writer.close(remove=False)


def test_every_field_the_ring_keeps_comes_back_by_its_name(tmp_path):
    """The slot's layout is SampledStep's fields (core/sampled_step.py), by name: whatever
    their order there, each comes back as itself."""
    kept = set(SampledStep._fields) - {"values", "model_state", "is_last"}
    assert set(ring_format.SLOT_FIELDS) == kept
    distinct = {name: 1000.0 + 7 * index for index, name in enumerate(ring_format.READINGS)}
    sampled = SampledStep(
        step=41, epoch=3, values={tm.LOSS: 2.5, tm.OVERFLOW: True, tm.LOSS_SCALE: 1024.0}, model_state="not kept",
        is_last=True, steps=9, **distinct,
    )  # fmt: skip
    writer = _ring(tmp_path)
    writer.write(sampled)
    writer.write(sampled._replace(step=42, epoch=None, is_last=False, values={}))
    tail = take_tail(_dead(writer, range(0)))
    first, second = tail.slots
    tail.release()
    assert {name: getattr(first, name) for name in ring_format.SLOT_FIELDS} == {
        "step": 41,
        "epoch": 3,
        "steps": 9,
        **distinct,
    }
    assert first.is_last is True and first.values == {tm.LOSS: 2.5, tm.OVERFLOW: True, tm.LOSS_SCALE: 1024.0}
    assert type(first.values[tm.OVERFLOW]) is bool and type(first.values[tm.LOSS_SCALE]) is float
    assert (second.step, second.epoch, second.is_last, second.values) == (42, 0, False, {})


def test_a_step_that_cannot_be_kept_leaves_an_empty_slot_never_a_mixed_one(tmp_path, caplog):
    """A value that is no number, found half way through the slot's stores: the slot reads as
    empty (its number is zeroed first, stored last), not as the step it held a lap before
    with this one's fields in it. One warning; the next step is kept."""
    writer = _ring(tmp_path)

    def in_memory() -> list[int]:
        return [slot.step for slot in ring_format.parse_ring(shm.read(_segment_of(writer.path), FILE_BYTES)).slots]

    for step in range(1, SLOT_COUNT + 1):
        writer.write(_sampled(step))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        writer.write(_sampled(SLOT_COUNT + 1, learning_rate="not a number"))  # into the slot of step 1
        assert in_memory() == list(range(2, SLOT_COUNT + 1))
        writer.write(_sampled(SLOT_COUNT + 2))
        assert in_memory() == [*range(2, SLOT_COUNT + 1), SLOT_COUNT + 2]
    assert [w for w in _warnings(caplog) if "cannot keep a step" in w] == [
        f"otel_mindformers: the flight ring {writer.path} cannot keep a step: memoryview: invalid type for format 'd'"
    ]
    writer.close(remove=True)


def test_a_ring_that_wrapped_keeps_its_last_slots_in_order(tmp_path):
    writer = _ring(tmp_path)
    for step in range(1, SLOT_COUNT + 101):
        writer.write(_sampled(step))
    writer.close(remove=False)
    tail = take_tail(writer.path)
    assert [slot.step for slot in tail.slots] == list(range(101, SLOT_COUNT + 101))
    tail.release()


def _slot_offset(seq: int) -> int:
    return HEADER_BYTES + seq % SLOT_COUNT * SLOT_BYTES


def test_an_empty_slot_is_left_out_and_a_damaged_one_gives_one_warning(tmp_path, caplog):
    """A slot is written whole by one write, its number first and last: a slot whose two
    numbers disagree (a write cut short, a damaged disk), whose flags or value indexes are
    out of range, is damaged: skipped, counted, one warning; never an IndexError."""
    path = _in_file_alone(_dead(_ring(tmp_path), range(1, 10)))
    keys_at, last_at = 16, SLOT_BYTES - 8
    field_at = {name: 32 + 8 * index for index, name in enumerate(ring_format.SLOT_FIELDS)}
    with open(path, "r+b") as stream:
        for seq, offset, data in [
            (3, 0, bytes(8)),  # never written (or written over by zeros): empty
            (4, last_at, struct.pack("<q", 4 - SLOT_COUNT)),  # cut short: the last word is the slot's previous use
            (5, 8, b"\xff\xff"),  # flags: is_last 255
            (6, keys_at, bytes([len(tm.BY_KEY)])),  # the first value's index: one past the table
            (7, keys_at, bytes([0x80 | len(tm.BY_KEY)])),  # the same, marked a bool
            (8, field_at["step"], struct.pack("<q", 2**62)),  # a step no run reaches
            (9, field_at["end"], struct.pack("<d", math.nan)),  # a clock reading that is no time
        ]:
            stream.seek(_slot_offset(seq) + offset)
            stream.write(data)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tail = take_tail(path)
        tail.release()
        take_tail(path).release()
    assert [slot.step for slot in tail.slots] == [1, 2]
    assert [w for w in _warnings(caplog) if "damaged" in w] == [
        f"otel_mindformers: the flight ring {path} holds 6 damaged slot(s); skipped, the rest recovered"
    ]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"not a ring at all" + data[17:], id="garbage"),
        pytest.param(lambda data: data[: HEADER_BYTES + 100], id="truncated"),
        pytest.param(lambda data: data + b"more", id="longer"),
        pytest.param(lambda data: data[:8] + struct.pack("<I", 1) + data[12:], id="an-older-format"),
        pytest.param(lambda data: data[:8] + struct.pack("<I", 99) + data[12:], id="a-newer-format"),
        pytest.param(lambda data: data[:84] + struct.pack("<I", 7) + data[88:], id="another-slot-layout"),
    ],
)
def test_a_corrupt_or_foreign_format_ring_gives_one_warning_and_nothing_recovered(tmp_path, caplog, damage):
    path = _dead(_ring(tmp_path), range(1, 2))
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert dead_rings(str(tmp_path / "train_metric.json"), 0) == []
        assert dead_rings(str(tmp_path / "train_metric.json"), 0) == []
        assert recover_rings([path]) == []
    assert len([w for w in _warnings(caplog) if "cannot be read" in w]) == 1, _warnings(caplog)
    assert not path.exists() and path.with_name(path.name + ".corrupt").exists()
    assert not (tmp_path / "train_metric.json").exists()


# --- hostile rings: a ring is another process's file -----------------------------------------


def _hand_made(data: bytearray, offset: int, fmt: str, *values) -> bytes:
    struct.pack_into(fmt, data, offset, *values)
    return bytes(data)


HOSTILE_HEADERS = {  # made by the package's own writer
    "a NaN clock": {"perf0": math.nan},
    "an infinite clock": {"wall0": math.inf},
    "a NUL in the job id": {"job_id": "job\x00a"},
    "a line break in the job id": {"job_id": "job-a\n$(touch PWNED)"},
    "a log outside its folder": {"json_name": "../victim.txt", "job_id": "$(touch PWNED)"},
    "an absolute log": {"json_name": "{victim}"},
    "a log in a subfolder": {"json_name": "sub/train_metric.json"},
    "a log named ..": {"json_name": ".."},
    "a negative rank": {"rank": -1},
    "a rank no job has": {"rank": 1 << 21},
    "an attempt id with a dot": {"attempt_id": "a.1"},
}
HOSTILE_BYTES = {  # hand-crafted: what no writer of this package writes
    "pid 0": (24 + 4, "<i", 0),  # after magic, version, three sizes, the rank
    "an unknown flag": (32, "<I", 0x80),
    "a last step of 2**62": (ring_format.FINISHED_OFFSET, "<q", 2**62),
    "a negative written step": (ring_format.WRITTEN_OFFSET, "<q", -5),
    "a negative first unsent step": (ring_format.UNSENT_OFFSET, "<q", -5),
    "a negative attempt": (80, "<i", -1),
    "a name past the header": (128, "<H", 1023),
    "a name that is no UTF-8": (130, "<2s", b"\xff\xfe"),
}


def _hostile_ring(folder: Path, case: str, attempt_id: str = "a1") -> Path:
    victim = folder.parent / "victim.txt"
    if case in HOSTILE_HEADERS:
        header = {key: value.format(victim=victim) if isinstance(value, str) else value
                  for key, value in HOSTILE_HEADERS[case].items()}  # fmt: skip
        rank, attempt_id = header.pop("rank", 0), header.pop("attempt_id", attempt_id)
        path = ring_name(folder / "train_metric.json", rank, attempt_id)
        writer = RingWriter(path, **{
            "rank": rank, "job_id": "job-a", "attempt_id": attempt_id, "attempt": 1,
            "json_name": "train_metric.json", "perf0": 100.0, "wall0": 1.8e9, "created": time.time(), **header,
        })  # fmt: skip
        return _dead(writer, range(1, 6))
    path = _dead(_ring(folder, attempt_id=attempt_id), range(1, 6))
    offset, fmt, value = HOSTILE_BYTES[case]
    path.write_bytes(_hand_made(bytearray(path.read_bytes()), offset, fmt, value))
    return path


@pytest.mark.parametrize("case", [*HOSTILE_HEADERS, *HOSTILE_BYTES])
def test_a_ring_whose_header_no_run_writes_is_set_aside_with_one_warning_and_nothing_written(tmp_path, caplog, case):
    """A planted ring (security, issue 46): its header names a log outside its folder, a job
    id that is shell code, a clock that is no time, a step no run reaches. Nothing is
    written anywhere, nothing raises; it is set aside once, with one warning."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("first line\nlast line, no newline")
    (out / "sub").mkdir()
    path = _hostile_ring(out, case)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != path}
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert dead_rings(str(out / "train_metric.json"), 0) == []
        assert recover_rings([path]) == []
        flight, _ = _start(out, "job-a", 2)
        flight.close(lambda: 1.0)
    assert len([w for w in _warnings(caplog) if "cannot be read" in w]) == 1, _warnings(caplog)
    assert path.with_name(path.name + ".corrupt").exists()
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".corrupt")}
    assert after == before
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    "case",
    [
        "another file of its folder", "another log of its job", "a link to another file", "a link to its job's log",
        "another rank's log", "a file of no JSON lines", "a ring under another name",
    ],
)  # fmt: skip
def test_a_ring_is_recovered_only_into_its_own_runs_log(tmp_path, caplog, case):
    """A plain name in the ring's own folder is not enough: the log must be its run's JSON
    log (by name, as the ring's own name says), a plain file, holding its job's lines on its rank."""
    victim = tmp_path / "victim.txt"
    victim.write_text("first line\nlast line, no newline")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _log(elsewhere / "train_metric.json", range(1, 3))  # job a's lines, rank 0
    log = tmp_path / "train_metric.json"
    name = "train_metric.json"
    if case == "another file of its folder":
        name = "victim.txt"
    elif case == "another log of its job":
        name = "eval_metric.json"
        _log(tmp_path / name, range(1, 3))
    elif case == "a link to another file":
        log.symlink_to(victim)
    elif case == "a link to its job's log":
        log.symlink_to(elsewhere / "train_metric.json")
    elif case == "another rank's log":
        _log(log, range(1, 4), rank=1)
    else:
        log.write_text("export A=1\nexport B=2\n")
    path = _dead(_ring(tmp_path, json_name=name), range(1, 6))
    if case == "a ring under another name":  # whose log is it? its name would have said
        _log(log, range(1, 3))
        path = path.rename(tmp_path / "planted.flight")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != path}
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert recover_rings([path]) == []
        assert recover_rings([path]) == []
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != path} == before
    assert len([w for w in _warnings(caplog) if "is not recovered" in w]) == 1, _warnings(caplog)
    # The ring itself took its segment's bytes (the segment is gone: nothing left in memory).
    assert _segment_of(path) == -1
    tail = take_tail(path)
    assert [slot.step for slot in tail.slots] == [1, 2, 3, 4, 5]  # still there for its run
    tail.release()


def test_a_link_put_at_the_logs_name_after_the_check_is_not_written_through(tmp_path):
    """own_log looks at the name, write_log opens it: a link planted in between (a planter
    racing `report` in a shared folder) had the recovered lines appended wherever it pointed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("first line\n")
    path = _dead(_ring(tmp_path), range(1, 4))
    tail = take_tail(path)
    try:
        log, _ = recovery.own_log(path, tail.header)
        assert log == tmp_path / "train_metric.json"  # none yet: the log its run would have created
        log.symlink_to(victim)
        with pytest.raises(OSError):
            recovery.write_log(tail.records(), log)
    finally:
        tail.release()
    assert victim.read_text() == "first line\n"


def test_a_name_with_brackets_is_no_pattern(tmp_path):
    """`[` `]` in json_log_path's name (issue 46): the ring is found again, and a log whose
    name the pattern would have matched is another log's, not taken."""
    folder = tmp_path / "run[1]"
    folder.mkdir()
    log = folder / "train[0].json"
    mine = _dead(_ring(folder, stem="train[0]", json_name=log.name), range(1, 4))
    other = _dead(_ring(folder, stem="train0", json_name="train0.json", attempt_id="b1"), range(1, 4))
    assert rings_beside(log, 0) == [mine]
    assert list(finished_steps_of(str(log), 0)) == ["a1"]
    tails = dead_rings(str(log), 0)
    assert [tail.path for tail in tails] == [mine]
    tails[0].release()
    assert recover_rings([mine]) == [(log, 3)]
    assert other.exists() and not (folder / "train0.json").exists()
    # Its log now another job's, and a set-aside log that the pattern would match holds job a's
    # lines: it is train0's, not this log's.
    decoy = folder / "train0.20260101-000000.json"
    before = _log(decoy, range(1, 3))
    _log(log, range(1, 3), job={"id": "job-b", "attempt": 1})
    again = _dead(_ring(folder, stem="train[0]", json_name=log.name, attempt_id="a2"), range(1, 4))
    assert recover_rings([again]) == []
    assert decoy.read_bytes() == before


# --- how far the outputs got, and which log -------------------------------------------------


def test_recovery_skips_the_lines_an_output_wrote_past_the_rings_mark(tmp_path):
    """A JSON output that failed part-way through a batch (a full disk) wrote some of its
    lines without the ring's mark moving: they are not written twice, by `report` or by
    the next attempt."""
    log = tmp_path / "train_metric.json"
    _log(log, range(1, 8))
    path = _dead(_ring(tmp_path), range(1, 11), written=4)
    assert recover_rings([path]) == [(log, 3)]
    assert [line["step"] for line in json_lines(log)] == list(range(1, 11))
    header = parse_header(path.read_bytes())
    assert (header.written_step, header.unsent_from) == (4, 8), "report notes what it wrote, not that it is out"
    assert recover_rings([path]) == []

    live = tmp_path / "live"
    live.mkdir()
    _log(live / "train_metric.json", range(1, 8))
    _dead(_ring(live), range(1, 11), written=4)
    flight, _ = _start(live, "job-a", 2)
    flight.close(lambda: 1.0)
    assert [line["step"] for line in json_lines(live / "train_metric.json")] == list(range(1, 11))


@pytest.mark.parametrize("last_job", [{"id": "job-a", "attempt": 2}, None], ids=["attempt-2", "no-job"])
def test_a_later_attempts_last_line_never_drops_a_dead_attempts_tail(tmp_path, last_job):
    """The log's last line is attempt 2's step 50 (it outran attempt 1, which died at 30), or
    a line that names no job: attempt 1's steps 21..30 are not "already written"."""
    log = tmp_path / "train_metric.json"
    _log(log, [48, 49, 50], job=last_job)
    path = _dead(_ring(tmp_path), range(1, 31), written=20)
    assert recover_rings([path]) == [(log, 10)]
    assert [line["step"] for line in json_lines(log)][3:] == list(range(21, 31))


@pytest.mark.parametrize("log_is", ["missing", "without job lines", "empty"])
def test_offline_recovery_into_a_missing_log_or_one_without_job_lines(tmp_path, log_is):
    log = tmp_path / "train_metric.json"
    if log_is == "without job lines":
        _log(log, range(1, 3), job=None)
    elif log_is == "empty":
        log.write_bytes(b"")
    path = _dead(_ring(tmp_path), range(1, 6), written=2)
    assert recover_rings([path]) == [(log, 3)]
    assert [line["step"] for line in json_lines(log)][-3:] == [3, 4, 5]
    assert parse_header(path.read_bytes()).unsent_from == 3
    assert path.exists(), "the ring stays for its last finished step and the next attempt's spans"


def test_the_next_attempt_recovers_every_dead_ring_oldest_first_and_removes_them(tmp_path):
    """Attempts 1 and 2 of the job died; the ring names sort the other way (attempt ids are
    random). The next attempt writes attempt 1's tail, then attempt 2's, then removes both."""
    older = _dead(_ring(tmp_path, attempt_id="zz", attempt=1, created=1000.0), range(1, 6), written=2)
    newer = _dead(_ring(tmp_path, attempt_id="aa", attempt=2, created=2000.0), range(1, 6), written=3)
    assert sorted([older, newer]) == [newer, older]
    flight, _ = _start(tmp_path, "job-a", 3)
    flight.close(lambda: 1.0)
    lines = json_lines(tmp_path / "train_metric.json")
    assert [(line["job"]["attempt"], line["step"]) for line in lines] == [(1, 3), (1, 4), (1, 5), (2, 4), (2, 5)]
    assert not older.exists() and not newer.exists()


def test_recovered_step_spans_link_to_the_dead_attempts_run_span(tmp_path):
    _dead(_ring(tmp_path, attempt_id="dead1"), range(1, 4), written=1)
    history = [
        {"attempt_id": "other", "trace_id": "1" * 32, "span_id": "2" * 16},
        {"attempt_id": "dead1", "trace_id": "ab" * 16, "span_id": "cd" * 8},
    ]
    flight, capture = _start(tmp_path, "job-a", 2, history)
    flight.close(lambda: 1.0)
    spans = capture.spans.get_finished_spans()
    assert [span.attributes[semconv.ATTR_STEP] for span in spans] == [2, 3]
    for span in spans:
        assert span.attributes[semconv.ATTR_RECOVERED] is True and span.attributes[job_names.ATTR_ATTEMPT] == 1
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (int("ab" * 16, 16), int("cd" * 8, 16))
        ]
    assert spans[-1].end_time == int((1_800_000_000.0 + 3) * 1e9)  # the step's own end
    assert spans[-1].start_time == int((1_800_000_000.0 + 2.5) * 1e9)  # its predecessor's end


@pytest.mark.parametrize("reports", [0, 1, 2], ids=["no-report", "report", "report-twice"])
def test_the_next_attempt_sends_the_tail_once_whether_or_not_report_wrote_it_first(tmp_path, reports):
    """Attempt 1 died with steps 3..6 past its outputs' mark, 3 in its log already (a
    batch written part way). `report` between the attempts writes 4..6 into the log; the
    next attempt still sends them over OTLP, and writes no line twice."""
    log = tmp_path / "train_metric.json"
    _log(log, range(1, 4))
    path = _dead(_ring(tmp_path, attempt_id="dead1"), range(1, 7), written=2)
    for _ in range(reports):
        recover_rings([path])
    flight, capture = _start(tmp_path, "job-a", 2)
    flight.close(lambda: 1.0)
    assert [line["step"] for line in json_lines(log)] == list(range(1, 7))
    spans = capture.spans.get_finished_spans()
    assert [span.attributes[semconv.ATTR_STEP] for span in spans] == [4, 5, 6]
    assert not path.exists()
    again, capture = _start(tmp_path, "job-a", 3)
    again.close(lambda: 1.0)
    assert capture.spans.get_finished_spans() == (), "sent once: the ring is gone"


def test_a_second_report_after_a_cut_write_keeps_the_first_unsent_step(tmp_path):
    """`report` wrote 4..6 into the log and the write was cut after 5 (a full disk); the next
    `report` writes 6. The next attempt sends 4..6 over OTLP: the second report's own first
    line (6) does not move where the unsent tail begins."""
    log = tmp_path / "train_metric.json"
    _log(log, range(1, 4))
    path = _dead(_ring(tmp_path, attempt_id="dead1"), range(1, 7), written=2)
    recover_rings([path])
    lines = log.read_text().splitlines(keepends=True)
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 7))
    log.write_text("".join(lines[:-1]))
    recover_rings([path])
    flight, capture = _start(tmp_path, "job-a", 2)
    flight.close(lambda: 1.0)
    assert [line["step"] for line in json_lines(log)] == list(range(1, 7))
    assert [span.attributes[semconv.ATTR_STEP] for span in capture.spans.get_finished_spans()] == [4, 5, 6]


def test_another_jobs_dead_ring_goes_to_its_own_log_and_another_ranks_is_never_touched(tmp_path, caplog):
    """Runs killed before their first checkpoint and started again from scratch are new jobs
    (issue 46): each dead run's tail goes into its own log (still at its name, or set
    aside by a later run), never into another job's, and its ring goes; rank 1's stays."""
    log = tmp_path / "train_metric.json"
    kept = tmp_path / "train_metric.20260101-000000.json"
    _log(log, range(1, 5), job={"id": "local-2", "attempt": 1})
    _log(kept, range(1, 4), job={"id": "local-1", "attempt": 1})
    second = _dead(_ring(tmp_path, job_id="local-2", attempt_id="b1"), range(1, 9), written=4)
    first = _dead(_ring(tmp_path, job_id="local-1", attempt_id="a1"), range(1, 7), written=3)
    rank1 = _dead(_ring(tmp_path, rank=1, job_id="local-2", attempt_id="c1"), range(1, 9))
    rank1_bytes = rank1.read_bytes()
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        flight, _ = _start(tmp_path, "local-3", 1)
        flight.close(lambda: 1.0)
    assert [(line["job"]["id"], line["step"]) for line in json_lines(log)] == [("local-2", s) for s in range(1, 9)]
    assert [(line["job"]["id"], line["step"]) for line in json_lines(kept)] == [("local-1", s) for s in range(1, 7)]
    assert not first.exists() and not second.exists()
    assert rank1.read_bytes() == rank1_bytes, "another rank's ring is its rank's"
    assert [w for w in _warnings(caplog) if "not recovered" in w or "cannot" in w] == []


def test_report_sees_from_the_rings_lock_that_an_attempt_lives(tmp_path):
    """Its heartbeat is stale (a long step, a slow checkpoint), but the ring's lock is held:
    the attempt runs. The lock gone, it was killed."""
    now = time.time()
    ledger = new_ledger("job-a")
    ledger["attempts"] = [{
        "attempt_id": "a1", "attempt": 1, "pid": os.getpid(), "host": "h", "rank": 0, "process_start": now - 100,
        "train_begin": now - 90, "resume_step": 0, "last_step": 10, "last_step_time": now - 60,
        "last_heartbeat": now - 60, "heartbeat_interval": 5.0, "outcome": None,
    }]  # fmt: skip
    write_ledger(tmp_path / "train_metric.job.rank_0.ledger", ledger)
    writer = _ring(tmp_path)
    writer.finished[0] = 12  # the live run's memory: read, never taken
    assert finished_steps_of(str(tmp_path / "train_metric.json"), 0)["a1"].alive is True
    (row,) = job_report([tmp_path], now=now)["attempts"]
    assert (row["outcome"], row["last_step"]) == ("running", 12)
    _die(writer)
    assert finished_steps_of(str(tmp_path / "train_metric.json"), 0)["a1"].alive is False
    (row,) = job_report([tmp_path], now=now)["attempts"]
    assert (row["outcome"], row["last_step"]) == ("killed", 12)


def test_at_its_end_a_run_removes_its_ring_when_its_outputs_wrote_all_and_keeps_it_otherwise(tmp_path):
    """Either way its segment goes: a ring kept holds it all in its file, which names none."""
    before = set(segments())
    for written, kept in [(5, False), (4, True)]:
        flight, _ = _start(tmp_path / str(written), "job-a", 1)
        for step in range(1, 6):
            flight.write(_sampled(step))
        flight.written(written)
        flight.finished[0] = 7
        flight.close(lambda: 1.0)
        rings = list((tmp_path / str(written)).glob("*.flight"))
        assert bool(rings) is kept, written
        assert set(segments()) == before
    in_file = ring_format.parse_ring(rings[0].read_bytes())
    assert [slot.step for slot in in_file.slots] == [1, 2, 3, 4, 5]
    assert (in_file.header.finished_step, in_file.header.written_step, in_file.header.segment.id) == (7, 4, -1)


def test_a_ring_named_for_this_rank_that_another_wrote_is_left_alone(tmp_path):
    theirs = _dead(_ring(tmp_path, rank=1), range(1, 4))
    named_ours = theirs.rename(ring_name(tmp_path / "train_metric.json", 0, "a1"))
    before = named_ours.read_bytes()
    assert dead_rings(str(tmp_path / "train_metric.json"), 0) == []
    assert named_ours.read_bytes() == before


def test_one_damaged_slot_is_one_warning(tmp_path, caplog):
    path = _in_file_alone(_dead(_ring(tmp_path), range(1, 4)))
    with open(path, "r+b") as stream:
        stream.seek(_slot_offset(2) + 8)
        stream.write(b"\xff")
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tail = take_tail(path)
        tail.release()
    assert [slot.step for slot in tail.slots] == [1, 3]
    assert len([w for w in _warnings(caplog) if "holds 1 damaged slot(s)" in w]) == 1


# --- a ring another process cuts --------------------------------------------------------------


@pytest.mark.parametrize("cut_to", [0, FILE_BYTES // 2, 100])
def test_a_ring_another_process_cuts_is_written_whole_again_with_one_warning(tmp_path, caplog, cut_to):
    """`: > out/*`, logrotate's copytruncate: the file is cut, the ring's memory is not (a
    segment's size is fixed; a store into a shrunk file mapping was a SIGBUS). The worker's
    next copy finds the cut and writes the ring whole again: nothing it held is lost."""
    writer = _ring(tmp_path)
    for step in range(1, 11):
        writer.write(_sampled(step))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        writer.written(10)
        os.truncate(writer.path, cut_to)
        for step in range(11, 21):
            writer.finished[0] = step
            writer.write(_sampled(step))
        writer.written(15)
        os.truncate(writer.path, cut_to)
        writer.written(15)
    assert len([w for w in _warnings(caplog) if "cut or overwritten by another process" in w]) == 1
    assert writer.path.stat().st_size == FILE_BYTES
    in_file = ring_format.parse_ring(writer.path.read_bytes())
    assert [slot.step for slot in in_file.slots] == list(range(1, 21))
    assert (in_file.header.finished_step, in_file.header.written_step) == (20, 15)
    writer.finished[0] = 21
    tail = take_tail(_die(writer))
    assert [slot.step for slot in tail.slots] == [16, 17, 18, 19, 20]
    assert tail.header.finished_step == 21, "the last step from the segment: the file had 20"
    tail.release()


def test_a_ring_overwritten_at_its_size_is_written_whole_again(tmp_path, caplog):
    """Another run's ring copied over this one (same size, another header): the worker's
    next copy writes this ring back whole, slots included, with the same one warning."""
    writer = _ring(tmp_path)
    for step in range(1, 6):
        writer.write(_sampled(step))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = _in_file_alone(_dead(_ring(elsewhere, attempt_id="o1"), range(1, 50)))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        writer.path.write_bytes(other.read_bytes())
        writer.written(5)
    assert len([w for w in _warnings(caplog) if "cut or overwritten by another process" in w]) == 1
    in_file = ring_format.parse_ring(writer.path.read_bytes())
    assert in_file.header.attempt_id == "a1" and [slot.step for slot in in_file.slots] == [1, 2, 3, 4, 5]
    writer.close(remove=True)


def test_after_its_end_the_rings_memory_is_gone_and_stores_touch_nothing(tmp_path):
    """At its end the run's segment is removed and let go: the step hook's store lands in
    a buffer of its own, the worker's mark and a late sampled step touch nothing (no file,
    no memory that is gone)."""
    before = set(segments())
    flight, _ = _start(tmp_path, "job-a", 1)
    clock = StepClock()
    flight.attach(clock)
    clock.finished[0] = 5
    (path,) = tmp_path.glob("*.flight")
    assert finished_steps_of(str(tmp_path / "train_metric.json"), 0)["next1"].step == 5
    (segment,) = set(segments()) - before
    assert segment == _segment_of(path)
    flight.close(lambda: 1.0)
    assert set(segments()) == before
    other = tmp_path / "other"
    fd = os.open(other, os.O_RDWR | os.O_CREAT)  # likely the ring's old number
    try:
        os.write(fd, bytes(100))
        clock.finished[0] = 6
        flight.written(6)
    finally:
        os.close(fd)
    assert other.read_bytes() == bytes(100)
    assert not path.exists()


# --- real trainings, real deaths -------------------------------------------------------------


def _cli_report(folder: Path) -> dict:
    return json.loads(cli_output("report", str(folder), "--json", cwd=folder))


def _die_at(
    tmp_path: Path, step: int, how: str, interval: int, steps: int = 200, popen: dict | None = None, **extra
) -> subprocess.Popen:
    spec = {
        "config": {
            "interval": interval,
            "output_type": ["json_file"],
            "json_log_path": str(tmp_path / "out" / "train_metric.json"),
            **extra.pop("config", {}),
        },
        "steps": steps,
        "graph": True,
        "report": str(tmp_path / "report.json"),
        "at": {str(step): [["die", how]]},
        **extra,
    }
    return spawn(spec, tmp_path, **(popen or {}))


def _sampled_steps(interval: int, last: int) -> list[int]:
    """The steps a run samples (the first, then every interval-th), up to `last`."""
    return [1] + [s for s in range(2, last + 1) if s % interval == 0]


def _check_recovered_log(log: Path, interval: int, killed_at: int) -> list[dict]:
    lines = json_lines(log)  # every line whole
    steps = [line["step"] for line in lines]
    assert steps == _sampled_steps(interval, killed_at), steps
    recovered = [line for line in lines if line.get("recovered")]
    # The recovered ones are the last: what the worker had not written when the process died.
    assert lines[len(lines) - len(recovered) :] == recovered
    # The run monitored the step time (the default): its window's time is kept in the ring.
    assert all(line[tm.STEP_TIME] > 0 for line in recovered), recovered
    return lines


@pytest.mark.slow  # real trainings, killed
@pytest.mark.parametrize(
    ("interval", "killed_at"),
    [(1, 23), (1, 133), (10, 11), (10, 57), (10, 60)],  # 11: right after a sampled step; 57: mid-window
)
def test_sigkill_the_log_ends_at_the_last_sampled_step_and_report_gives_the_step(tmp_path, interval, killed_at):
    """The exact tail and step come from the dead run's shared memory, which `report` writes
    into the ring's file and removes."""
    before = set(segments())
    process = _die_at(tmp_path, killed_at, "SIGKILL", interval)
    finish(process)
    assert process.returncode == -signal.SIGKILL
    log = tmp_path / "out" / "train_metric.json"
    (ring,) = (tmp_path / "out").glob("*.flight")
    (left,) = set(segments()) - before
    assert left == _segment_of(ring) and segments()[left].attached == 0
    report = _cli_report(tmp_path / "out")
    assert set(segments()) == before and _segment_of(ring) == -1
    _check_recovered_log(log, interval, killed_at)
    (attempt,) = report["job"]["attempts"]
    assert (attempt["outcome"], attempt["last_step"]) == ("killed", killed_at)
    # A second reader finds nothing more to recover: each record once.
    before = log.read_bytes()
    assert _cli_report(tmp_path / "out")["job"]["attempts"][0]["last_step"] == killed_at
    assert log.read_bytes() == before


@pytest.mark.slow  # real trainings, killed
@pytest.mark.parametrize("gone", ["removed after the kill", "with its IPC namespace"])
def test_after_a_sigkill_without_its_segment_the_file_gives_the_ring_as_of_the_last_batch(tmp_path, gone):
    """The dead run's segment removed (`ipcrm`, kernel.shm_rmid_forced: one warning), or gone
    with the IPC namespace it ran in (a container that ended: not looked for, no warning):
    the ring's file holds what the worker copied after its last batch, and `report` gives
    that: its last step and its records, every line whole."""
    before = set(segments())
    popen = {"preexec_fn": in_own_namespace} if gone == "with its IPC namespace" else {}
    process = _die_at(tmp_path, 57, "SIGKILL", 10, popen=popen)
    finish(process)
    assert process.returncode == -signal.SIGKILL
    out = tmp_path / "out"
    (ring,) = out.glob("*.flight")
    in_file = ring_format.parse_ring(ring.read_bytes())
    segment = in_file.header.segment
    if gone == "removed after the kill":
        assert finished_steps_of(str(out / "train_metric.json"), 0)[in_file.header.attempt_id].step == 57
        assert set(segments()) - before == {segment.id}
        shm.remove(segment.id)
    else:
        assert set(segments()) == before and segment.namespace != shm.namespace()[1]
    last_slot = in_file.slots[-1].step
    done = cli("report", str(out), "--json", cwd=out)
    assert done.returncode == 0, done.stderr[-3000:]
    (attempt,) = json.loads(done.stdout)["job"]["attempts"]
    assert attempt["last_step"] == max(in_file.header.finished_step, last_slot) <= 57
    assert [line["step"] for line in json_lines(out / "train_metric.json")] == _sampled_steps(10, last_slot)
    warned = done.stderr.count("names shared memory that cannot be taken as its own")
    assert warned == (1 if gone == "removed after the kill" else 0), done.stderr[-3000:]


@pytest.mark.slow  # a real training refused shared memory, killed
def test_without_shared_memory_a_kill_loses_only_the_steps_after_the_last_sampled_one(tmp_path):
    """The kernel refuses every segment (kernel.shmmni = 0 in the training's own IPC
    namespace): one warning, the training runs, its ring is its file, each sampled step
    written as it is taken. Killed at 57, its log ends at 50, and its last step is 50 or the
    step the worker's last copy saw."""
    process = _die_at(tmp_path, 57, "SIGKILL", 10, popen={"preexec_fn": without_shared_memory})
    _, err = finish(process)
    assert process.returncode == -signal.SIGKILL
    assert err.count("no shared memory for the flight ring") == 1, err[-3000:]
    out = tmp_path / "out"
    (ring,) = out.glob("*.flight")
    in_file = ring_format.parse_ring(ring.read_bytes())
    assert in_file.header.segment.id == -1 and in_file.slots[-1].step == 50
    report = _cli_report(out)
    _check_recovered_log(out / "train_metric.json", 10, 57)
    assert report["job"]["attempts"][0]["last_step"] == max(50, in_file.header.finished_step)


@pytest.mark.slow  # real trainings, dying
@pytest.mark.parametrize("how", ["abort", "segfault", "exit"])
def test_abort_segfault_and_exit_without_handlers_lose_nothing(tmp_path, how):
    process = _die_at(tmp_path, 57, how, 10)
    finish(process)
    assert process.returncode != 0
    report = _cli_report(tmp_path / "out")
    _check_recovered_log(tmp_path / "out" / "train_metric.json", 10, 57)
    assert report["job"]["attempts"][0]["last_step"] == 57


@pytest.mark.slow  # a real training killed, then the job's next attempt
def test_the_next_attempt_recovers_the_tail_into_tensorboard_too(tmp_path):
    """TensorBoard flushes its event file every second: a kill loses the last second of
    scalars. The job's next attempt writes them from the ring before its own outputs set
    the dead run's files aside, so TensorBoard's own reader finds every step."""
    board = tmp_path / "board"
    config = {"job_id": "tb-job", "output_type": ["json_file", "tensorboard"], "tensorboard_path": str(board)}
    before = set(segments())
    killed = _die_at(tmp_path, 150, "SIGKILL", 1, config=config)
    finish(killed)
    assert killed.returncode == -signal.SIGKILL
    assert len(set(segments()) - before) == 1, "the killed run's shared memory stays"
    next_attempt = spawn(
        {"config": {"interval": 1, "json_log_path": str(tmp_path / "out" / "train_metric.json"), **config},
         "steps": 3, "report": str(tmp_path / "next.json")},
        tmp_path,
    )  # fmt: skip
    _, err = finish(next_attempt)
    assert next_attempt.returncode == 0, err[-3000:]
    assert "recovered" in err
    assert set(segments()) == before, "the next attempt removed it; its own went at its end"
    (dead_run,) = [folder for folder in (board / "rank_0").iterdir() if folder.is_dir()]  # set aside
    assert loss_steps(dead_run) == list(range(1, 151))


@pytest.mark.slow  # a real training killed between its outputs' writes, then the job's next attempt
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_death_between_the_outputs_writes_shows_each_tensorboard_step_once(tmp_path, when):
    """The outputs write a batch one after the other, and the ring's mark moves after all of
    them. Killed after the JSON log wrote a batch and before TensorBoard did, the JSON log
    held steps TensorBoard lacked, and the next attempt recovered only what the JSON log
    lacked: TensorBoard lost up to a batch (64 steps) in the middle (issue 46 item 4: steps
    66-129 of 150 on a loaded CI row). Killed after TensorBoard wrote it too, before the
    mark moved, the batch must not show twice."""
    board = tmp_path / "board"
    config = {"job_id": "tb-job", "output_type": ["json_file", "tensorboard"], "tensorboard_path": str(board)}
    killed = _die_at(
        tmp_path, 10_000, "SIGKILL", 1, config=config, at={"40": [["die_writing", "tensorboard", when, "SIGKILL"]]}
    )
    finish(killed)
    assert killed.returncode == -signal.SIGKILL
    next_attempt = spawn(
        {"config": {"interval": 1, "json_log_path": str(tmp_path / "out" / "train_metric.json"), **config},
         "steps": 3, "report": str(tmp_path / "next.json")},
        tmp_path,
    )  # fmt: skip
    _, err = finish(next_attempt)
    assert next_attempt.returncode == 0, err[-3000:]
    (dead_run,) = [folder for folder in (board / "rank_0").iterdir() if folder.is_dir()]  # set aside
    steps = loss_steps(dead_run)
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] >= 40, steps


@pytest.mark.slow  # a real training, killed from outside
def test_a_sigkill_from_outside_as_the_oom_killer_sends_it(tmp_path):
    """This machine's cgroup v2 has no memory controller (and the v1 memory cgroup is the
    sandbox's): the kernel's OOM killer is played by its signal, SIGKILL from another
    process, while the training thread is inside the step (the step's callbacks)."""
    marker = tmp_path / "at-step-45"
    spec_extra = {"at": {"45": [["touch", str(marker)], ["sleep", 600]]}}
    process = _die_at(tmp_path, 10_000, "SIGKILL", 10, **spec_extra)
    try:
        wait_until(marker.exists, "the worker at step 45", process, timeout=180)
        process.send_signal(signal.SIGKILL)
    finally:
        finish(process)
    report = _cli_report(tmp_path / "out")
    _check_recovered_log(tmp_path / "out" / "train_metric.json", 10, 45)
    assert report["job"]["attempts"][0]["last_step"] == 45


@pytest.mark.slow  # two real trainings as two ranks, one killed
def test_two_ranks_one_killed_the_others_log_and_ring_are_untouched(tmp_path):
    """Two processes with RANK_ID / RANK_SIZE set as msrun sets them, one folder."""
    out = tmp_path / "out"
    marker = tmp_path / "rank0-at-30"
    config = {"interval": 10, "output_type": ["json_file"], "json_log_path": str(out / "train_metric.json")}
    rank0 = spawn(
        {"config": config, "steps": 200, "graph": True, "report": str(tmp_path / "r0.json"),
         "at": {"30": [["touch", str(marker)], ["sleep", 600]]}},
        tmp_path, env={"RANK_ID": "0", "RANK_SIZE": "2", "DEVICE_ID": "0"},
    )  # fmt: skip
    try:
        wait_until(marker.exists, "rank 0 at step 30", rank0, timeout=180)
        rank0_log = out / "train_metric_rank_0.json"
        (rank0_ring,) = out.glob("train_metric.rank_0.*.flight")
        wait_until(
            lambda: ring_format.parse_header(rank0_ring.read_bytes()).written_step == 30, "rank 0's line 30", rank0
        )
        rank0_bytes, rank0_lines = rank0_ring.read_bytes(), rank0_log.read_bytes()
        rank1 = spawn(
            {"config": config, "steps": 200, "graph": True, "report": str(tmp_path / "r1.json"),
             "at": {"57": [["die", "SIGKILL"]]}},
            tmp_path, env={"RANK_ID": "1", "RANK_SIZE": "2", "DEVICE_ID": "1"},
        )  # fmt: skip
        finish(rank1)
        assert rank1.returncode == -signal.SIGKILL
        _cli_report(out)
        _check_recovered_log(out / "train_metric_rank_1.json", 10, 57)
        assert rank0_ring.read_bytes() == rank0_bytes, "rank 0's live ring was written by someone else"
        assert rank0_log.read_bytes() == rank0_lines
        assert not any(line.get("recovered") for line in json_lines(rank0_log))
        assert [far.step for far in finished_steps_of(config["json_log_path"], 1).values()] == [57]
        assert [far.step for far in finished_steps_of(config["json_log_path"], 0).values()] == [30]
    finally:
        rank0.kill()
        finish(rank0)


@pytest.mark.slow  # a real training in a folder it may not write
def test_a_ring_in_a_read_only_folder_is_one_warning_and_training_goes_on(tmp_path):
    """The segment made before the file was refused goes with it: nothing is left in memory."""
    before = set(segments())
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        spec = {
            "config": {"interval": 5, "output_type": ["stdout"], "json_log_path": str(folder / "train_metric.json")},
            "steps": 20,
            "report": str(tmp_path / "report.json"),
        }
        process = spawn(spec, tmp_path, preexec_fn=obey_file_permissions)
        _, err = finish(process)
        assert process.returncode == 0, err[-3000:]
        assert err.count("cannot keep a flight ring") == 1, err[-3000:]
        assert list(folder.iterdir()) == []
        assert set(segments()) == before
    finally:
        folder.chmod(0o755)


# --- what others do to a live run's folder, and what they plant in it ---------------------------


def _header_or_none(path: Path) -> ring_format.Header | None:
    try:
        return ring_format.parse_header(path.read_bytes())
    except ring_format.RingError:
        return None


def _written_past(path: Path, step: int) -> bool:
    header = _header_or_none(path)
    return header is not None and header.written_step > step


@pytest.mark.slow  # a real training whose ring another process cuts, twice
def test_a_ring_cut_by_another_process_never_stops_the_training(tmp_path):
    """`: > out/*`, logrotate's copytruncate, a size-based cleaner (issue 46): the ring's
    file cut to half at step 20 and to nothing at step 40, the training storing on after
    each. It finishes (a store into a shrunk file mapping was a SIGBUS, rc -7), says so once,
    its ring's file is whole again at step 60, as the next attempt would read it, and its
    shared memory is gone at its end."""
    before = set(segments())
    out = tmp_path / "out"
    marks = {step: (tmp_path / f"at-{step}", tmp_path / f"go-{step}") for step in (20, 40, 60)}
    spec = {
        "config": {"interval": 1, "output_type": ["json_file"], "json_log_path": str(out / "train_metric.json")},
        "steps": 80,
        "graph": True,
        "report": str(tmp_path / "report.json"),
        "at": {str(step): [["touch", str(at)], ["await", str(go)]] for step, (at, go) in marks.items()},
    }
    process = spawn(spec, tmp_path)
    try:
        for step, cut_to in [(20, FILE_BYTES // 2), (40, 0), (60, None)]:
            at, go = marks[step]
            wait_until(at.exists, f"the training at step {step}", process, timeout=180)
            (ring,) = out.glob("*.flight")
            if cut_to is not None:
                os.truncate(ring, cut_to)
            else:  # the worker finds the cut at its next batch and writes the whole ring back
                # Waited for, not read once: the worker may put the ring back at the end of a
                # batch of steps up to 40 it handled after the cut (its header then says so
                # until its next batch), and a reader may meet its 300 KB write half done.
                wait_until(lambda ring=ring: _written_past(ring, 40), "the ring back, with steps past the cut", process)
                wait_until(
                    lambda: [far.step for far in finished_steps_of(str(out / "train_metric.json"), 0).values()] == [60],
                    "the ring read whole, at step 60",
                    process,
                )
            go.touch()
    finally:
        _, err = finish(process)
    assert process.returncode == 0, err[-3000:]
    assert err.count("was cut or overwritten by another process") == 1, err[-3000:]
    assert [line["step"] for line in json_lines(out / "train_metric.json")] == list(range(1, 81))
    assert list(out.glob("*.flight*")) == []
    assert set(segments()) == before


@pytest.mark.slow  # the commands and a real training beside planted rings
@pytest.mark.analysis
def test_planted_rings_write_nothing_and_stop_no_command_nor_the_next_attempt(tmp_path):
    """A ring made by the package's own writer, naming `../victim.txt` and a job id that is
    shell code, and rings whose headers no run writes (a NaN clock, a NUL in a name, a last
    step of 2**62, a bad rank): `report`, `hang-report` and `replay` run on the folder, and
    then the job's next attempt trains there. Nothing outside the logs is written, nothing
    raises; each ring is set aside with one warning."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("echo first\necho last, no newline")
    real = _dead(_ring(out, job_id="job-a", attempt_id="real1"), range(1, 4))  # the job's own dead run
    _log(out / "train_metric.json", range(1, 3))
    planted = [
        _hostile_ring(out, case, attempt_id=f"planted{index}")
        for index, case in enumerate(
            [
                "a log outside its folder",
                "a NaN clock",
                "a NUL in the job id",
                "a negative rank",
                "a last step of 2**62",
            ]
        )
    ]
    with OtlpReceiver() as receiver:
        runs = [
            cli("report", str(out), cwd=tmp_path),
            cli("hang-report", str(out), cwd=tmp_path),
            cli("replay", str(out), "--endpoint", receiver.grpc_endpoint, "--insecure", cwd=tmp_path),
        ]
    for run in runs:
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert runs[0].returncode == 0, runs[0].stderr[-3000:]
    assert victim.read_text() == "echo first\necho last, no newline"
    assert not (tmp_path / "PWNED").exists()
    assert runs[0].stderr.count("cannot be read") == len(planted), runs[0].stderr
    assert [line["step"] for line in json_lines(out / "train_metric.json")] == [1, 2, 3]  # the real tail, once
    assert sorted(p.name for p in out.glob("*.corrupt")) == sorted(p.name + ".corrupt" for p in planted)
    assert real.exists()
    # The job's next attempt, with a ring planted again: it trains; its ring is no other's.
    again = _hostile_ring(out, "a log outside its folder", attempt_id="again")
    process = spawn(
        {"config": {"interval": 5, "job_id": "job-a", "output_type": ["json_file"],
                    "json_log_path": str(out / "train_metric.json")},
         "steps": 10, "report": str(tmp_path / "next.json")},
        tmp_path,
    )  # fmt: skip
    _, err = finish(process)
    assert process.returncode == 0, err[-3000:]
    assert err.count("cannot be read") == 1 and str(again) in err, err[-3000:]
    assert victim.read_text() == "echo first\necho last, no newline"
    assert not real.exists(), "report kept the job's dead ring for its last step; its next attempt removed it"


@pytest.mark.slow  # three real trainings: two killed before their first checkpoint
def test_runs_killed_before_a_checkpoint_and_started_again_get_their_records_back(tmp_path):
    """No job id, no checkpoint yet: each start from step 0 is a new job (restarts.md), and
    the dead run's ring is another job's. Its tail goes into its own log, which the new run
    then sets aside: no ring piles up, and `report` has nothing left to warn about."""
    out = tmp_path / "out"
    for index, kill_at in enumerate([37, 23, None]):
        spec = {
            "config": {"interval": 1, "output_type": ["json_file"], "json_log_path": str(out / "train_metric.json")},
            "steps": 40,
            "report": str(tmp_path / f"r{index}.json"),
            **({"at": {str(kill_at): [["die", "SIGKILL"]]}} if kill_at else {}),
        }
        process = spawn(spec, tmp_path)
        _, err = finish(process)
        assert process.returncode == (-signal.SIGKILL if kill_at else 0), err[-3000:]
    kept = sorted(out.glob("train_metric.*.json"))
    assert len(kept) == 2
    assert [[line["step"] for line in json_lines(log)] for log in kept] == [list(range(1, 38)), list(range(1, 24))]
    recovered = [line["step"] for log in kept for line in json_lines(log) if line.get("recovered")]
    assert recovered, "the test needs records the outputs had not written when the runs died"
    assert list(out.glob("*.flight*")) == []
    done = cli("report", str(out), cwd=tmp_path)
    assert done.returncode == 0 and "flight ring" not in done.stderr, done.stderr


@pytest.mark.slow  # two live trainings of one job on one rank
def test_a_second_launch_of_a_live_rank_is_named_and_no_clock_is_said_set_back(tmp_path):
    """A duplicated launch (same job id, same rank) starts while the first trains: its ring
    is locked, so it lives; the overlap is a second launch, not a clock set back (issue 46)."""
    out = tmp_path / "out"
    marker = tmp_path / "first-at-20"

    def spec(steps: int, **extra) -> dict:
        config = {"interval": 5, "job_id": "dup", "output_type": ["json_file"],
                  "json_log_path": str(out / "train_metric.json")}  # fmt: skip
        return {"config": config, "steps": steps, "report": str(tmp_path / f"r{steps}.json"), **extra}

    first = spawn(spec(100_000, at={"20": [["touch", str(marker)]]}), tmp_path)
    try:
        wait_until(marker.exists, "the first launch at step 20", first, timeout=180)
        second = spawn(spec(10), tmp_path)
        _, err = finish(second)
        assert first.poll() is None, "the first launch trained all along"
    finally:
        first.kill()
        finish(first)
    assert second.returncode == 0, err[-3000:]
    assert "clock was set back" not in err, err[-3000:]
    assert err.count(f"pid {first.pid}") == 1 and "is running" in err, err[-3000:]


# --- a job's restarts, as the issue tells them --------------------------------------------------

STEPS, SAVE = 10, 10


@pytest.mark.slow  # three real attempts of a job, two SIGKILLed
@pytest.mark.parametrize("report_between", [False, True], ids=["restarted", "report-between"])
def test_restarts_ten_lost_steps_and_the_recovered_records_reach_otlp_once_with_their_times(report_between):
    """Checkpoints every 10 steps; attempt 1 killed at 25, resumed from 20; attempt 2 killed
    at 35, resumed from 30; attempt 3 completes at 60. The heartbeat (every 5 s by default)
    lags the steps: the lost steps come from the rings. With `report_between`, a user runs
    `report` on the folder after each kill, before the next attempt: it writes the dead
    tail into the log, and the next attempt still sends it over OTLP, once."""
    with restart_worker.private_dir() as workdir, OtlpReceiver() as receiver:
        checkpoints, output = workdir / "ckpt", workdir / "output"
        checkpoints.mkdir()
        config = {
            "interval": 1,
            "output_type": ["json_file", "otlp"],
            "json_log_path": str(output / "train_metric.json"),
            "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc", "export_interval": 0.2},
        }
        base = {
            "config": config, "epochs": 6, "steps": STEPS, "checkpoint_dir": str(checkpoints), "save_steps": SAVE,
            "clock": str(workdir / "clock.jsonl"),
        }  # fmt: skip
        for extra, resume_step in [({"kill_at": 25}, None), ({"kill_at": 35, "initial_epoch": 2}, 20),
                                   ({"initial_epoch": 3}, 30)]:  # fmt: skip
            spec = {**base, **extra}
            if resume_step is not None:
                spec["resume"] = str(restart_worker.latest_checkpoint(checkpoints))
                assert spec["resume"].endswith(f"-{resume_step // STEPS}_{STEPS}.ckpt")
            with restart_worker.reaped(restart_worker.spawn(spec, workdir)) as process:
                _, err = process.communicate(timeout=300)
                assert process.returncode == (-signal.SIGKILL if "kill_at" in extra else 0), err[-4000:]
            if report_between and "kill_at" in extra:
                _cli_report(output)

        lines = json_lines(output / "train_metric.json")
        assert [line["step"] for line in lines] == list(range(1, 26)) + list(range(21, 36)) + list(range(31, 61))
        assert [line["job"]["attempt"] for line in lines] == [1] * 25 + [2] * 15 + [3] * 30
        report = _cli_report(output)["job"]
        assert [row["last_step"] for row in report["attempts"]] == [25, 35, 60]
        assert [row["lost_steps"] for row in report["attempts"]] == [5, 5, 0]
        assert report["totals"]["lost_steps"] == 10
        ledger = json.loads((output / "train_metric.job.rank_0.ledger").read_text())
        assert [a["last_step"] for a in ledger["attempts"]] == [25, 35, 60]  # the next attempts wrote them down

        recovered = [
            (line["job"]["attempt"], line["step"], line["time_stamp"]) for line in lines if line.get("recovered")
        ]
        assert recovered, "the test needs records the outputs had not written when the attempts died"

        def recovered_spans() -> list:
            return [s for s in receiver.spans(semconv.SPAN_STEP) if s.attributes.get(semconv.ATTR_RECOVERED)]

        receiver.wait_for(lambda rx: len(recovered_spans()) >= len(recovered), timeout=30)
        spans = recovered_spans()
        # Each recovered record once, sent by the next attempt, with the step's own end time.
        sent = sorted(
            (s.attributes[job_names.ATTR_ATTEMPT], s.attributes[semconv.ATTR_STEP], s.resource[job_names.ATTR_ATTEMPT])
            for s in spans
        )
        assert sent == sorted((attempt, step, attempt + 1) for attempt, step, _ in recovered)
        ends = {
            (s.attributes[job_names.ATTR_ATTEMPT], s.attributes[semconv.ATTR_STEP]): s.end_time_unix_nano for s in spans
        }
        for attempt, step, stamp in recovered:
            assert ends[(attempt, step)] / 1e9 == pytest.approx(stamp, abs=2e-6)
        # Each in the trace of its original step: the job step's trace and root, as every rank
        # of that attempt derived them (telemetry/step_ids.py).
        for span in spans:
            key = job_trace_key(ledger["job_id"], span.attributes[job_names.ATTR_ATTEMPT])
            window = span.attributes[semconv.ATTR_STEP] - span.attributes[semconv.ATTR_STEPS_IN_WINDOW]
            assert (int(span.trace_id, 16), int(span.parent_span_id, 16)) == job_step_ids(key, window)
        # No ring is left: each was recovered and removed, the last run's once it wrote all.
        assert list(output.glob("*.flight")) == []

        # `replay` of the log joins the live data: each attempt's job id and attempt, each step
        # in the trace and under the root that the live step span of that step has (attempt 3's,
        # and the recovered ones: the killed attempts' own spans died in their export queues).
        def by_step(spans: list) -> dict:
            return {
                (s.attributes.get(job_names.ATTR_ATTEMPT, s.resource[job_names.ATTR_ATTEMPT]),
                 s.attributes[semconv.ATTR_STEP]): (s.resource[semconv.ATTR_JOB_ID], s.trace_id, s.parent_span_id)
                for s in spans
            }  # fmt: skip

        live = by_step(receiver.spans(semconv.SPAN_STEP))
        with OtlpReceiver() as replayed:
            assert cli("replay", str(output), "--endpoint", replayed.grpc_endpoint).returncode == 0
            again = by_step(replayed.spans(semconv.SPAN_STEP))
        assert len(live) >= 30 + len(recovered) and {key: again[key] for key in live} == live


@pytest.mark.slow  # a real 2-rank msrun job, one rank SIGKILLed
@pytest.mark.integration
@pytest.mark.msrun_job
def test_under_msrun_a_killed_ranks_tail_goes_to_its_own_log_only():
    """Rank 1 kills itself after step 23; msrun ends the job (rank 0 dies with it, however
    msrun ends it). Each rank's log, after `report`, holds its own lines only: every rank's
    tail went to its own log, once, and the killed rank's last step is exact."""
    with restart_worker.private_dir() as workdir:
        config = {
            "interval": 5, "output_type": ["json_file"], "json_log_path": "./output/train_metric.json",
            "report_ranks": "all",
        }  # fmt: skip
        spec = {"config": config, "epochs": 1, "steps": 60, "kill_rank": 1, "kill_at": 23}
        command = [
            str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
            "--join=True", f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "msrun_restart_worker.py"), json.dumps(spec),
        ]  # fmt: skip
        job = subprocess.run(command, cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=600)
        assert job.returncode != 0
        output = workdir / "output"
        report = _cli_report(output)
        for rank in (0, 1):
            lines = json_lines(output / f"train_metric_rank_{rank}.json")
            assert {line["rank"] for line in lines} == {rank}
            steps = [line["step"] for line in lines]
            assert steps == sorted(set(steps)), f"rank {rank}: a step twice or out of order: {steps}"
            assert steps[0] == 1 and all(s % 5 == 0 for s in steps[1:]), steps
        rank1 = [line["step"] for line in json_lines(output / "train_metric_rank_1.json")]
        assert rank1 == [1, 5, 10, 15, 20]
        (attempt,) = report["job"]["attempts"]
        (rank1_run,) = finished_steps_of(str(output / "train_metric.json"), 1).values()
        assert rank1_run.step == 23 and not rank1_run.alive
        # Rank 0 cannot pass step 23 without rank 1's gradients: the job's last step is 23.
        assert attempt["last_step"] == 23
