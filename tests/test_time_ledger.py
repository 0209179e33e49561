"""The run's time ledger without a training (otel_mindformers/timing/time_ledger.py): goodput
from the seconds lost per phase, and what it says before any time has passed."""

from __future__ import annotations

import pytest

from otel_mindformers.timing.time_ledger import TimeLedger


def test_goodput_is_unknown_until_time_has_passed_then_the_unlost_share():
    ledger = TimeLedger(origin_wall=100.0)
    assert ledger.goodput(100.0) is None and ledger.goodput(99.5) is None  # a clock set back too
    ledger.add("data_wait", 2.0)
    ledger.add("data_wait", -0.001)  # a reading below the clocks' resolution: nothing lost
    assert ledger.goodput(110.0) == pytest.approx(0.8)
    assert ledger.breakdown(110.0) == {"wall": 10.0, "productive": 8.0, "data_wait": 2.0}
