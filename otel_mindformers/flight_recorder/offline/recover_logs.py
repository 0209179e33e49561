"""The offline commands' share of the flight recorder: before `report`, `replay` or
`hang-report` reads a folder, what a dead run's ring holds past what its outputs wrote goes
into its JSON log (flight_recorder/recovery.py takes the tail; the ring stays, for its last
finished step)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from otel_mindformers.analysis.logs import glob_files, walk_files
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.flight_recorder.recovery import take_tail
from otel_mindformers.flight_recorder.ring import SUFFIX
from otel_mindformers.outputs.jsonl import JsonLinesSink, last_job_id, last_step_line

_logger = get_logger(__name__)


def recover_dead_runs(inputs: Sequence[str | Path]) -> None:
    """Before a command reads the logs under `inputs`: what a dead run's flight ring holds
    past what its outputs wrote goes into its JSON log (`recover_rings`), with
    one note on stderr per log."""
    rings: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            rings += [found for found in walk_files(path) if found.name.endswith(SUFFIX)]
        else:
            files = [path] if path.exists() else glob_files(str(item))
            rings += [ring for folder in dict.fromkeys(f.parent for f in files) for ring in folder.glob(f"*{SUFFIX}")]
    for log, count in recover_rings(rings):
        print(f"note: recovered {count} record(s) that a run which died had not written into {log}", file=sys.stderr)


def recover_rings(rings: Iterable[Path]) -> list[tuple[Path, int]]:
    """Recover the dead ones among `rings` into the JSON logs beside them that they belong
    to; (log, records appended) for each. A ring whose log now holds another job's lines is
    left as it is (one warning): its lines are not that job's."""
    appended = []
    for path in dict.fromkeys(rings):
        tail = take_tail(path)
        if tail is None:
            continue
        try:
            if not tail.slots:
                continue
            log = path.parent / (tail.header.json_name or f"{path.name.split('.')[0]}.json")
            logged_job = last_job_id(log)
            if logged_job is not None and logged_job != tail.header.job_id:
                _logger.warning_once(
                    str(path),
                    "otel_mindformers: the flight ring %s is job %r's, and %s now holds job %r's lines: not recovered into it",
                    path, tail.header.job_id, log, logged_job,
                )  # fmt: skip
                continue
            records = tail.unlogged(last_step_line(log))
            if records:
                sink = JsonLinesSink(log)
                try:
                    sink.write(records)
                finally:
                    sink.close()
                appended.append((log, len(records)))
            tail.mark_written()
        except OSError as exc:
            _logger.warning_once(
                str(path), "otel_mindformers: cannot recover the flight ring %s into its log (%s)", path, exc
            )
        finally:
            tail.release()
    return appended


__all__ = ["recover_dead_runs", "recover_rings"]
