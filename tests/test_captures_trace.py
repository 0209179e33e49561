"""A capture's trace_view.json read back (captures/offline/profile_trace.py) in the shapes
Chrome's trace format allows and the ones a broken or hostile file holds: `report --html`
and `capture --plot` draw what is readable and say in one line what is not, never a
traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from otel_mindformers.captures.offline.profile_trace import TraceError, trace_operators
from otel_mindformers.cli import main as cli_main
from tests.support.html_dom import parse
from tests.support.paths import LOG_FIXTURES

pytestmark = pytest.mark.analysis  # the offline commands: numpy 2's row runs them too

CPU = {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "CPU OP"}}
MATMUL = {"ph": "X", "pid": 7, "ts": 1000.5, "dur": 2.25, "name": "Default/MatMul-op0"}


def _trace(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "trace_view.json"
    path.write_text(content, encoding="utf-8")
    return path


def test_the_list_and_the_object_form_read_alike(tmp_path):
    listed = trace_operators(_trace(tmp_path, json.dumps([CPU, MATMUL])))
    assert listed == [(1_000_500, 2_250, "Default/MatMul-op0")]
    wrapped = {"traceEvents": [CPU, MATMUL], "displayTimeUnit": "ns"}
    assert trace_operators(_trace(tmp_path, json.dumps(wrapped))) == listed


def test_events_that_are_no_finite_operator_are_left_out(tmp_path):
    odd = [
        {**MATMUL, "dur": 1e400},  # JSON's way to overflow a float: inf
        {**MATMUL, "ts": "NaN"},
        {**MATMUL, "ts": 10**400},
        {**MATMUL, "dur": -1},
        {**MATMUL, "dur": True},
        {**MATMUL, "pid": [7]},
        {**MATMUL, "ts": {"µs": 1}},
        "an event that is a string",
        {"ph": "M", "pid": 8, "args": "CPU OP"},
    ]
    text = json.dumps([CPU, *odd, MATMUL]).replace('"dur": Infinity', '"dur": 1e400')
    assert "1e400" in text
    assert trace_operators(_trace(tmp_path, text)) == [(1_000_500, 2_250, "Default/MatMul-op0")]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        ("{not json", "not JSON"),
        ('{"traceEvents": 5}', "neither a list of events"),
        ('"a string"', "neither a list of events"),
    ],
)
def test_a_file_that_is_no_trace_is_one_trace_error_naming_it(tmp_path, content, why):
    trace = _trace(tmp_path, content)
    with pytest.raises(TraceError, match=why) as raised:
        trace_operators(trace)
    assert str(raised.value).startswith(f"{trace}: not a trace")


def _capture_with(root: Path, content: str) -> Path:
    """An analysed capture (manifest and trace) whose trace holds `content`."""
    folder = root / "rank_0" / "20261201T000000-step5-manual"
    trace = folder / "profile" / "r0_ascend_ms" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    trace.parent.mkdir(parents=True)
    trace.write_text(content, encoding="utf-8")
    manifest = {"rank": 0, "step": 5, "trigger": "manual", "status": "analysed", "time_stamp": time.time()}
    (folder / "capture.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


ODD = {
    "object form": json.dumps({"traceEvents": [CPU, MATMUL]}),
    "infinite duration": json.dumps([CPU, MATMUL]).replace('"dur": 2.25', '"dur": 1e400'),
    "deep nesting": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("shape", list(ODD))
def test_report_html_and_capture_plot_draw_or_name_an_odd_trace(tmp_path, capsys, shape):
    captures = _capture_with(tmp_path / "captures", ODD[shape])
    page = tmp_path / "run.html"
    args = ["report", str(LOG_FIXTURES / "multirank"), "--captures", str(captures), "--html", str(page)]
    assert cli_main(args) == 0
    capsys.readouterr()
    document = parse(page.read_text(encoding="utf-8"))
    drawn = [f for f in document.by_id("captures").all("figure") if f.attrs["id"] == "ops-0"]
    notes = [p.text() for p in document.by_id("captures").all("p", "note")]
    status = cli_main(["capture", "--plot", str(tmp_path / "trace.png"), str(captures)])
    said = capsys.readouterr()
    if shape == "deep nesting":
        assert not drawn and any("not a trace (JSON nested too deep to read)" in note for note in notes), notes
        assert status == 1 and said.err.startswith("error: ") and "nested too deep" in said.err
        assert said.err.count("\n") == 1, said.err
    else:
        assert drawn and status == 0 and (tmp_path / "trace.png").stat().st_size > 0, (notes, said.err)
        operators = drawn[0].all("rect", "op")
        assert len(operators) == (1 if shape == "object form" else 0)


def test_capture_plot_to_a_name_that_is_no_image_file_is_refused(tmp_path, capsys):
    """matplotlib would write `trace` as trace.png while the command named `trace`."""
    captures = _capture_with(tmp_path / "captures", ODD["object form"])
    with pytest.raises(SystemExit) as exited:
        cli_main(["capture", "--plot", str(tmp_path / "trace"), str(captures)])
    assert exited.value.code == 2
    assert "argument --plot: " in capsys.readouterr().err
    assert not (tmp_path / "trace.png").exists()
