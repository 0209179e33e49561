"""Diagnosing a job that hangs or goes bad: heartbeats, stack dumps, the first bad rank.

- `Heartbeat.start(meter, progress, point_attributes)`: observable step/time gauges per rank;
- `StackDumper` / `dump_stacks(reason)`: every thread's stack on stall, SIGUSR1 or demand;
- `FirstNonFinite`: the run's first NaN/Inf on a rank (`nonfinite_check: all_ranks`);
- `hang_report`: the `otel-mindformers hang-report` command. See docs/hangs.md.
"""

from otel_mindformers.diagnosis.dumps import StackDumper, dump_stacks
from otel_mindformers.diagnosis.heartbeat import Heartbeat
from otel_mindformers.diagnosis.nonfinite import FirstNonFinite

__all__ = ["FirstNonFinite", "Heartbeat", "StackDumper", "dump_stacks"]
