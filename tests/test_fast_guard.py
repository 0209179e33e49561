"""The fast set starts no process and runs no training (tests/support/fast_guard.py, put around
every test not marked slow by tests/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading

import pytest
from mindspore.train import Model

from tests.support.fast_guard import SUBPROCESS, TRAINING, guard

Refused = pytest.fail.Exception


def test_this_fast_test_runs_guarded():
    assert subprocess._fork_exec.__name__ == "refused_call"
    assert Model.train.__name__ == "refused_call"


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run([sys.executable, "-c", "pass"]),
        lambda: subprocess.check_output(["true"]),
        lambda: os.system("true"),
        lambda: os.fork(),
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
        lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    ],
    ids=["run", "check_output", "system", "fork", "spawn", "mp-fork"],
)
def test_every_way_to_start_a_process_fails_the_test(start):
    with pytest.raises(Refused, match=SUBPROCESS), guard():
        start()


def test_a_training_fails_the_test():
    with pytest.raises(Refused, match=r"Model\.train"), guard():
        Model.train(None, 1, None)
    assert TRAINING.endswith("mark it slow")


def test_a_refusal_swallowed_on_another_thread_still_fails_the_test():
    def swallowing():
        try:
            subprocess.run(["true"])
        except BaseException:
            pass

    with pytest.raises(Refused, match=SUBPROCESS), guard():
        thread = threading.Thread(target=swallowing)
        thread.start()
        thread.join()


def test_what_it_replaced_is_put_back():
    before = (subprocess._fork_exec, os.fork, Model.train)
    with pytest.raises(Refused), guard():
        os.fork()
    assert (subprocess._fork_exec, os.fork, Model.train) == before


def test_code_that_wraps_popen_is_left_working():
    """The instrumentor wraps Popen.__init__ (issue 17); the guard does not touch it."""
    init = subprocess.Popen.__init__
    with guard():
        assert subprocess.Popen.__init__ is init


@pytest.mark.slow
def test_a_slow_test_may_start_processes():
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
