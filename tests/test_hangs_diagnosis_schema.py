"""`report` and `hang-report` over diagnosis records and JSON lines that are valid JSON with
wrong fields: the bad record is skipped with a note naming its file and line, and every
other rank is still reported. Property-based over the record schema, plus the twelve
variants a hostile-input run found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_mindformers.analysis.report import render, report_logs
from otel_mindformers.hangs.offline.hang_report import build_hang_report, render_text, to_json
from otel_mindformers.outputs.diagnosis_schema import problem

GOOD_FRAME = {"file": "/job/train.py", "line": 12, "function": "step", "source": "loss = net(x)"}


def _stacks(rank: int, step: int) -> dict:
    return {
        "kind": "stacks", "time_stamp": 1796140000.0 + rank, "rank": rank, "step": step, "reason": "stall",
        "phase": "step", "last_step_time": 1796139990.0, "verdict": None,
        "threads": [{"name": "MainThread", "ident": 1, "training": True, "frames": [dict(GOOD_FRAME)]}],
    }  # fmt: skip


def _nonfinite(rank: int, step: int) -> dict:
    return {"kind": "nonfinite", "time_stamp": 1796140000.0, "rank": rank, "step": step, "metrics": ["loss"]}


def _step_line(rank: int, step: int) -> dict:
    return {"time_stamp": 1796140000.0 + step, "step": step, "epoch": 1, "rank": rank, "loss": 1.0}


# What a field may be replaced by: everything JSON can hold, of the wrong shape or not.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _corrupt(draw, record: dict) -> dict:
    """`record` with one field (or one field of a thread or frame) replaced or removed."""
    record = json.loads(json.dumps(record))
    targets = [(record, key) for key in record]
    for thread in record.get("threads", []):
        targets += [(thread, key) for key in thread]
        for frame in thread.get("frames", []):
            targets += [(frame, key) for key in frame]
    holder, key = draw(st.sampled_from(targets))
    if draw(st.booleans()):
        del holder[key]
    else:
        holder[key] = draw(_JSON)
    return record


def _job(folder: Path, bad_diagnosis: dict, bad_line: dict | None) -> None:
    """Rank 1 healthy (a dump, its log); rank 0's diagnosis file holds the bad record."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "diagnosis_rank_0.jsonl").write_text(json.dumps(bad_diagnosis) + "\n")
    (folder / "diagnosis_rank_1.jsonl").write_text(json.dumps(_stacks(1, 7)) + "\n")
    lines = [_step_line(1, step) for step in (1, 2, 3)]
    (folder / "m_rank_1.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if bad_line is not None:
        (folder / "m_rank_0.json").write_text(json.dumps(_step_line(0, 1)) + "\n" + json.dumps(bad_line) + "\n")


def _both_reports_survive(folder: Path) -> tuple[str, dict]:
    hang = build_hang_report([folder])
    text, data = render_text(hang), to_json(hang)
    assert 1 in [beat.rank for beat in hang.heartbeats]  # the healthy rank is still there
    logs = report_logs([folder])
    assert 1 in [series.rank for series in logs.series]
    for fmt in ("text", "json", "markdown"):
        render(logs, fmt)
    return text, data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_one_wrong_field_is_skipped_with_a_note_and_hides_no_other_rank(tmp_path_factory, data):
    draw = data.draw
    base = draw(st.sampled_from([_stacks(0, 5), _nonfinite(0, 5)]))
    bad = _corrupt(draw, base)
    line = _corrupt(draw, _step_line(0, 2)) if draw(st.booleans()) else None
    folder = tmp_path_factory.mktemp("job")
    _job(folder, bad, line)
    text, report = _both_reports_survive(folder)
    if isinstance(bad.get("kind"), str) and problem(bad) is not None:
        assert any(note.startswith(f"{folder / 'diagnosis_rank_0.jsonl'}:1: ") for note in report["skipped"])
        assert "diagnosis record skipped" in text


@pytest.mark.parametrize("huge", [1e300, 2**70])
def test_numbers_too_large_for_a_step_or_a_calendar_stop_neither_report(tmp_path, huge):
    """Valid JSON numbers past what a step (64 bits) or a calendar holds: a hand-edited or
    corrupted record, which the property test above finds only now and then."""
    record = _stacks(0, 5)
    record["time_stamp"] = record["last_step_time"] = float(huge)
    line = _step_line(0, 2)
    line["step"] = huge
    _job(tmp_path, record, line)
    text, _ = _both_reports_survive(tmp_path)
    assert f"{float(huge):g}" in text  # the time stamp as the number it is
    # The step line is left out of the report, named as replay names it.
    summary = render(report_logs([tmp_path]), "text")
    assert f"m_rank_0.json:2: step {int(huge)} is outside 0..2**63-1" in summary


VARIANTS = {
    "rank missing": lambda r: r.pop("rank"),
    "rank null": lambda r: r.update(rank=None),
    "rank a word": lambda r: r.update(rank="zero"),
    "time_stamp a string": lambda r: r.update(time_stamp="yesterday"),
    "step missing": lambda r: r.pop("step"),
    "step a string": lambda r: r.update(step="12.5"),
    "threads a string": lambda r: r.update(threads="MainThread"),
    "frame without line": lambda r: r["threads"][0]["frames"][0].pop("line"),
    "frames null": lambda r: r["threads"][0].update(frames=None),
}
NONFINITE_VARIANTS = {
    "nonfinite with a bad step": lambda r: r.update(step="3"),
    "metrics a number": lambda r: r.update(metrics=5),
    "nonfinite rank null": lambda r: r.update(rank=None),
}


def test_the_twelve_reported_variants(tmp_path):
    cases = [(name, _stacks(0, 5), change) for name, change in VARIANTS.items()]
    cases += [(name, _nonfinite(0, 5), change) for name, change in NONFINITE_VARIANTS.items()]
    assert len(cases) == 12
    for index, (name, record, change) in enumerate(cases):
        change(record)
        folder = tmp_path / str(index)
        _job(folder, record, None)
        text, report = _both_reports_survive(folder)
        (note,) = report["skipped"]
        assert note.startswith(f"{folder / 'diagnosis_rank_0.jsonl'}:1: diagnosis record skipped ("), name
        # `report` names it too, beside its first-bad-rank line.
        assert note in render(report_logs([folder]), "text"), name


def test_hang_report_walks_symlinked_rank_folders_as_report_does(tmp_path):
    # Each rank writes on its own node; the job folder links the ranks' folders in.
    job, elsewhere = tmp_path / "job", tmp_path / "node-b" / "rank1"
    (job / "rank0").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    (job / "rank1").symlink_to(elsewhere, target_is_directory=True)
    (job / "loop").symlink_to(job, target_is_directory=True)  # a link back up: the walk ends
    for rank, folder, step in ((0, job / "rank0", 9), (1, elsewhere, 5)):
        (folder / f"diagnosis_rank_{rank}.jsonl").write_text(json.dumps(_stacks(rank, step)) + "\n")
        lines = [_step_line(rank, s) for s in range(1, step + 1)]
        (folder / f"m_rank_{rank}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))

    hang = build_hang_report([job])
    assert [(beat.rank, beat.step) for beat in hang.heartbeats] == [(0, 9), (1, 5)]
    assert hang.ranks_without_dump == []  # rank 1's dump is found through the link
    assert sorted(group.ranks for group in hang.groups) == [[0, 1]]
    assert sorted(s.rank for s in report_logs([job]).series) == [0, 1]
