"""`Deadline`: one budget shared by consecutive shutdown stages."""

import threading

from otel_mindformers.core.deadline import Deadline


def test_an_elapsed_budget_leaves_nothing():
    deadline = Deadline(0.0)
    assert deadline.remaining() == 0.0 and deadline.expired
    assert Deadline(-5).remaining() == 0.0


def test_a_stage_that_uses_time_leaves_less_to_the_next():
    deadline = Deadline(60.0)
    first = deadline.remaining()
    threading.Event().wait(0.05)  # a stage doing work
    second = deadline.remaining()
    assert 0.0 < second < first <= 60.0 and not deadline.expired
