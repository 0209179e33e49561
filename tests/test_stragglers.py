"""Per-rank section times, the in-process straggler signal, and the report's verdict.

The in-process parts run real MindSpore training on CPU with in-memory SDK providers; the
verdict reads JSON-lines logs written by the package's own record rendering. The 2-rank
msrun jobs with a live Prometheus are in test_stragglers_msrun.py.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time

import pytest

from otel_mindformers import ConfigError, MonitorCallback, load_monitor_config
from otel_mindformers.analysis.report import render, report_logs
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.names import straggler_names as names
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY
from tests.support.in_memory import Capture
from tests.support.instrumented import BIN, child_env
from tests.support.training import Faults, train

SECTION_TIME = names.SECTION_TIME.name
SIGNALS = names.STRAGGLER_SIGNALS.name


def run_training(workdir, faults=None, steps=24, extra_callbacks=(), **stragglers):
    capture = Capture()
    config = {
        "interval": 2,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "metrics.json"),
        "stragglers": {"windows": 2, **stragglers},
    }
    callback = MonitorCallback(config, **capture.providers())
    train([callback, *extra_callbacks], steps=steps, faults=faults)
    lines = [json.loads(line) for line in (workdir / "metrics.json").read_text().splitlines()]
    return capture, lines


def signal_events(capture):
    return [dict(e.attributes) for s in capture.finished() for e in s.events if e.name == names.EVENT_STRAGGLER]


def signal_logs(capture):
    return [r.log_record for r in capture.logs.get_finished_logs() if r.log_record.event_name == names.EVENT_STRAGGLER]


@pytest.fixture(scope="module")
def data_starved(tmp_path_factory):
    """Steps 13..22 wait 1 s for their batch (more than a step computes even on a loaded
    machine, so the prefetch cannot hide it): the rank waits for its data."""
    workdir = tmp_path_factory.mktemp("starved")
    return run_training(workdir, Faults(sleep_at={step: 1.0 for step in range(13, 23)}), steps=22)


# Real training whose outcome depends on time: outside the fast set, which runs beside other work.
timed = pytest.mark.slow


@timed
def test_every_sampled_window_splits_into_sections_that_add_up(data_starved):
    capture, lines = data_starved
    assert "sections" not in lines[0]  # the first window holds start-up and compilation
    for line in lines[1:]:
        sections = line["sections"]
        parts = sum(value for key, value in sections.items() if key not in (WINDOW_KEY, STEPS_KEY))
        assert parts == pytest.approx(sections[WINDOW_KEY], abs=1e-5)
        assert sections[STEPS_KEY] == line["step"] - (lines[lines.index(line) - 1]["step"])
    slow = [line["sections"] for line in lines if line["step"] >= 18]  # the prefetch hides the first ones
    assert all(s[names.SECTION_DATA_WAIT] > 0.2 for s in slow)  # 2 steps of 1 s, less what overlaps compute
    # As series: seconds by section with the rank, and the steps they cover.
    points = capture.points()
    by_section = {p.attributes[names.ATTR_SECTION]: p for p in points[SECTION_TIME]}
    assert set(by_section) == {names.SECTION_DATA_WAIT, names.SECTION_IN_STEP}
    assert all(p.attributes["training.rank"] == 0 for p in by_section.values())
    logged = sum(line["sections"][names.SECTION_DATA_WAIT] for line in lines[1:])
    assert by_section[names.SECTION_DATA_WAIT].value == pytest.approx(logged, abs=1e-4)
    assert points[names.SECTION_STEPS.name][0].value == sum(line["sections"][STEPS_KEY] for line in lines[1:])


@timed
def test_a_rank_that_waits_for_its_data_records_it_itself_once(data_starved):
    capture, lines = data_starved
    flagged = [line["step"] for line in lines if line.get("stragglers")]
    assert len(flagged) == 1 and flagged[0] >= 16  # two consecutive windows over 20 %, one episode
    assert lines[[line["step"] for line in lines].index(flagged[0])]["stragglers"] == [names.SECTION_DATA_WAIT]
    (event,) = signal_events(capture)
    assert (event[names.ATTR_SECTION], event[names.ATTR_SCORE], event["training.rank"]) == (
        names.SECTION_DATA_WAIT,
        names.SCORE_RELATIVE,
        0,
    )
    assert event[names.ATTR_SHARE] > 0.2 and event["training.step"] == flagged[0]
    (log,) = signal_logs(capture)
    # One process is the whole job: nobody waits for it, it waits for its data.
    assert log.body.startswith("training is input-bound: it waited between steps (for its data, or for callbacks)")
    (point,) = capture.points()[SIGNALS]
    assert point.value == 1 and point.attributes[names.ATTR_SCORE] == names.SCORE_RELATIVE


class _BusyFrom:
    """From step `start`, a thread spins in Python on this process: its steps slow down."""

    def __init__(self, start: int) -> None:
        from mindspore.train import Callback

        outer = self
        self._spinning = threading.Event()

        class _Hook(Callback):
            def on_train_step_end(self, run_context):
                if run_context.original_args()["cur_step_num"] == start:
                    outer._spinning.set()
                    threading.Thread(target=outer._spin, daemon=True).start()

            def on_train_end(self, run_context):
                outer._spinning.clear()

        self.callback = _Hook()

    def _spin(self) -> None:
        while self._spinning.is_set():
            pass


def _window(step: int, data_wait: float) -> StepRecord:
    in_step = 1.0 - data_wait
    sections = {names.SECTION_DATA_WAIT: data_wait, names.SECTION_IN_STEP: in_step, WINDOW_KEY: 1.0, STEPS_KEY: 1.0}
    return StepRecord(step=step, epoch=1, rank=1, time_stamp=float(step), sections=sections)


@pytest.mark.parametrize("world_size", [1, 2])
def test_each_episode_is_counted_and_the_training_log_warns_once(world_size, caplog):
    """A data share hovering at the threshold starts episode after episode: every one is an
    event and a count, the training log names the section once. Its words say who waits."""
    from otel_mindformers.config.schema import StragglerConfig
    from otel_mindformers.job.identity import Identity
    from otel_mindformers.stragglers.rank_signal import RankSections
    from otel_mindformers.telemetry.training_instruments import Coalesced

    capture = Capture()
    sections = RankSections(
        capture.meter_provider.get_meter("t"),
        capture.logger_provider.get_logger("t"),
        Identity(rank=1, world_size=world_size),
        StragglerConfig(windows=2),
    )
    shares = [0.5, 0.5, 0.1, 0.5, 0.5, 0.1, 0.5, 0.5]  # three episodes of two windows
    with caplog.at_level("WARNING", logger="otel_mindformers"):
        for step, share in enumerate(shares, start=1):
            sections.observe(_window(step, share), None, Coalesced())
    assert len(signal_logs(capture)) == 3
    assert capture.points()[SIGNALS][0].value == 3
    (warning,) = [r.getMessage() for r in caplog.records if "waited between steps" in r.getMessage()]
    who = "rank 1 is input-bound" if world_size > 1 else "training is input-bound"
    assert warning.startswith(f"otel_mindformers: {who}: it waited between steps (for its data, or for callbacks) 50%")
    assert SIGNALS in warning  # where the later episodes went


@timed
def test_a_rank_whose_steps_slow_down_against_its_own_history_records_it(tmp_path):
    busy = _BusyFrom(start=12)
    capture, lines = run_training(tmp_path, steps=30, extra_callbacks=[busy.callback], step_rise=1.5)
    events = signal_events(capture)
    # The busy thread's windows: a shared host's own load may add an episode, never a data one.
    assert {(e[names.ATTR_SECTION], e[names.ATTR_SCORE]) for e in events} == {
        (names.SECTION_IN_STEP, names.SCORE_INDIVIDUAL)
    }, [line.get("sections") for line in lines]
    assert any(e[names.ATTR_RATIO] > 1.5 and e["training.step"] > 12 for e in events)
    log = signal_logs(capture)[-1]
    assert "look alike from host clocks" in log.body and "npu-smi" in log.body


@timed
def test_a_healthy_rank_records_no_signal(tmp_path):
    clock = _StepClock()
    capture, lines = run_training(tmp_path, steps=16, extra_callbacks=[clock.callback])
    assert all(line.get("sections") for line in lines[1:])
    events = signal_events(capture)
    # Nothing waits for data here. A rise of the rank's own steps is allowed only where this
    # test's own clock saw the host slow the steps down too (a loaded 2-core machine does).
    assert all(e[names.ATTR_SECTION] == names.SECTION_IN_STEP for e in events), events
    for event in events:
        assert clock.slowed_before(event["training.step"], windows=2, factor=1.5), (event, clock.ends)
    if not events:
        assert SIGNALS not in capture.points()
        assert not any(line.get("stragglers") for line in lines)


class _StepClock:
    """The test's own wall clock at each step end, apart from the package's sections."""

    def __init__(self, interval: int = 2) -> None:
        from mindspore.train import Callback

        self.interval = interval
        self.ends: dict[int, float] = {}
        ends = self.ends

        class _Hook(Callback):
            def on_train_step_end(self, run_context):
                ends[run_context.original_args()["cur_step_num"]] = time.perf_counter()

        self.callback = _Hook()

    def slowed_before(self, step: int, windows: int, factor: float) -> bool:
        """Whether the `windows` windows ending at `step` each took over `factor` times the
        median window before them, by this clock."""
        per_window = {
            end: self.ends[end] - self.ends[end - self.interval]
            for end in self.ends
            if end - self.interval in self.ends and end % self.interval == 0
        }
        recent = [step - k * self.interval for k in range(windows)]
        earlier = [seconds for end, seconds in per_window.items() if end < recent[-1]]
        if not earlier or any(end not in per_window for end in recent):
            return False
        median = statistics.median(earlier)
        return all(per_window[end] > factor * median for end in recent)


@pytest.mark.slow  # a real training (or the CLI in a child process)
@pytest.mark.parametrize(
    ("series", "attributes"),
    [("node", {"host.name"}), ("off", None)],
)
def test_section_series_can_be_kept_per_node_or_off(tmp_path, series, attributes):
    capture, lines = run_training(tmp_path, steps=8, section_series=series)
    points = capture.points().get(SECTION_TIME)
    if attributes is None:
        assert points is None
    else:
        assert {frozenset(p.attributes) - {names.ATTR_SECTION} for p in points} == {frozenset(attributes)}
    assert all(line.get("sections") for line in lines[1:])  # the JSON line keeps them


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("section_series", "pod", "stragglers.section_series"),
        ("data_share", 1.5, "stragglers.data_share"),
        ("step_rise", 0.5, "stragglers.step_rise"),
        ("windows", 0, "stragglers.windows"),
        ("colour", 1, "colour"),
    ],
)
def test_a_bad_stragglers_key_is_one_config_error_naming_it(key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_monitor_config({"stragglers": {key: value}})


# --- the report's verdict, from JSON lines as the package writes them ------------------------
def write_job(folder, windows: dict[int, list[dict[str, float]]], step_ms: float = 400.0) -> None:
    """`windows[rank]`: one sections dict per sampled window of 5 steps (after the first)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, sections in windows.items():
        records = [StepRecord(step=1, epoch=1, rank=rank, time_stamp=1000.0, values={"train_per_step_time": 900.0})]
        stamp = 1000.0
        for index, window in enumerate(sections):
            stamp += window[WINDOW_KEY]
            record = StepRecord(
                step=5 * (index + 1), epoch=1, rank=rank, time_stamp=stamp, steps_in_window=5,
                values={"train_per_step_time": step_ms}, sections=dict(window),
            )  # fmt: skip
            records.append(record)
        path = folder / f"train_metric_rank_{rank}.json"
        path.write_text("".join(json.dumps(r.to_json_dict()) + "\n" for r in records))


def window(data: float, in_step: float, **phases: float) -> dict[str, float]:
    total = data + in_step + sum(phases.values())
    return {names.SECTION_DATA_WAIT: data, names.SECTION_IN_STEP: in_step, **phases, WINDOW_KEY: total, STEPS_KEY: 5}


def cli_report(folder, *args: str) -> str:
    command = [str(BIN / "otel-mindformers"), "report", str(folder), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow  # runs the CLI in a child process
def test_report_names_the_rank_whose_data_holds_the_job_back_and_what_it_cost(tmp_path):
    # Rank 1 waits 1.8 s per window for data; rank 0 waits for it inside its step.
    write_job(tmp_path, {0: [window(0.01, 1.99)] * 8, 1: [window(1.81, 0.19)] * 8})
    report = json.loads(cli_report(tmp_path, "--json"))
    verdict = report["bottleneck"]
    top = verdict["bottleneck"]
    assert (top["label"], top["rank"], top["section"]) == ("rank 1", 1, names.SECTION_DATA_WAIT)
    assert top["lost_s"] == pytest.approx(8 * 1.8)
    assert verdict["job_wall_s"] == pytest.approx(16.0)
    assert verdict["job_useful_s"] == pytest.approx(8 * 0.19)  # the slow rank's steps, not rank 0's waits
    assert verdict["job_goodput"] == pytest.approx(0.095)
    assert verdict["steps"] == 40 and verdict["windows"] == 8
    text = cli_report(tmp_path)
    assert "no stragglers" not in text
    assert "bottleneck: rank 1, data_wait: the job lost 14.4 s (90.0% of its wall time)" in text
    assert "job useful time 1.520 s of 16.0 s (useful share 0.095)" in text
    assert "rank 1: holds the job back in data_wait" in text.split("Findings")[1]
    assert "bottleneck: rank 1, data_wait" in cli_report(tmp_path, "--format", "markdown")


def test_report_names_a_rank_that_saves_checkpoints_longer_than_the_others(tmp_path):
    slow_save = [window(0.01, 1.0)] * 3 + [window(0.01, 1.0, checkpoint=3.0)] + [window(0.01, 1.0)] * 3
    fast_save = [window(0.01, 1.0)] * 3 + [window(0.01, 3.9, checkpoint=0.1)] + [window(0.01, 1.0)] * 3
    write_job(tmp_path, {0: fast_save, 1: slow_save, 2: fast_save})
    top = report_logs([tmp_path]).bottleneck.bottleneck
    assert (top.rank, top.section, top.lost_s) == (1, names.SECTION_CHECKPOINT, pytest.approx(2.9))


def test_report_names_nobody_in_a_healthy_job(tmp_path):
    write_job(tmp_path, {0: [window(0.01, 2.0), window(0.02, 2.1)] * 4, 1: [window(0.02, 2.0), window(0.01, 2.1)] * 4})
    report = report_logs([tmp_path])
    assert report.bottleneck.named == [] and report.bottleneck.bottleneck is None
    text = render(report, "text")
    assert "no rank holds the job back" in text and "no stragglers" in text


def test_report_says_what_host_clocks_cannot_tell_apart_when_steps_rise_without_data_wait(tmp_path):
    before, after = [window(0.01, 1.0)] * 5, [window(0.01, 2.5)] * 3
    write_job(tmp_path, {0: before + after, 1: before + after})
    report = report_logs([tmp_path])
    assert report.bottleneck.bottleneck is None
    assert sorted(rise.rank for rise in report.bottleneck.rises) == [0, 1]
    text = render(report, "text")
    assert "in-step time rose against the rank's own earlier windows" in text
    assert "look alike from host clocks" in text and "profiler capture" in text
