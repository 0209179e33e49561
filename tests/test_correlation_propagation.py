"""Outgoing trace context for child processes: the helper, and the opt-in Popen wrapper
installed and removed by the instrumentor's register()/unregister(). Real child processes."""

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider

from otel_mindformers.integration.environment_variables import OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT
from otel_mindformers.integration.instrumentor import MindFormersInstrumentor
from otel_mindformers.integration.propagation import trace_environment

PRINT = [sys.executable, "-c", "import os; print(os.environ.get('TRACEPARENT'), os.environ.get('OTHER'))"]
LAUNCHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def wrapped() -> bool:
    return hasattr(subprocess.Popen.__dict__["__init__"], "__wrapped__")


def child_sees(**kwargs) -> list[str]:
    return subprocess.run(PRINT, capture_output=True, text=True, check=True, **kwargs).stdout.split()


@pytest.fixture
def span():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("upload") as current:
        context = current.get_span_context()
        yield f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


@pytest.fixture
def wrapped_popen(monkeypatch):
    """register() as `import otel_mindformers` runs it, with the switch on; undone after."""
    monkeypatch.setenv(OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT, "true")
    instrumentor = MindFormersInstrumentor()
    instrumentor.unregister()
    instrumentor.register()
    yield
    instrumentor.unregister()
    monkeypatch.delenv(OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT)
    instrumentor.register()


def test_trace_environment_carries_the_current_span(span):
    assert trace_environment()["TRACEPARENT"][:-2] == span[:-2]


def test_trace_environment_is_empty_without_a_span():
    assert trace_environment() == {}


@pytest.mark.slow  # a real child process
def test_popen_is_left_alone_unless_asked(span, monkeypatch):
    monkeypatch.setenv("TRACEPARENT", LAUNCHER)
    assert not wrapped()
    assert child_sees() == [LAUNCHER, "None"]


@pytest.mark.slow
def test_wrapped_popen_hands_the_current_span_to_children(wrapped_popen, span, monkeypatch):
    monkeypatch.setenv("TRACEPARENT", LAUNCHER)  # what this rank inherited from its launcher
    assert child_sees()[0][:-2] == span[:-2]
    # An env copied from ours gives way too; one the caller set on purpose wins.
    assert child_sees(env={**os.environ, "OTHER": "x"})[0][:-2] == span[:-2]
    assert child_sees(env={**os.environ, "OTHER": "x"})[1] == "x"
    mine = "00-11111111111111111111111111111111-2222222222222222-01"
    assert child_sees(env={**os.environ, "TRACEPARENT": mine})[0] == mine
    # Positional env (the eleventh parameter of Popen) too.
    process = subprocess.Popen(
        PRINT, -1, None, None, subprocess.PIPE, None, None, True, False, None, {**os.environ, "OTHER": "y"}, text=True
    )
    out, _ = process.communicate()
    assert out.split()[0][:-2] == span[:-2] and out.split()[1] == "y"


@pytest.mark.slow  # a real child process
def test_wrapped_popen_without_a_span_changes_nothing(wrapped_popen, monkeypatch):
    monkeypatch.setenv("TRACEPARENT", LAUNCHER)
    assert child_sees() == [LAUNCHER, "None"]


def test_unregister_removes_the_wrapper(wrapped_popen):
    assert wrapped()
    MindFormersInstrumentor().unregister()
    assert not wrapped()


# --- the launcher's TRACEPARENT, read by the run ---------------------------------------------------
@pytest.fixture
def propagators(monkeypatch):
    """Sets the global propagators for one test (as OTEL_PROPAGATORS or OTEL_CONFIG_FILE's
    `propagator` would), and forgets the process's said-once warnings."""
    from opentelemetry import propagate

    from otel_mindformers.core import guarded_log

    monkeypatch.setattr(guarded_log, "_said", set())
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", propagate.get_global_textmap())
    return propagate.set_global_textmap


@pytest.mark.parametrize(
    ("names", "traceparent", "why"),
    [
        ((), LAUNCHER, "the configured propagators do not read it"),  # a declarative file without `propagator`
        (("baggage",), LAUNCHER, "the configured propagators do not read it"),
        (("tracecontext",), "00-not-a-span", "it is not a W3C traceparent"),
    ],
)
def test_a_traceparent_the_run_cannot_read_is_said_once(propagators, monkeypatch, caplog, names, traceparent, why):
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from otel_mindformers.runtime.parts import launcher_context

    known = {"tracecontext": TraceContextTextMapPropagator(), "baggage": W3CBaggagePropagator()}
    propagators(CompositePropagator([known[name] for name in names]))
    monkeypatch.setenv("TRACEPARENT", traceparent)
    launcher_context()
    launcher_context()  # a second run of the process: said once
    said = [r.getMessage() for r in caplog.records if "TRACEPARENT" in r.getMessage()]
    assert len(said) == 1 and f"TRACEPARENT={traceparent} is ignored: {why}" in said[0], said


def test_a_traceparent_with_control_characters_is_shown_escaped(propagators, monkeypatch, caplog):
    """The warning quotes the variable: a line break or a terminal escape in it would write
    a forged line into the job's log."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from otel_mindformers.runtime.parts import launcher_context

    propagators(TraceContextTextMapPropagator())
    monkeypatch.setenv("TRACEPARENT", "00-x\nERROR training failed\x1b[2J")
    launcher_context()
    (said,) = [r.getMessage() for r in caplog.records if "TRACEPARENT" in r.getMessage()]
    assert "TRACEPARENT=00-x\\nERROR training failed\\x1b[2J is ignored" in said, said
    assert "\n" not in said and "\x1b" not in said


def test_a_traceparent_the_run_reads_is_not_mentioned(propagators, monkeypatch, caplog):
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from otel_mindformers.runtime.parts import launcher_context

    propagators(TraceContextTextMapPropagator())
    monkeypatch.setenv("TRACEPARENT", LAUNCHER)
    assert trace.get_current_span(launcher_context()).get_span_context().span_id == 0xB7AD6B7169203331
    assert not [r for r in caplog.records if "TRACEPARENT" in r.getMessage()]


def test_without_a_traceparent_the_run_starts_its_own_traces_unsaid(propagators, monkeypatch, caplog):
    from opentelemetry import trace

    from otel_mindformers.runtime.parts import launcher_context

    monkeypatch.delenv("TRACEPARENT", raising=False)
    assert not trace.get_current_span(launcher_context()).get_span_context().is_valid
    assert not [r for r in caplog.records if "TRACEPARENT" in r.getMessage()]
