"""A real custom loop through the run API in a process of its own (tests/support/custom_loop.py),
for what a test must see from outside: a loop SIGKILLed, a `start()` configured by the
environment alone.

    python -m tests.support.custom_loop_process '<json spec>'

Spec keys: `config` (the `monitor_config` mapping; absent: `otel_mindformers.start()` with no
config, so OTEL_PYTHON_MINDFORMERS_CONFIG or the defaults decide), `steps`, `jit` (bool),
`die_at` (a step: the process SIGKILLs itself right after that step's `with run.step` block,
no Python exit handler running), `end` ("with": the default, `with ... as run:`; "never":
the script returns without `run.end()`, as one that forgets it), `raise_at` (a step: the
loop raises RuntimeError right after it, uncaught), `c_error_at` (a step: an error is set and printed as a C extension prints one it
handled, PyErr_Print, which leaves it in `sys.last_value`), `fork_at` (a step: the process forks
right after it, and the child leaves through `sys.exit(0)`, its exit handlers and the `with`
it is in running, while the parent trains on). Prints `last step N` when the loop ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import otel_mindformers
from tests.support import custom_loop


def main(spec: dict) -> None:
    loop = custom_loop.build(jit=spec.get("jit", False))
    run = otel_mindformers.start(spec["config"]) if "config" in spec else otel_mindformers.start()
    die_at = spec.get("die_at")
    last = 0
    with run if spec.get("end", "with") == "with" else contextlib.nullcontext():
        for step, (x, y) in enumerate(custom_loop.Data(spec["steps"]).batches(), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, grads=grads)
            last = step
            if step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == spec.get("fork_at"):
                child = os.fork()
                if child == 0:
                    sys.exit(0)
                os.waitpid(child, 0)
            if step == spec.get("raise_at"):
                raise RuntimeError(f"the loop failed after step {step}")
            if step == spec.get("c_error_at"):
                custom_loop.print_a_handled_error_as_c_code_does()
            if run.should_stop:
                break
    print(f"last step {last}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
