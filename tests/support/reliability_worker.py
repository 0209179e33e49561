"""A training process for the reliability suite: a real MindSpore run with MonitorCallback,
plus faults injected at chosen steps, reporting what it saw to a JSON file.

    python -m tests.support.reliability_worker '<json spec>'

Spec keys: `config` (monitor_config mapping), `steps`, `shape` ("scalar" / "tuple3" /
"tuple5"), `graph` (bool), `report` (path of the JSON report), `log_level` (configure
Python logging to stderr at that level), and `at`: step -> list of actions run after
MonitorCallback's hook of that step:
- ["touch", path]            create a marker file (the parent waits for it);
- ["sleep", seconds]         hold the training thread;
- ["await", path]            hold the training thread until the file exists (the parent made it:
                             what it did meanwhile happened between this step and the next);
- ["raise", message]         raise RuntimeError(message) from the training loop;
- ["fsize", extra_bytes]     cap this process's file size (RLIMIT_FSIZE) at the smallest output
                             file's current size plus extra_bytes: the disk is "full" from now on;
- ["fill", path]             write zeros to path until the file system is full (ENOSPC);
- ["remove", path]           remove a folder and all it holds (`rm -rf`);
- ["memory"]                 record Python's traced memory after a full collection (tracemalloc
                             runs from step 1) and the spans alive (`spans`: step -> count);
- ["garbage_spans", n]       hold the training thread, Python's cyclic collector paused after a
                             full collection, until n more OTLP exports have failed; record the
                             spans that only cyclic garbage held then (`garbage_spans`: step ->
                             count): what the failed exports left for the collector to free;
- ["die_writing", output, when, how]  as "die", at the pipeline worker's next write to
                             `output` ("tensorboard"), "before" or "after" it writes the batch
                             (the outputs before it wrote it; the ring's mark did not move);
- ["fork_exit"]              fork; the child leaves through `sys.exit(0)` (its exit handlers
                             run), the parent waits for it and trains on;
- ["die", how]               end the process at once, no Python exit handler running: "SIGKILL"
                             (or another signal's name, sent to itself), "abort" (`os.abort()`),
                             "exit" (`os._exit(3)`), "segfault" (`ctypes.string_at(0)`), "oom"
                             (allocate and touch memory until the kernel's OOM killer ends it:
                             run it under a cgroup's `memory.max`).

The report holds `hook_seconds` (hook name -> every call's duration), `memory`
(step -> traced bytes), `last_step_end` and `returned` (time.time() stamps) and `error`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from tests.support.paths import pythonpath_with_repo

_HOOKS = ("on_train_begin", "on_train_epoch_begin", "on_train_step_end", "on_train_epoch_end", "on_train_end")


def spawn(
    spec: dict,
    cwd: Path,
    env: dict[str, str] | None = None,
    module: str = "tests.support.reliability_worker",
    **popen: object,
) -> subprocess.Popen:
    """Start a worker (`python -m module '<spec>'`) in `cwd` (importing mindformers or
    mindspore writes ./output there)."""
    full_env = {
        **os.environ,
        "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
        "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH")),
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(spec)],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    """The worker's (stdout, stderr) once it ends; killed if it outlives `timeout`."""
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def run(
    spec: dict, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a worker to its end; returns the finished process and its report."""
    process = spawn(spec, cwd, env)
    stdout, stderr = finish(process, timeout)
    report_path = Path(spec["report"])
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), report


def timed_hooks(callback, durations: dict[str, list[float]]):
    """Record the duration of every hook call on `callback`, by hook name (instance
    attributes shadow the class's methods; MindSpore looks hooks up on the instance)."""
    for name in _HOOKS:
        method = getattr(callback, name)
        calls = durations.setdefault(name, [])

        def timed(run_context, method=method, calls=calls):
            start = time.perf_counter()
            try:
                method(run_context)
            finally:
                calls.append(time.perf_counter() - start)

        setattr(callback, name, timed)
    return callback


def _faults_callback(actions: dict[int, list], report: dict, json_path: Path):
    from mindspore.train import Callback

    class Faults(Callback):
        def __init__(self, actions: dict[int, list], report: dict, json_path: Path) -> None:
            super().__init__()
            self._actions = actions
            self._report = report
            self._json_path = json_path

        def on_train_step_end(self, run_context) -> None:
            step = run_context.original_args().cur_step_num
            self._report["last_step_end"] = time.time()
            for action in self._actions.get(step, []):
                kind, *args = action
                if kind == "touch":
                    Path(args[0]).touch()
                elif kind == "sleep":
                    time.sleep(args[0])
                elif kind == "await":
                    from tests.support.waiting import wait_until

                    wait_until(Path(args[0]).exists, f"the parent's {args[0]}", timeout=120)
                elif kind == "raise":
                    raise RuntimeError(args[0])
                elif kind == "fsize":
                    # Just above the smallest output file: every output (the larger ones at
                    # once, the smallest after extra_bytes) meets the limit.
                    folder = self._json_path.parent
                    size = min((p.stat().st_size for p in folder.rglob("*") if p.is_file()), default=0)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (size + args[0], resource.RLIM_INFINITY))
                elif kind == "fill":
                    with open(args[0], "ab") as filler:
                        try:
                            while True:
                                filler.write(bytes(64 << 10))
                                filler.flush()
                        except OSError:  # full: what was buffered is dropped with the file
                            pass
                elif kind == "remove":
                    shutil.rmtree(args[0])
                elif kind == "memory":
                    # Cyclic garbage waits for the collector's thresholds: collected first, it
                    # no longer adds megabytes at random steps to what is measured.
                    gc.collect()
                    self._report["memory"][str(step)] = tracemalloc.get_traced_memory()[0]
                    self._report["spans"][str(step)] = _spans_alive()
                elif kind == "garbage_spans":
                    gc.collect()
                    gc.disable()
                    try:
                        _await_failed_exports(args[0])
                        self._report["garbage_spans"][str(step)] = _spans_in_garbage()
                    finally:
                        gc.enable()
                elif kind == "fork_exit":
                    child = os.fork()
                    if child == 0:
                        sys.exit(0)
                    os.waitpid(child, 0)
                elif kind == "die":
                    _die(args[0])
                elif kind == "die_writing":
                    _die_in_next_write(*args)
                else:
                    raise ValueError(f"unknown action {kind!r}")

    return Faults(actions, report, json_path)


def _is_span(thing: object) -> bool:
    from opentelemetry.sdk.trace import ReadableSpan

    return issubclass(type(thing), ReadableSpan)  # type(): proxies too


def _spans_alive() -> int:
    return sum(_is_span(o) for o in gc.get_objects())


def _spans_in_garbage() -> int:
    """The spans a full collection finds unreachable now (kept aside, counted, then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sum(_is_span(o) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _await_failed_exports(count: int) -> None:
    """Return once `count` more OTLP exports have failed (each one is reported to the run's
    ExportErrorReporter, which notes when)."""
    from otel_mindformers.telemetry.export_errors import ExportErrorReporter
    from tests.support.waiting import wait_until

    reporter = ExportErrorReporter.installed()
    assert reporter is not None, "no OTLP export error reporter is installed"
    for _ in range(count):
        seen = reporter.last_failure_at
        wait_until(lambda seen=seen: reporter.last_failure_at != seen, "a failed OTLP export", timeout=120)


def _die_in_next_write(output: str, when: str, how: str) -> None:
    """The pipeline worker's next write to `output` ("tensorboard") ends the process
    `when` "before" or "after" it writes the batch (flushed): the outputs before it (the
    JSON log) wrote the batch, and the flight ring's mark of what the outputs wrote did not
    move."""
    from otel_mindformers.outputs.tensorboard import TensorBoardSink

    assert output == TensorBoardSink.name, output
    write = TensorBoardSink.write

    def write_then_die(self, records):
        if when == "after":
            write(self, records)
        _die(how)

    TensorBoardSink.write = write_then_die  # type: ignore[method-assign]


def _die(how: str) -> None:
    """End this process at once, the way `how` names (see the module's docstring)."""
    if how == "abort":
        os.abort()
    elif how == "exit":
        os._exit(3)
    elif how == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif how == "oom":
        hoard = []
        while True:  # pages touched, so they are resident: the cgroup's limit is met
            hoard.append(bytearray(64 << 20))
    else:
        os.kill(os.getpid(), getattr(signal, how))
    raise AssertionError(f"still alive after {how}")


def main(spec: dict) -> None:
    import mindspore as ms

    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    if "log_level" in spec:
        logging.basicConfig(level=spec["log_level"])
    report: dict = {"hook_seconds": {}, "memory": {}, "spans": {}, "garbage_spans": {}, "error": None}
    actions = {int(step): acts for step, acts in spec.get("at", {}).items()}
    callback = timed_hooks(MonitorCallback(spec.get("config", {})), report["hook_seconds"])
    json_path = Path(callback.config.json_log_path)
    if any(action[0] == "memory" for acts in actions.values() for action in acts):
        tracemalloc.start()
    try:
        train(
            [callback, _faults_callback(actions, report, json_path)],
            steps=spec.get("steps", 20),
            shape=spec.get("shape", "scalar"),
            mode=ms.GRAPH_MODE if spec.get("graph") else ms.PYNATIVE_MODE,
        )
    except Exception as exc:  # reported to the parent, then re-raised unchanged
        report["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        report["returned"] = time.time()
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        Path(spec["report"]).write_text(json.dumps(report))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
