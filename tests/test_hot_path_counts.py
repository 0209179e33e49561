"""What our step hooks do inside a real `Model.train` loop, counted (not timed): Python and C
calls, bytecodes, `with` blocks, lock acquisitions, calls into the OpenTelemetry SDK, and
memory allocated. An unsampled step must stay at the floor; a sampled step (the read plan's
steady state, docs/performance.md) within today's counts. A change that adds work to either
fails here, whatever the machine's load; raise a budget only with a reason in the commit.
The same for one `otel_mindformers.phase()` entered and exited in a user's hook."""

import tracemalloc
from typing import Any

import mindspore as ms
import pytest
from mindspore.train import Callback

import otel_mindformers
from otel_mindformers import MonitorCallback
from tests.support import training
from tests.support.clusterd import ClusterD
from tests.support.configs import config
from tests.support.hook_counts import HookCounter
from tests.support.in_memory import Capture

pytestmark = pytest.mark.slow  # real training runs

INTERVAL = 5
TRACED = {2, 3, 10, 15, 22}  # unsampled 2, 3, 22; sampled 10, 15 (the plan made at step 5)
MEASURED = {6, 7, 8, 16, 17, 20}  # unsampled, and sampled 20, with tracemalloc
# Per hook call. The hook's own frame is one Python call; perf_counter the one C call.
# The step hooks read one object, the run's StepClock (core/clock.py): 28 -> 24 bytecodes at
# step begin; 56 -> 45 at an unsampled step end (the custom-monitor, stop and capture checks
# folded into one `wake` flag beside `next_sample` and `step_offset`).
# 45 -> 50 at step end: the job's step stored into the flight ring's mapped page
# (`clock.finished[0] = step`, a memoryview store, no call: ~15 ns over an attribute store).
# 50 -> 57, and one system call the profile did not count: the ring was written with pwrite
# (`clock.keep()`, a functools.partial of os.pwrite), not through a shared file mapping that
# another process can shrink under the run (a SIGBUS). 57 -> 50 and no system call again: the
# ring is a System V shared-memory segment, whose size no other process can change
# (`clock.finished[0] = step` stores into it, as into the mapped page before).
# `io_calls`: the kernel's count of the training thread's read and write system calls over the
# hook (what the profile cannot see): none on any step. docs/flight_recorder.md has the cost.
# 24 -> 30 at step begin: `clock.step >= clock.arm_after`, two attribute reads and a compare
# (no call): the gradient-norm reader may ask for its probes' call counts before a sampled
# step, where a cell does not update on every step (model_state/grad_norm_reader.py).
STEP_BEGIN = {"python_calls": 1, "c_calls": 1, "opcodes": 30}
UNSAMPLED_END = {"python_calls": 1, "c_calls": 1, "opcodes": 50}
SAMPLED_END = {  # by step-output shape: a scalar loss; MindFormers' 5-tuple
    # +16 bytecodes over 333 / 427: the unsampled step's 7, the batch-note and the attempt's
    # first-step checks (attributes read, no call: a call would cost far more cold); +10 for
    # `wake` (cleared, and set again while custom monitors or a capture want every step).
    # Then 9 -> 6 / 12 -> 6 Python calls: the read plan calls `Tensor._item` itself (not
    # `item()`, its Python wrapper), and the inbox says it was written in an attribute.
    # +9 bytecodes (no call): the window's phase seconds taken off the StepClock and handed
    # over with the window, so an evaluation or a save in it is not step time.
    # +1 C call, +4 bytecodes: the hand-off is a named SampledStep (core/sampled_step.py),
    # built with `tuple.__new__` (343 -> 347 / 422 -> 426, 10 -> 11 / 16 -> 17 C calls); the
    # worker no longer unpacks a positional tuple into a Window (one Python call and one C
    # call fewer there per record).
    # +3 bytecodes (no call): the read plan asks whether a GradNormProbe's norm is to be
    # read (347 -> 350 / 426 -> 429). With one (`grad_monitor: True`, a scalar loss): its
    # frame, the overflow look-up, its `_item` readback and the float (+1 Python call, +3 C
    # calls, +48 bytecodes over the scalar loss).
    # The flight ring (flight_recorder/ring.py): the sampled step's readings stored word by
    # word into the ring's next slot (RingWriter.write, called straight from the run: +1
    # Python call; +2 C calls: the keys' tuple and the layout's lookup; the stores are
    # bytecodes, a `struct.pack_into` of the slot cost twice as much inside Model.train):
    # 6 -> 7 Python calls, 11 -> 13 / 17 -> 19 C calls, 347 -> 557 / 426 -> 669 bytecodes
    # (one loop turn per value). bench_flight_recorder.py: docs/flight_recorder.md.
    # With both: 350 -> 560 / 429 -> 672; the probe's case 398 -> 619 (its norm one more value
    # in the ring), 7 -> 8 Python calls, 14 -> 16 C calls.
    # The slot packed by one Struct (its layout derived from SampledStep's fields) and written
    # by one pwrite, not stored word by word into a shared mapping (a SIGBUS when another
    # process shrank the file): 560 -> 449 / 672 -> 528 / 619 -> 497 bytecodes (no loop turn
    # per value), +2 C calls (the pack, the pwrite; the values' view) 13 -> 15 / 19 -> 21 / 16 -> 18.
    # The slot holds the step: the step hook's own write is for the steps it does not sample.
    # The slot stored word by word into the ring's shared memory, no pack and no pwrite
    # (docs/flight_recorder.md has the cost of each way): the mapped version's C calls, and
    # 45 bytecodes over the mapped version's, whose stores of the window's readings were
    # written out one by one; here they are a loop over SampledStep's readings, so the slot's
    # layout stays derived from its fields. The gradient-norm probe: its call count read back
    # beside its norm, and whether this step applied gradients, decided from the counts
    # (model_state/grad_norm_reader.py; one frame, as before): +1 C call.
    # +4 bytecodes: the model state is read only where there can be some (a train cell's
    # outputs, or the inbox written: runtime/state_reader.py `reads_outputs`), which spares the
    # run API's sampled step the reader's frame (RUN_API_SAMPLED_EXIT).
    "scalar": {"python_calls": 7, "c_calls": 13, "opcodes": 618},
    "tuple5": {"python_calls": 7, "c_calls": 19, "opcodes": 730},
    "probe": {"python_calls": 8, "c_calls": 17, "opcodes": 782},
    # The scalar loss with MindCluster heard and told (cluster/, a ClusterD on 127.0.0.1):
    # its subscription, verdicts and teller are other threads'; the step hooks count the same.
    "cluster": {"python_calls": 7, "c_calls": 13, "opcodes": 618},
}
# A user's hook that is one `with phase("upload"): pass`, in a run (the hook's frame is one of
# the Python calls). Its span, histogram point and ledger charge are the pipeline worker's
# (timing/phases.py); the calling thread's opentelemetry calls are the context API's only.
# (Before, with the span started and ended here: 123 Python calls, 88 C calls, 2277 bytecodes.)
# (+2 bytecodes: the data wait it leaves is the StepClock's, read through a local.)
# (+21 bytecodes, no call: its seconds added to the window's phases, which are not step time,
# and, between steps, to those after the step that ended last: after a run's last step they
# lie outside its last window.)
# (+3 bytecodes, no call: a phase that closes after its run ended leaves that run's clock alone.)
PHASE = {"python_calls": 30, "c_calls": 27, "opcodes": 655, "sdk_calls": 12, "with_blocks": 3}


# "probe": the scalar loss with `grad_monitor: True`, whose norm a GradNormProbe writes in the
# step (model_state/grad_norm_probe.py): an unsampled step stays at the floor (no readback).
@pytest.fixture(params=["scalar", "tuple5", "probe", "cluster"])
def counted(request, workdir, monkeypatch):
    config = {
        "interval": INTERVAL,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(workdir / "m.json"),
    }
    if request.param == "probe":
        config["grad_monitor"] = True
    if request.param == "cluster":
        clusterd = ClusterD(jobs={"job-1"}).start()
        request.addfinalizer(clusterd.stop)
        for name, value in (("MINDX_TASK_ID", "job-1"), ("MINDX_SERVER_IP", "127.0.0.1"), ("NODE_NAME", "node-1")):
            monkeypatch.setenv(name, value)
        config["cluster"] = {"port": clusterd.port, "tell": True}
    callback = MonitorCallback(config)
    counter = HookCounter(
        callback,
        ("on_train_step_begin", "on_train_step_end"),
        trace=TRACED.__contains__,
        allocations=MEASURED.__contains__,
    )
    tracemalloc.start()
    try:
        shape = "scalar" if request.param in ("probe", "cluster") else request.param
        training.train([callback], steps=25, shape=shape, mode=ms.GRAPH_MODE)
    finally:
        tracemalloc.stop()
    if request.param == "cluster":
        assert clusterd.registrations == [("job-1", "otel-mindformers")]  # it was on
    return request.param, counter.counts


def _within(count, budget):
    return {key: getattr(count, key) for key in budget if getattr(count, key) > budget[key]}


def test_unsampled_step_does_nothing_more(counted):
    _, counts = counted
    for hook in ("on_train_step_begin", "on_train_step_end"):
        # The clock readings are floats from the free list: nothing allocated (the least over
        # five steps: tracemalloc also sees a background thread allocating meanwhile).
        measured = [counts[hook][step] for step in sorted(MEASURED - {20})]
        assert min(c.allocated_bytes for c in measured) <= 0, f"{hook}: {[str(c) for c in measured]}"
    for step in (2, 3, 22):
        begin, end = counts["on_train_step_begin"][step], counts["on_train_step_end"][step]
        assert not _within(begin, STEP_BEGIN), f"step {step}: {begin}"
        assert not _within(end, UNSAMPLED_END), f"step {step}: {end}"
        for count in (begin, end):
            assert count.with_blocks == count.lock_calls == count.sdk_calls == 0, f"step {step}: {count}"
            assert count.io_calls == 0, f"step {step}: {count}"  # no read or write system call


def test_sampled_step_stays_within_its_counts(counted):
    shape, counts = counted
    for step in (10, 15):
        end = counts["on_train_step_end"][step]
        assert not _within(end, SAMPLED_END[shape]), f"step {step}: {end}"
        # No lock taken, no `with`, nothing of the SDK: spans and instruments are the worker's;
        # no read or write system call: the flight ring's slot is a store into shared memory.
        assert end.with_blocks == end.lock_calls == end.sdk_calls == end.io_calls == 0, f"step {step}: {end}"


class _OnePhase(Callback):
    def on_train_step_end(self, run_context):
        with otel_mindformers.phase("upload"):
            pass


def test_a_phase_enter_and_exit_stays_within_its_counts(workdir):
    capture = Capture()
    marker = _OnePhase()
    counter = HookCounter(marker, ("on_train_step_end",), trace={4, 5, 12}.__contains__, allocations=lambda step: False)
    training.train([capture.callback(config(workdir)), marker], steps=15, mode=ms.GRAPH_MODE)

    assert len(capture.finished("mindformers.phase.upload")) == 15  # the counted ones recorded too
    for step, count in counter.counts["on_train_step_end"].items():  # unsampled 4, 12; sampled 5
        assert not _within(count, PHASE), f"step {step}: {count}"
        assert count.lock_calls == 0, f"step {step}: {count}"


# The run API (runtime/run_api.py) in a real PyNative custom loop: `run.step(n)`, entering and
# leaving its `with`, and `run.log(loss=..., grads=...)`, each counted as the callback's hooks
# are (tests/support/hook_counts.py `traced`: each count holds the harness's lambda, one
# Python call, one C call and its bytecodes). An unsampled step: two clock reads, stores, no
# readback, no norm, no allocation kept; a sampled one: the norm's graph launched, the values
# read back, one SampledStep handed over (runtime/logged_values.py).
# The sampled step's end was mostly MindSpore's own `jit` call of the norm's graph (its Python
# wrapper, mindspore/graph/api.py, and `mutable`): 131 Python calls, 210 C calls, 3677
# bytecodes (with the epoch named from the step and the norm's graph picked: per-parameter
# norms where `local_norm_format` asks). The graph compiled once per input signature and run
# from its phase by the graph executor (compat/mindspore_graph.py: each gradient's shape and
# dtype compared, then one C call) leaves RUN_API_SAMPLED_EXIT; docs/performance.md has the
# time each way. Then 50 / 36 / 1218 -> 29 / 22 / 1028: `value_and_grad`'s tuple goes to the
# graph without an ABC check and a call per gradient, a tensor is read before its shape is
# asked (both told apart only when the graph or the read fails: runtime/logged_values.py).
# +4: a step number past an int64 is refused (runtime/run_api.py `_step_end`); +1: the
# norm's run inside a `try` (a phase MindSpore let go, as `mindspore.ms_memory_recycle()`
# does, is compiled again: compat/mindspore_graph.py).
# Then 29 / 22 / 1033 -> 11 / 19 / 887: after a PyNative step each frame is cold, so frames
# went: the graph's input check reads each gradient's shape and dtype from their C
# attributes (compat/mindspore_tensor.py `shape_and_dtype`: 2 property frames per gradient
# before, and the list comprehension's), a value is told a MindSpore tensor by a C check
# (`NATIVE_TENSOR`: a Parameter cost an ABC's frame, `has_init` one per value) and read in
# the reader's own loop (`_host` only for other values), the compiled norm is looked up
# without a call, and the model state's reader is not called where there is none to read.
# 887 -> 890: one flag tested (`grad_monitor: True` in a loop that logs no gradients is
# said at the first sampled step: runtime/logged_values.py), no call.
RUN_API_SAMPLED_EXIT = {"python_calls": 11, "c_calls": 19, "opcodes": 890}
# The step scope is the run's StepClock (runtime/run_api.py `Step`): enter and exit touch one
# object, not the scope, the run, the clock and the step view (58 -> 52 and 70 -> 56
# bytecodes; PyNative's per-step time in docs/performance.md). `step` 20 -> 25, +1 C call:
# `operator.index` of the step number (a float is one clear TypeError, not a failed store
# into the flight ring at the step's end). Enter lets the last step's logged values go while
# the loop's variables still hold them (six stores, no call); freed in `log`, a PyNative loss
# waited there for the device queue on the training thread. `log` 49 -> 55: one comparison
# sends a second call in the step to the slower path that adds to the first's values.
RUN_API_UNSAMPLED = {
    "step": {"python_calls": 2, "c_calls": 2, "opcodes": 25},
    "enter": {"python_calls": 2, "c_calls": 2, "opcodes": 52},
    "log": {"python_calls": 2, "c_calls": 1, "opcodes": 55},
    "exit": {"python_calls": 2, "c_calls": 2, "opcodes": 56},
}


def test_the_run_api_counts_like_the_callback(workdir):
    from tests.support import custom_loop
    from tests.support.hook_counts import traced

    loop = custom_loop.build()
    config = {
        "interval": INTERVAL,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(workdir / "m.json"),
    }
    counts: dict[int, dict[str, Any]] = {}
    with otel_mindformers.start(config, optimizer=loop.optimizer) as run:
        for step, (x, y) in enumerate(custom_loop.Data(25).batches(), start=1):
            if step not in TRACED:
                with run.step(step):
                    loss, grads = loop.train_step(x, y)
                    run.log(loss=loss, grads=grads)
                continue
            counted = counts[step] = {}
            counted["step"], scope = traced(run.step, step)
            counted["enter"], _ = traced(scope.__enter__)
            loss, grads = loop.train_step(x, y)
            counted["log"], _ = traced(run.log, loss=loss, grads=grads)
            counted["exit"], _ = traced(scope.__exit__, None, None, None)
    for step in (2, 3, 22):
        for part, budget in RUN_API_UNSAMPLED.items():
            count = counts[step][part]
            assert not _within(count, budget), f"step {step} {part}: {count}"
            assert count.with_blocks == count.lock_calls == count.sdk_calls == count.io_calls == 0, f"{step}: {count}"
    for step in (10, 15):
        count = counts[step]["exit"]
        assert not _within(count, RUN_API_SAMPLED_EXIT), f"step {step}: {count}"
        assert count.with_blocks == count.lock_calls == count.sdk_calls == count.io_calls == 0, f"step {step}: {count}"
