"""Custom monitors for tests, loaded by dotted path (`tests.support.monitors.X`) the way a
user's `custom_monitor_callback` is, and imported by the tests under the same name."""

from __future__ import annotations

from otel_mindformers.runtime.custom_monitors import BaseMonitor


class Raising(BaseMonitor):
    calls = 0

    def on_train_step_end(self, run_context):
        type(self).calls += 1
        raise RuntimeError("custom monitor bug")


class ReadsNothing(BaseMonitor):
    """Touches the article's handles without reading them back."""

    seen: list = []

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        type(self).seen.append((params.train_loss is not None, params.learning_rate is not None))


class ReadsLearningRate(BaseMonitor):
    values: list = []

    def on_train_step_end(self, run_context):
        type(self).values.append(float(run_context.original_args().learning_rate.asnumpy()))
