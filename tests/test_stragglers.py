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
    assert log.body.startswith(
        "training is input-bound: it waited between steps (for its data, or for work between steps: callbacks, a custom loop's code outside run.step)"
    )
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
    assert warning.startswith(
        f"otel_mindformers: {who}: it waited between steps (for its data, or for work between steps: callbacks, a custom loop's code outside run.step) 50%"
    )
    assert SIGNALS in warning  # where the later episodes went


def test_a_share_just_over_the_threshold_reads_over_it(caplog):
    """It said "20% of its wall time ... (threshold 20%)" for 20.3 %."""
    from otel_mindformers.telemetry.training_instruments import Coalesced

    capture, sections = _rank_sections(windows=2, data_share=0.2)
    with caplog.at_level("WARNING", logger="otel_mindformers"):
        for step in (1, 2):
            sections.observe(_window(step, 0.203), None, Coalesced())
    (warning,) = [r.getMessage() for r in caplog.records if "waited between steps" in r.getMessage()]
    assert "outside run.step) 20.3% of its wall time for 2 sampled window(s) (threshold 20%)" in warning


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
    # Nothing waits for data here. A rise of the rank's own steps, or a wait between them, is
    # allowed only where this test's own clock saw the host slow the steps, or the time
    # between them, too (a loaded 2-core machine does).
    for event in events:
        step = event["training.step"]
        if event[names.ATTR_SECTION] == names.SECTION_IN_STEP:
            assert clock.slowed_before(step, windows=2, factor=1.5), (event, clock.ends)
        else:
            assert event[names.ATTR_SECTION] == names.SECTION_DATA_WAIT, event
            assert clock.waited_before(step, windows=2, share=0.1), (event, clock.begins, clock.ends)
    if not events:
        assert SIGNALS not in capture.points()
        assert not any(line.get("stragglers") for line in lines)


class _StepClock:
    """The test's own wall clock at each step end, apart from the package's sections."""

    def __init__(self, interval: int = 2) -> None:
        from mindspore.train import Callback

        self.interval = interval
        self.begins: dict[int, float] = {}
        self.ends: dict[int, float] = {}
        begins, ends = self.begins, self.ends

        class _Hook(Callback):
            def on_train_step_begin(self, run_context):
                begins[run_context.original_args()["cur_step_num"]] = time.perf_counter()

            def on_train_step_end(self, run_context):
                ends[run_context.original_args()["cur_step_num"]] = time.perf_counter()

        self.callback = _Hook()

    def waited_before(self, step: int, windows: int, share: float) -> bool:
        """Whether in each of the `windows` windows ending at `step` the time between steps
        (a step's end to the next one's begin, by this clock) passed `share` of the window."""
        for end in (step - k * self.interval for k in range(windows)):
            start = end - self.interval
            if any(s not in self.begins or s - 1 not in self.ends for s in range(start + 1, end + 1)):
                return False
            between = sum(self.begins[s] - self.ends[s - 1] for s in range(start + 1, end + 1))
            if between <= share * (self.ends[end] - self.ends[start]):
                return False
        return True

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


def test_a_straggler_flagged_by_a_noisy_median_still_points_at_the_ranks_whose_step_time_rose(tmp_path):
    """Ranks in step whose sampled step times differ by more than the threshold (a loaded
    host's noise, the msrun test's failure on CI): the straggler is named and the line still
    points at the bottleneck section's rises."""
    before, after = [window(0.01, 1.0)] * 5, [window(0.01, 2.5)] * 3
    write_job(tmp_path, {0: before + after}, step_ms=400.0)
    write_job(tmp_path, {1: before + after}, step_ms=520.0)
    report = report_logs([tmp_path])
    assert report.stragglers == ["rank 1"] and sorted(rise.rank for rise in report.bottleneck.rises) == [0, 1]
    (line,) = [line for line in render(report, "text").splitlines() if "stragglers (" in line]
    assert line.endswith("rank 1 (+13.0%); see below for the ranks whose step time rose"), line


def test_report_names_a_rank_whose_own_phases_hold_the_job_back(tmp_path):
    """User-marked phases are the `other` section: a rank that spends 3 s a window in one
    while the others do not is the bottleneck there."""
    plain = [window(0.01, 1.0)] * 6
    write_job(tmp_path, {0: plain, 1: [window(0.01, 1.0, other=3.0)] * 6, 2: plain})
    verdict = report_logs([tmp_path]).bottleneck
    top = verdict.bottleneck
    assert (top.rank, top.section, top.lost_s) == (1, names.SECTION_OTHER, pytest.approx(18.0))
    assert verdict.job_median_share == pytest.approx(0.0)  # ranks 0 and 2 spend nothing there


def test_the_job_median_is_the_median_rank_share_of_the_bottleneck_section(tmp_path):
    # Windows of 2 s; data wait 0.1, 1.0 and 0.4 s: shares 5 %, 50 % and 20 %, each rank's
    # checkpoint share 0 % or 10 %, which must not enter the data-wait median.
    ranks = {
        0: [window(0.1, 1.9)] * 8,
        1: [window(1.0, 0.8, checkpoint=0.2)] * 8,
        2: [window(0.4, 1.4, checkpoint=0.2)] * 8,
    }
    write_job(tmp_path, ranks)
    verdict = report_logs([tmp_path]).bottleneck
    assert (verdict.bottleneck.rank, verdict.bottleneck.section) == (1, names.SECTION_DATA_WAIT)
    assert verdict.bottleneck.rank_share == pytest.approx(0.5)
    assert verdict.job_median_share == pytest.approx(0.2)
    assert "its data_wait share 50.0% against a job median of 20.0%" in render(report_logs([tmp_path]), "text")


@pytest.mark.parametrize(
    ("waits", "named"),
    [
        ((0.8, 0.9, 1.0), None),  # each waits 40-50 % of its 2 s windows: rank 2's extra 0.2 s is nobody's fault
        ((0.5, 0.5, 1.9), 2),  # all wait 25 %, rank 2 far more: it still holds the job back
    ],
)
def test_when_every_rank_waits_for_its_data_the_job_is_input_bound(tmp_path, capsys, waits, named):
    write_job(tmp_path, {rank: [window(wait, 2.0 - wait)] * 8 for rank, wait in enumerate(waits)})
    report = report_logs([tmp_path])
    verdict = report.bottleneck
    shared = min(waits) / 2.0
    assert verdict.input_bound.share_of_job == pytest.approx(shared)
    assert verdict.input_bound.waited_s == pytest.approx(8 * min(waits))
    text = render(report, "text")
    said = f"every rank is input-bound: each waited for its data at least {8 * min(waits):.3f} s ({shared:.1%}"
    assert said in text and said in text.split("Findings")[1]
    body = json.loads(render(report, "json"))
    assert body["bottleneck"]["input_bound"]["share_of_job"] == pytest.approx(shared)
    if named is None:
        assert verdict.bottleneck is None and body["holds_back"] is None
        assert "no rank holds the others back: the largest extra wait, rank 2's 1.600 s, is less than" in text
        assert "holds the job back in" not in text and "every rank waits for its data (below)" in text
    else:
        assert verdict.bottleneck.rank == named and body["holds_back"] == f"rank {named}"
        assert f"rank {named}: holds the job back in data_wait" in text


def test_a_job_whose_best_rank_waits_little_is_not_input_bound(tmp_path):
    # The best rank waits 15 % of its windows (under the 20 % the rank's own signal uses).
    write_job(tmp_path, {0: [window(0.3, 1.7)] * 8, 1: [window(1.5, 0.5)] * 8})
    verdict = report_logs([tmp_path]).bottleneck
    assert verdict.input_bound is None and verdict.bottleneck.rank == 1


def _rank_sections(**config):
    from otel_mindformers.config.schema import StragglerConfig
    from otel_mindformers.job.identity import Identity
    from otel_mindformers.stragglers.rank_signal import RankSections

    capture = Capture()
    sections = RankSections(
        capture.meter_provider.get_meter("t"),
        capture.logger_provider.get_logger("t"),
        Identity(rank=1, world_size=2),
        StragglerConfig(**config),
    )
    return capture, sections


def _observe(sections, shares_and_in_step) -> None:
    from otel_mindformers.telemetry.training_instruments import Coalesced

    for step, (data_wait, in_step) in enumerate(shares_and_in_step, start=1):
        window = {
            names.SECTION_DATA_WAIT: data_wait,
            names.SECTION_IN_STEP: in_step,
            WINDOW_KEY: data_wait + in_step,
            STEPS_KEY: 1.0,
        }
        record = StepRecord(step=step, epoch=1, rank=1, time_stamp=float(step), sections=window)
        sections.observe(record, None, Coalesced())


def _signals(capture, section: str) -> list[int]:
    """The steps at which the rank said it, in `section` (its log records: no span here)."""
    said = [log.attributes for log in signal_logs(capture)]
    return [a["training.step"] for a in said if a[names.ATTR_SECTION] == section]


def test_windows_that_mostly_waited_for_data_stay_out_of_the_in_step_baseline():
    """Five windows that waited 90 % for data compute only 0.1 s: in the baseline they would
    make its median 0.1 s, and the healthy 1 s windows after them a tenfold rise."""
    capture, sections = _rank_sections(windows=2, data_share=0.2, step_rise=2.0)
    _observe(sections, [(0.0, 1.0)] * 2 + [(0.9, 0.1)] * 5 + [(0.0, 1.0)] * 3)
    assert _signals(capture, names.SECTION_IN_STEP) == []
    assert _signals(capture, names.SECTION_DATA_WAIT) == [4]  # the waits are said, as the data signal


def test_a_rise_episodes_windows_rejoin_the_baseline_once_it_ends():
    """Baseline 1 s; a rise to 3 s for three windows (one episode); one 1 s window ends it.
    Its windows then join the baseline (median 2 s), so the next 3 s windows are a 1.5x
    ratio, no new episode; kept out for good, the baseline would stay 1 s and fire again."""
    capture, sections = _rank_sections(windows=2, data_share=0.2, step_rise=2.0)
    _observe(sections, [(0.0, 1.0)] * 2 + [(0.0, 3.0)] * 3 + [(0.0, 1.0)] + [(0.0, 3.0)] * 2)
    assert _signals(capture, names.SECTION_IN_STEP) == [4]  # the second window of the rise, once


def test_a_window_splits_into_its_sections_whatever_its_clocks_say():
    """The phases that ended in a window go to their sections (a user's phase is `other`), the
    data wait is at most the window (a clock read late cannot make it longer), and the rest
    is in-step."""
    from otel_mindformers.names import phase_names
    from otel_mindformers.stragglers.sections import WindowSections

    window = WindowSections()
    for phase, seconds in ((phase_names.PHASE_CHECKPOINT_SAVE, 0.2), (phase_names.PHASE_EVALUATION, 0.3), ("my", 0.1)):
        window.phase(phase, seconds)
    assert window.close(steps=4, elapsed=2.0, data_wait=0.4) == pytest.approx(
        {
            names.SECTION_DATA_WAIT: 0.4, names.SECTION_IN_STEP: 1.0, names.SECTION_CHECKPOINT: 0.2,
            names.SECTION_EVALUATION: 0.3, names.SECTION_OTHER: 0.1, WINDOW_KEY: 2.0, STEPS_KEY: 4.0,
        }
    )  # fmt: skip
    late = window.close(steps=1, elapsed=1.0, data_wait=1.5)  # the phases went with the last window
    assert (late[names.SECTION_DATA_WAIT], late[names.SECTION_IN_STEP]) == (1.0, 0.0)


def test_the_verdict_reads_only_the_windows_every_rank_logged(tmp_path):
    """Rank 1's log stops after 4 windows (killed, or its lines lost): the verdict compares
    those 4, and says so, rather than fail on the windows rank 1 never logged."""
    write_job(tmp_path, {0: [window(0.01, 1.99)] * 8, 1: [window(1.01, 0.99)] * 4})
    verdict = report_logs([tmp_path]).bottleneck
    assert (verdict.windows, verdict.steps) == (4, 20)
    assert verdict.job_wall_s == pytest.approx(8.0) and verdict.bottleneck.lost_s == pytest.approx(4.0)
