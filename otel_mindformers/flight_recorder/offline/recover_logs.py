"""The offline commands' share of the flight recorder: before `report`, `replay` or
`hang-report` reads a folder, what a dead run's ring holds past what its outputs wrote goes
into its own JSON log (flight_recorder/recovery.py takes the tail and finds the log). The
ring stays, for its last finished step and for the next attempt, which sends the tail over
OTLP: it notes where the lines it wrote begin (`Tail.mark_logged`), not that they are out."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.flight_recorder.recovery import own_log, take_tail, write_log
from otel_mindformers.flight_recorder.ring import SUFFIX
from otel_mindformers.outputs.jsonl import last_step_line
from otel_mindformers.outputs.jsonl_reader import glob_files, walk_files

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
        print(
            f"note: recovered {count} record(s) into {log} that its run had not written there "
            "(the run died, or its outputs failed: a full disk)",
            file=sys.stderr,
        )


def recover_rings(rings: Iterable[Path]) -> list[tuple[Path, int]]:
    """Recover the dead ones among `rings` into the JSON logs beside them that they belong
    to (recovery.own_log); (log, records appended) for each. A ring whose log is nowhere
    (another job's or rank's lines at its name and none set aside, or a file that is no
    JSON log) is left as it is, with one warning: nothing else is written."""
    appended = []
    for path in dict.fromkeys(rings):
        tail = take_tail(path)
        if tail is None:
            continue
        try:
            if not tail.slots:
                continue
            log, why_not = own_log(path, tail.header)
            if log is None:
                _logger.warning_once(
                    str(path), "otel_mindformers: the flight ring %s is not recovered: %s", path, why_not
                )
                continue
            records = tail.unlogged(last_step_line(log))
            if records:
                tail.mark_logged(records)  # first: lines a failed write left are still sent by the next attempt
                write_log(records, log)
                appended.append((log, len(records)))
        except OSError as exc:
            _logger.warning_once(
                str(path), "otel_mindformers: cannot recover the flight ring %s into its log (%s)", path, exc
            )
        finally:
            tail.release()
    return appended


__all__ = ["recover_dead_runs", "recover_rings"]
