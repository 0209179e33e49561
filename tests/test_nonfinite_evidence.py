"""The first bad step across a job from its evidence, without a training: the ranks' first
non-finite records (diagnosis files) and their logs' first non-finite lines, as `report` and
`hang-report` merge them (otel_mindformers/nonfinite/offline/first_bad_rank.py)."""

from __future__ import annotations

import json
import math

from otel_mindformers.nonfinite.offline.first_bad_rank import first_nonfinite, oldest_line_step


def test_a_nan_on_the_logs_first_line_at_step_1_is_certain():
    # Nothing comes before step 1: a log that starts there and is non-finite there has not
    # lost the first bad line to rotation.
    found = first_nonfinite([], logged=[(0, 1, ["loss"], oldest_line_step(1, 1))])
    assert (found.step, found.at_or_before) == (1, False)
    assert oldest_line_step(4, 4) and not oldest_line_step(4, 9)


def test_a_ranks_record_at_the_step_makes_it_certain_whatever_comes_after():
    # Rank 3's diagnosis record is its first NaN; rank 0's log only kept lines from step 12
    # on. The step is 12 for certain, in whichever order the two are read.
    record, rotated = (3, 12, ["grad_norm"]), (0, 12, ["loss"], True)
    found = first_nonfinite([record], logged=[rotated])
    assert (found.step, found.at_or_before) == (12, False)
    assert found.describe() == "first non-finite value at step 12: rank 0 (loss); rank 3 (grad_norm)"
    assert first_nonfinite([], logged=[rotated]).at_or_before


def test_a_rank_named_by_its_record_and_its_log_lists_each_value_once():
    # A reporting rank under `nonfinite_check: all_ranks` writes both: the same NaN, once.
    found = first_nonfinite([(0, 7, ["loss", "grad_norm"])], logged=[(0, 7, ["grad_norm", "loss"], False)])
    assert found.to_json() == {"step": 7, "ranks": [{"rank": 0, "metrics": ["loss", "grad_norm"]}]}


def test_a_kept_runs_log_named_alone_is_judged_with_the_kept_diagnosis_files(tmp_path, capsys):
    """`report train_metric.<when>.json`: a run's log that a later run set aside, with the
    diagnosis files set aside beside it. Rank 1 recorded its NaN at step 3 under
    `nonfinite_check: all_ranks`; the log (rank 0) shows it at step 5. The new run's
    diagnosis files are not that run's evidence."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_mindformers.cli import main
    from otel_mindformers.job.identity import Identity
    from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
    from otel_mindformers.outputs.runs import set_previous_run_aside

    log = tmp_path / "train_metric.json"
    first = FirstNonFinite(
        MeterProvider().get_meter("t"), LoggerProvider().get_logger("t"), Identity(rank=1, world_size=2), str(log)
    )
    assert first.check(3, {"loss": math.nan}) == ["loss"]
    lines = [{"time_stamp": 100.0 + s, "step": s, "epoch": 1, "rank": 0, "loss": 2.0} for s in range(1, 5)]
    lines.append({"time_stamp": 105.0, "step": 5, "epoch": 1, "rank": 0, "loss": None, "nonfinite": ["loss"]})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    kept_log = set_previous_run_aside(log)  # a new run started here: both files kept
    assert set_previous_run_aside(first.path) is not None
    # The new run's own first NaN (rank 1, step 1) is not the kept run's.
    FirstNonFinite(
        MeterProvider().get_meter("t"), LoggerProvider().get_logger("t"), Identity(rank=1, world_size=2), str(log)
    ).check(1, {"loss": math.inf})
    assert main(["report", str(kept_log)]) == 0
    assert "first non-finite value at step 3: rank 1 (loss)" in capsys.readouterr().out
