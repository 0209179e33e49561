"""One trace per sampled step across the job (telemetry/step_ids.py) and the rank export
strategies (telemetry/export_ranks.py): the ids every rank derives alone, the sampler's
verdict on a job step, which ranks each strategy picks, the config's errors; then two ranks
of one job trained in one process, span by span."""

from __future__ import annotations

import collections

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult, TraceIdRatioBased

from otel_mindformers import ConfigError, load_monitor_config
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.telemetry import export_ranks
from otel_mindformers.telemetry.export_ranks import RankExports, first_rank, selects
from otel_mindformers.telemetry.step_ids import StepSpanIds, job_step_ids, job_trace_key


class Rank:
    """One rank's tracer: its own provider (own random seed), spans kept in memory."""

    def __init__(self, job_key: bytes | None, sampler=None) -> None:
        self.spans = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = provider.get_tracer("test")
        self.ids = StepSpanIds.install(self.tracer, job_key)

    def step_span(self, window: int):
        """What the pipeline does for the sample closing the window opened at `window`."""
        parent = self.ids.parent(window)
        with self.ids.preset(window):
            span = self.tracer.start_span(semconv.SPAN_STEP, context=parent)
        span.end()
        return span

    def root(self, window: int):
        with self.ids.preset_root(window):
            span = self.tracer.start_span(semconv.SPAN_JOB_STEP, context=otel_context.Context())
        span.end()
        return span


def test_every_rank_of_an_attempt_derives_one_trace_per_step_under_one_root():
    key = job_trace_key("llama-7b", 3)
    ranks = [Rank(key) for _ in range(3)]
    windows = [0, 10, 20, 25]
    traces = []
    for window in windows:
        spans = [rank.step_span(window) for rank in ranks]
        trace_id, root_id = job_step_ids(key, window)
        assert {s.context.trace_id for s in spans} == {trace_id}, "the ranks' step spans share the step's trace"
        assert {s.parent.span_id for s in spans} == {root_id}, "each names the job step's root as its parent"
        # The root is another process's span (one rank emits it): a remote parent, for the
        # samplers that tell remote parents from local ones (ParentBased's remote_parent_*).
        assert all(s.parent.is_remote for s in spans)
        assert len({s.context.span_id for s in spans}) == 3, "each rank's span is its own"
        root = ranks[0].root(window)
        assert (root.context.trace_id, root.context.span_id, root.parent) == (trace_id, root_id, None)
        # A log record made during the step names the same ids the span gets.
        logged = ranks[1].ids.context_of(window)
        logged_ids = trace.get_current_span(logged).get_span_context()
        assert (logged_ids.trace_id, logged_ids.span_id) == (trace_id, spans[1].context.span_id)
        traces.append(trace_id)
    assert len(set(traces)) == len(windows), "one trace per step"
    # Another attempt of the job, another job: other traces for the same steps.
    assert job_step_ids(job_trace_key("llama-7b", 4), 10) != job_step_ids(key, 10)
    assert job_step_ids(job_trace_key("llama-13b", 3), 10) != job_step_ids(key, 10)


def test_without_a_job_id_or_an_attempt_each_rank_keeps_traces_of_its_own():
    assert job_trace_key(None, 1) is None and job_trace_key("job", None) is None
    first, second = Rank(None), Rank(None)
    a, b = first.step_span(10), second.step_span(10)
    assert a.context.trace_id != b.context.trace_id
    assert a.parent is None and b.parent is None


def test_a_sampler_by_trace_id_keeps_or_drops_a_job_step_on_every_rank_alike():
    key = job_trace_key("job", 1)
    ranks = [Rank(key, ParentBased(TraceIdRatioBased(0.5))) for _ in range(2)]
    kept = collections.Counter()
    for window in range(0, 640, 10):
        verdicts = {rank.step_span(window).get_span_context().trace_flags.sampled for rank in ranks}
        verdicts.add(ranks[0].root(window).get_span_context().trace_flags.sampled)
        assert len(verdicts) == 1, f"step {window}: the ranks and the root disagree"
        kept[verdicts.pop()] += 1
    assert kept[True] and kept[False], kept
    assert {len(rank.spans.get_finished_spans()) for rank in ranks} == {kept[True] * 2, kept[True]}


class NeedsAttributes(Sampler):
    """A user's sampler that reads a span attribute: it cannot answer for a job step's root,
    which has no span to read (attributes None) when the ranks ask it."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        keep = attributes["keep"]  # TypeError out of a span
        return SamplingResult(Decision.RECORD_AND_SAMPLE if keep else Decision.DROP)

    def get_description(self) -> str:
        return "NeedsAttributes"


def test_a_sampler_that_cannot_answer_for_the_root_keeps_the_job_step():
    key = job_trace_key("job", 1)
    rank = Rank(key, NeedsAttributes())
    parent = rank.ids.parent(10)
    assert trace.get_current_span(parent).get_span_context().trace_flags.sampled
    # The step span and the root are started with their attributes: the sampler answers, keeps them.
    with rank.ids.preset(10):
        span = rank.tracer.start_span(semconv.SPAN_STEP, context=parent, attributes={"keep": True})
    span.end()
    with rank.ids.preset_root(10):
        root = rank.tracer.start_span(semconv.SPAN_JOB_STEP, context=otel_context.Context(), attributes={"keep": True})
    root.end()
    assert span.get_span_context().trace_flags.sampled and span.parent.span_id == root.context.span_id


def test_only_the_first_span_started_inside_a_preset_takes_its_ids():
    """A span started while the preset one starts (a span processor's, on the same thread) or
    after it, inside the block, gets ids of its own: two spans never share a span id."""
    rank = Rank(job_trace_key("job", 1))
    trace_id, span_id = 0x1234, 0x5678
    with rank.ids.preset_ids(trace_id, span_id):
        first = rank.tracer.start_span("first", context=otel_context.Context())
        second = rank.tracer.start_span("second", context=otel_context.Context())
    first.end()
    second.end()
    assert (first.context.trace_id, first.context.span_id) == (trace_id, span_id)
    assert second.context.span_id != span_id and second.context.trace_id != trace_id


RANKS_PER_NODE, NODES = 8, 4
WORLD = RANKS_PER_NODE * NODES


def chosen(strategy, report_ranks=(0,), world=WORLD) -> set[int]:
    return {r for r in range(world) if selects(strategy, list(report_ranks), r, r % RANKS_PER_NODE)}


def test_each_strategy_picks_its_ranks_and_every_rank_names_the_same_first_one():
    assert chosen("all") == set(range(WORLD)) and first_rank("all", [0], WORLD) == 0
    assert chosen("report_ranks", (3, 17)) == {3, 17} and first_rank("report_ranks", [17, 3], WORLD) == 3
    assert selects("report_ranks", "all", 5, 5) and first_rank("report_ranks", "all", WORLD) == 0
    assert chosen("first_per_node") == {0, 8, 16, 24} and first_rank("first_per_node", [0], WORLD) == 0
    assert chosen([5, 2, 100]) == {2, 5} and first_rank([100, 5, 2], [0], WORLD) == 2
    assert first_rank([100], [0], WORLD) is None
    for share in (0.25, 0.35):  # rank 0 (its share 0.32) is outside the first, inside the second
        fraction = chosen(share)
        assert fraction and fraction != set(range(WORLD)) and first_rank(share, [0], WORLD) == min(fraction)
    assert 0 in chosen(0.35) and 0 not in chosen(0.25)


def test_a_sampled_fraction_is_about_that_share_the_same_ranks_each_time_and_nested():
    world = 4096
    eighth = chosen(0.125, world=world)
    sixteenth = chosen(0.0625, world=world)
    # Binomial: 512 expected, standard deviation 21.
    assert 512 - 5 * 21 <= len(eighth) <= 512 + 5 * 21
    assert sixteenth < eighth, "a smaller fraction keeps a subset: series go on when it is lowered"
    assert chosen(0.125, world=world) == eighth
    # Spread over the job, not one position of each node.
    assert len({rank % RANKS_PER_NODE for rank in eighth}) == RANKS_PER_NODE
    assert export_ranks.rank_share(7) == export_ranks.rank_share(7)


def test_rank_exports_name_the_root_rank_once():
    config = load_monitor_config({"report_ranks": [2, 3], "export_ranks": {"spans": "report_ranks", "metrics": [0]}})
    exports = {rank: RankExports.of(config, Identity(rank=rank, world_size=4, local_rank=rank)) for rank in range(4)}
    assert [e.spans for e in exports.values()] == [False, False, True, True]
    assert [e.metrics for e in exports.values()] == [True, False, False, False]
    assert [e.job_root for e in exports.values()] == [False, False, True, False]


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"spans": 1.0}, "monitor_config.export_ranks.spans: a fraction of the ranks must be between 0 and 1"),
        ({"metrics": 0.0}, "monitor_config.export_ranks.metrics: a fraction of the ranks must be between 0 and 1"),
        ({"spans": "first_of_node"}, "unknown value 'first_of_node' (did you mean 'first_per_node'?)"),
        ({"metrics": [0, -2]}, "monitor_config.export_ranks.metrics: a list of ranks holds ranks >= 0"),
        ({"span": "all"}, "monitor_config.export_ranks.span: unknown key (did you mean 'spans'?)"),
    ],
)
def test_a_bad_export_strategy_is_one_error_naming_its_key(section, problem):
    with pytest.raises(ConfigError) as raised:
        load_monitor_config({"export_ranks": section})
    assert problem in str(raised.value)


# --- two ranks of one job, trained in one process ------------------------------------------


@pytest.mark.slow
@pytest.mark.mindspore_api
def test_two_ranks_share_each_steps_trace_and_an_outside_rank_sends_only_anomalies(workdir, monkeypatch):
    """Rank 0 and rank 1 of job `j` (RANK_ID / RANK_SIZE as msrun sets them), one after the
    other into one in-memory pipeline, twice: attempts 1 and 2. In attempt 2 rank 1 is
    outside `export_ranks` for spans and metrics, and its loss spikes at step 12."""
    import logging

    from mindspore.train import Callback

    from otel_mindformers import MonitorCallback
    from otel_mindformers.names import phase_names
    from otel_mindformers.names import training as tm
    from tests.support import training
    from tests.support.in_memory import Capture
    from tests.support.training import Faults

    class Say(Callback):  # a log record as each step begins: it belongs to that step's span
        def on_train_step_begin(self, run_context):
            logging.getLogger("steps").warning("step begins")

    capture = Capture()
    alerts = {"enable_alert": True, "loss_threshold": 1e4}
    runs = []
    phases = phase_names.PHASE_DURATION.name

    def phase_counts(rank: int) -> int:  # phase durations this rank recorded, over the runs so far
        return sum(p.count for p in capture.points().get(phases, []) if p.attributes[semconv.ATTR_RANK] == rank)

    for attempt, export in ((1, {}), (2, {"spans": [0], "metrics": [0]})):
        if attempt == 2:
            first = {rank: phase_counts(rank) for rank in (0, 1)}
        for rank in (0, 1):
            monkeypatch.setenv("RANK_ID", str(rank))
            monkeypatch.setenv("RANK_SIZE", "2")
            callback = MonitorCallback(
                {
                    "interval": 5, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"),
                    "job_id": "j", "report_ranks": "all", "export_ranks": export, "alert_config": alerts,
                    "logs": True,
                },
                **capture.providers(),
            )  # fmt: skip
            spike = Faults(spike_at={12: 1e3}) if (attempt, rank) == (2, 1) else None
            training.train([callback, Say()], steps=12, faults=spike)
            runs.append((attempt, rank))
    run_spans = {s.context.span_id: s for s in capture.finished(semconv.SPAN_RUN)}
    assert (
        sorted((s.attributes["training.job.attempt"], s.attributes[semconv.ATTR_RANK]) for s in run_spans.values())
        == runs
    )

    def who(span):
        (link,) = span.links
        run = run_spans[link.context.span_id]
        return run.attributes["training.job.attempt"], run.attributes[semconv.ATTR_RANK]

    by_trace = collections.defaultdict(list)
    for span in capture.finished(semconv.SPAN_STEP):
        by_trace[span.context.trace_id].append(span)
    roots = {root.context.trace_id: root for root in capture.finished(semconv.SPAN_JOB_STEP)}
    steps = {1: [1, 5, 10, 12], 2: [1, 5, 10, 12]}
    for attempt in (1, 2):
        traces = {trace_id: spans for trace_id, spans in by_trace.items() if {who(s)[0] for s in spans} == {attempt}}
        assert sorted(spans[0].attributes[semconv.ATTR_STEP] for spans in traces.values()) == steps[attempt]
        for trace_id, spans in traces.items():
            step = spans[0].attributes[semconv.ATTR_STEP]
            ranks = sorted(who(s)[1] for s in spans)
            # Attempt 2: rank 1 sends only its anomalous step (step 12's spike), in that step's trace.
            assert ranks == ([0, 1] if attempt == 1 or step == 12 else [0]), (attempt, step, ranks)
            assert {s.attributes[semconv.ATTR_STEP] for s in spans} == {step}
            root = roots[trace_id]
            assert {s.parent.span_id for s in spans} == {root.context.span_id} and root.parent is None
            assert (root.attributes[semconv.ATTR_STEP], root.attributes["training.job.attempt"]) == (step, attempt)
            assert root.attributes[semconv.ATTR_JOB_ID] == "j" and root.attributes[semconv.ATTR_WORLD_SIZE] == 2
    assert len(capture.finished(semconv.SPAN_JOB_STEP)) == len(roots) == 8, "one root per step and attempt, one rank's"
    # Outside `metrics`, rank 1 records no phase durations either (its phases' spans stay).
    assert first[1] and phase_counts(0) > first[0] and phase_counts(1) == first[1]
    (anomalous,) = [s for s in capture.finished(semconv.SPAN_STEP) if who(s) == (2, 1)]
    assert anomalous.attributes[semconv.ATTR_STEP] == 12 and anomalous.events

    # A record made during a sampled step names its step span, on a rank that sends step
    # spans; an outside rank's name none (attempt 2, rank 1: the last four runs' records).
    step_ids = {(s.context.trace_id, s.context.span_id) for s in capture.finished(semconv.SPAN_STEP)}
    said = [r.log_record for r in capture.logs.get_finished_logs() if r.log_record.body == "step begins"]
    ranks_said = [
        (r.attributes[semconv.ATTR_RANK], r.attributes[semconv.ATTR_STEP] + 1, r.trace_id, r.span_id) for r in said
    ]
    assert len(ranks_said) == 4 * 12
    for index, (rank, step, trace_id, span_id) in enumerate(ranks_said):
        attempt = 1 + index // 24
        named = step in (1, 5, 10) and (attempt, rank) != (2, 1)
        assert ((trace_id, span_id) in step_ids) == named, (attempt, rank, step)
        assert bool(trace_id) == named, (attempt, rank, step)
    # The step-duration histogram's exemplars still point at step spans.
    step_spans = {s.context.span_id for s in capture.finished(semconv.SPAN_STEP)}
    exemplars = capture.exemplars(tm.instrument_name(tm.STEP_TIME))
    assert exemplars and {e.span_id for e in exemplars} <= step_spans


@pytest.mark.slow
@pytest.mark.mindspore_api
def test_the_last_step_span_a_step_spans_cadence_adds_at_the_end_has_its_job_root(workdir, monkeypatch):
    """`step_spans: 10`, 15 steps sampled every 5: step 15's span is skipped at its step (its
    window 11..15 passed no multiple of 10, and it is not yet known to be the last) and started
    at the run's end, under its own job step root."""
    from tests.support import training
    from tests.support.in_memory import Capture

    monkeypatch.setenv("RANK_ID", "0")
    monkeypatch.setenv("RANK_SIZE", "2")
    capture = Capture()
    config = {
        "interval": 5, "step_spans": 10, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"),
        "job_id": "j",
    }  # fmt: skip
    training.train([capture.callback(config)], steps=15)
    steps = {s.attributes[semconv.ATTR_STEP]: s for s in capture.finished(semconv.SPAN_STEP)}
    roots = {s.attributes[semconv.ATTR_STEP]: s for s in capture.finished(semconv.SPAN_JOB_STEP)}
    assert sorted(steps) == sorted(roots) == [10, 15]
    for step, span in steps.items():
        assert span.parent.span_id == roots[step].context.span_id
        assert span.context.trace_id == roots[step].context.trace_id
