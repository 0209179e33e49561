"""Read JSON-lines training logs back: per-rank files, rotated sets, damaged tails.

What a killed, rotated, multi-rank run leaves behind is read without a traceback:
- a path may be a file, a glob or a directory (a directory yields every `*_rank_*.json`
  under it, or, when there is none, the JSON-lines logs directly inside it);
- a rotated set `name.json.N … name.json.1, name.json` is read oldest first as one log,
  whichever member was named;
- an unparseable last line of a file (a run killed mid-write) is skipped and noted;
- lines written by custom monitors with other keys are counted and skipped, unless a
  file holds nothing else (the monitor_config article's own monitor writes `step`, `loss`, `lr`);
- `null` values and the `"nonfinite"` list come back as NaN and a set of names;
- alert lines (an `"alert"` key, or an alert in the shape our notifiers send) are marks;
- a line's `time` object (seconds by phase, docs/time.md) comes back as a dict of floats.
An unparseable line anywhere else raises `LogReadError` naming the file and line number.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from otel_mindformers.core import safe_json
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord, counted_nonfinite
from otel_mindformers.model_state.state import ModelState
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.runs import set_aside_stamp

_logger = get_logger(__name__)

RANK_FILE_PATTERN = "*_rank_*.json"

_BACKUP_SUFFIX = re.compile(r"^(?P<base>.+)\.(?P<index>\d+)$")
_RANK_IN_NAME = re.compile(r"_rank_(\d+)")
GLOB_CHARS = frozenset("*?[")

# Keys every line of our JSON sink carries; a line without them came from someone else.
_OWN_KEYS = frozenset({"time_stamp", "step", "epoch", "rank"})
# Spellings other writers use for our metrics (the monitor_config article's custom monitor writes "lr").
_ALIASES = {"lr": tm.LEARNING_RATE}
_NOT_VALUES = frozenset(
    {"time_stamp", "step", "epoch", "rank", "world_size", "nonfinite", "alert", "alerts", "recovered"}
)


class AnalysisError(ValueError):
    """A problem the analysis commands report in one line, without a traceback."""


class LogReadError(AnalysisError):
    """A log cannot be read; the message names the file (and line) and the problem."""


@dataclass(frozen=True)
class Location:
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class StepPoint:
    """One logged step. Missing and non-finite values are NaN; `nonfinite` names the latter."""

    step: int
    time_stamp: float | None
    epoch: int | None
    values: dict[str, float]
    nonfinite: frozenset[str]
    location: Location
    # The line's `model_state` summary (model_state/state.py), when it has one.
    model_state: dict | None = None
    # The line's `time` object: cumulative seconds by phase since the run's origin, with
    # `wall` and `productive` (goodput.py), when it has one.
    time: dict[str, float] | None = None
    # The line's `sections` object: the window's seconds by section (stragglers/sections.py).
    sections: dict[str, float] | None = None
    # The line's job id and attempt number (its `job` object, restarts/attempt_tracker.py), when it has them.
    job: tuple[str, int] | None = None
    # The job's rank count, when the line says (`world_size`, written by multi-rank jobs).
    world_size: int | None = None

    def value(self, name: str) -> float:
        return self.values.get(name, math.nan)

    @property
    def overflow(self) -> bool:
        return self.values.get(tm.OVERFLOW, 0.0) == 1.0

    @property
    def counted_nonfinite(self) -> frozenset[str]:
        """`nonfinite` less what loss scaling explains (a grad norm on an overflow step)."""
        if not self.nonfinite:
            return self.nonfinite
        return frozenset(counted_nonfinite(self.nonfinite, self.overflow))


@dataclass(frozen=True)
class AlertMark:
    """An alert line: what fired (rule, when known), and at which step if it says."""

    step: int | None
    time_stamp: float | None
    rule: str | None
    message: str
    location: Location

    def describe(self) -> str:
        # A step line names only the rules that fired there: the rule is all there is to say.
        return f"{self.rule}: {self.message}" if self.rule and self.message != self.rule else self.message


@dataclass
class Series:
    """One rank's (or one writer's) steps, in the order they were written."""

    label: str
    rank: int | None
    files: tuple[Path, ...]
    points: list[StepPoint] = field(default_factory=list)
    alerts: list[AlertMark] = field(default_factory=list)
    foreign_lines: int = 0
    damaged_tails: list[Location] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)  # `FILE:LINE: what`, lines left out


@dataclass(frozen=True)
class LogSet:
    """The files of one log, oldest first: rotated backups `.N … .1`, then the current file."""

    name: Path
    files: tuple[Path, ...]


# --- discovery -----------------------------------------------------------------------------


def discover(inputs: Sequence[str | Path], *, one_run_per_folder: bool = False) -> list[LogSet]:
    """Resolve files, globs and directories into log sets, each named once, in input order.
    With `one_run_per_folder`, a folder yields the logs of its latest run only (`_one_run`).

    Linear in the number of files: each folder is listed once (a rotated set's backups are
    found in that listing, not by listing the folder again per file), and a walk follows a
    symbolic link to a folder only the first time it reaches that folder (loops end)."""
    listings = _Listings()
    bases: dict[Path, None] = {}
    for item in inputs:
        for path in _expand(str(item), listings, one_run_per_folder):
            bases.setdefault(_base_of(path), None)
    return [LogSet(base, listings.members(base)) for base in bases]


class _Listings:
    """Each folder's `name.json.N` backups, from one listing of the folder."""

    def __init__(self) -> None:
        self._backups: dict[Path, dict[str, list[tuple[int, Path]]]] = {}

    def members(self, base: Path) -> tuple[Path, ...]:
        folder = self._backups.get(base.parent)
        if folder is None:
            folder = self._backups[base.parent] = _backups_in(base.parent)
        ordered = [p for _, p in sorted(folder.get(base.name, ()), reverse=True)]  # .N is the oldest
        if base.is_file():
            ordered.append(base)
        return tuple(ordered)


def _backups_in(folder: Path) -> dict[str, list[tuple[int, Path]]]:
    found: dict[str, list[tuple[int, Path]]] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        match = _BACKUP_SUFFIX.match(entry.name)
        if match and entry.is_file():
            found.setdefault(match["base"], []).append((int(match["index"]), Path(folder, entry.name)))
    return found


def walk_files(root: Path) -> Iterator[Path]:
    """Files under `root`, sorted per folder, through symbolic links to folders (a rank's
    folder linked into the job's); a folder reached again (a link loop) is skipped. The one
    folder walk of every command (`report`, `plot`, `replay`, `hang-report`)."""
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            info = folder.stat()
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        subfolders = []
        for entry in entries:
            try:
                if entry.is_dir():
                    subfolders.append(Path(entry.path))
                elif entry.is_file():
                    yield Path(entry.path)
            except OSError:  # a dangling link, a loop of links to itself
                continue
        stack.extend(reversed(subfolders))


def glob_files(pattern: str) -> list[Path]:
    """Files matching `pattern` (`**` spans folders), found by one loop-safe walk."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if GLOB_CHARS & set(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    wanted = parts[fixed:]
    found = []
    for path in walk_files(root):
        relative = path.relative_to(root).parts
        if _match_parts(wanted, relative):
            found.append(path)
    return sorted(found)


def _match_parts(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """fnmatch per path component, `**` matching any number of components."""
    reachable = {0}  # how many components of `parts` the pattern so far can have consumed
    for piece in pattern:
        if piece == "**":
            reachable = set(range(min(reachable), len(parts) + 1)) if reachable else set()
        else:
            reachable = {i + 1 for i in reachable if i < len(parts) and fnmatch.fnmatchcase(parts[i], piece)}
    return len(parts) in reachable


def _expand(item: str, listings: _Listings, one_run_per_folder: bool = False) -> list[Path]:
    path = Path(item)
    if path.is_dir():
        files = list(walk_files(path))
        found = sorted(p for p in files if fnmatch.fnmatchcase(p.name, RANK_FILE_PATTERN)) or [
            p for p in sorted(path.glob("*.json")) if _looks_like_step_log(p)
        ]
        if not found:
            raise LogReadError(
                f"{item}: no step logs in this directory (looked for {RANK_FILE_PATTERN} and JSON-lines *.json files)"
            )
        return _one_run(found, item) if one_run_per_folder else found
    if GLOB_CHARS & set(item):
        matches = glob_files(item)
        if not matches:
            raise LogReadError(f"{item}: no files match")
        return matches
    if path.is_file():
        return [path]
    if _base_of(path) != path and listings.members(_base_of(path)):
        return [path]  # a backup named after it was rotated away: its set still exists
    raise LogReadError(f"{item}: no such file or directory")


def _one_run(found: list[Path], folder: str) -> list[Path]:
    """A folder's logs of one run: the run writing there now, else the last one set aside.
    Earlier runs' logs set aside beside them (outputs/runs.py) are other runs, not other
    ranks: `report` would compare them as stragglers and span its wall time across them."""
    by_run: dict[str | None, list[Path]] = {}
    for path in found:
        by_run.setdefault(set_aside_stamp(path), []).append(path)
    if len(by_run) == 1:
        return found
    stamps = sorted(stamp for stamp in by_run if stamp is not None)
    kept = None if None in by_run else stamps[-1]
    others = [stamp for stamp in stamps if stamp != kept]
    _logger.warning(
        "otel_mindformers: %s: reading %s; left out the logs of %d earlier run(s) set aside there (%s): "
        "name their files to read them",
        folder,
        "the current run" if kept is None else f"the run set aside as {kept}",
        len(others),
        ", ".join(others),
    )
    return by_run[kept]


def _base_of(path: Path) -> Path:
    """`x.json.3` → `x.json`; other names are their own base."""
    match = _BACKUP_SUFFIX.match(path.name)
    return path.with_name(match["base"]) if match else path


def _looks_like_step_log(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as handle:
            first = handle.readline(64 * 1024)
        data = safe_json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "step" in data


# --- reading -------------------------------------------------------------------------------


class PointSink(Protocol):
    """Where the points of one series go as they are read (a list, or a running summary)."""

    def add(self, point: StepPoint) -> None: ...


S = TypeVar("S", bound=PointSink)


@dataclass
class Scanned(Generic[S]):
    """One series as `scan_logs` leaves it: its points went to `sink`, the rest is here."""

    label: str
    rank: int | None
    files: tuple[Path, ...]
    sink: S
    alerts: list[AlertMark] = field(default_factory=list)
    foreign_lines: int = 0
    damaged_tails: list[Location] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)  # `FILE:LINE: what`, lines left out
    records: int = 0  # points handed to `sink`


class _PointList(list):
    def add(self, point: StepPoint) -> None:
        self.append(point)


def read_logs(inputs: Sequence[str | Path], *, one_run_per_folder: bool = False) -> list[Series]:
    """Every series found in `inputs`, labelled so that a legend tells them apart; with
    `one_run_per_folder`, a folder's latest run only (`discover`)."""
    return [
        Series(
            label=s.label,
            rank=s.rank,
            files=s.files,
            points=list(s.sink),
            alerts=s.alerts,
            foreign_lines=s.foreign_lines,
            damaged_tails=s.damaged_tails,
            out_of_range=s.out_of_range,
        )
        for s in scan_logs(inputs, _PointList, one_run_per_folder=one_run_per_folder)
    ]


def scan_logs(
    inputs: Sequence[str | Path], new_sink: Callable[[], S], *, one_run_per_folder: bool = False
) -> list[Scanned[S]]:
    """Read `inputs` line by line, handing each series' points to a sink of its own: memory
    stays with the sinks (a running summary keeps a few numbers per record, not the lines)."""
    scanned: list[Scanned[S]] = []
    for log_set in discover(inputs, one_run_per_folder=one_run_per_folder):
        scanned += _scan_set(log_set, new_sink)
    labels = _labels([(Path(s.label), s.rank) for s in scanned])  # the label is the set's name so far
    for one, label in zip(scanned, labels):
        one.label = label
    _say_empty(scanned)
    return scanned


def _say_empty(scanned: Sequence[Scanned]) -> None:
    """Sets without a step record: an error when no set has one (an empty file, a file that
    is not a log), else one warning each. Lines too large to hold are said elsewhere."""
    empty = [s for s in scanned if not s.records and not s.alerts and not s.out_of_range]
    if not empty:
        return
    problems = [f"{', '.join(map(str, s.files)) or s.label}: no step records ({_why_empty(s)})" for s in empty]
    if len(empty) == len(scanned):
        raise LogReadError("; ".join(problems))
    for problem in problems:
        _logger.warning("otel_mindformers: %s", problem)


def _why_empty(one: Scanned) -> str:
    if one.damaged_tails and not one.foreign_lines:  # its only line does not parse
        where = one.damaged_tails[0]
        try:
            with where.path.open(encoding="utf-8", errors="replace") as handle:
                text = next((line or "" for n, line in safe_json.bounded_lines(handle) if n == where.line), "")
        except OSError:
            text = ""
        if text.lstrip().startswith("{"):  # half a record: the writer was killed writing it
            return f"its only line, {where.line}, is cut short: {text.strip()[:80]!r}"
        return f"not a JSON-lines log: line {where.line} is not JSON: {text.strip()[:80]!r}"
    if one.foreign_lines:
        return f'{one.foreign_lines} line(s), none with a "step": not a training log'
    return "the file is empty"


def _scan_set(log_set: LogSet, new_sink: Callable[[], S]) -> list[Scanned[S]]:
    """Our lines grouped by their `rank`; a file with none of ours is its writer's series
    (its lines are held until the end of the set tells whether one of ours came)."""
    by_rank: dict[int | None, Scanned[S]] = {}
    foreign_steps: list[StepPoint] = []
    first = Scanned(str(log_set.name), None, log_set.files, new_sink())
    for path in log_set.files:
        for data, location in _lines(path, first.damaged_tails):
            if not isinstance(data, dict):  # a JSON value that is not an object: not a record
                first.foreign_lines += 1
                continue
            kind = _classify(data, location, first.alerts)
            if kind is _OWN:
                rank = _int_or_none(data.get("rank"))
                point = _point(data, location)
                problem = number_problem(rank, point)
                if problem is not None:  # a corrupted or hand-edited line no tool can hold
                    first.out_of_range.append(f"{location}: {problem}")
                    continue
                series = by_rank.get(rank)
                if series is None:
                    series = by_rank[rank] = (
                        first if not by_rank else Scanned(str(log_set.name), rank, log_set.files, new_sink())
                    )
                    series.rank = rank
                series.sink.add(point)
                series.records += 1
                first.foreign_lines += len(foreign_steps)
                foreign_steps.clear()
            elif kind is _FOREIGN_STEP and not by_rank:
                foreign_steps.append(_point(data, location))
            elif kind is not None:  # alert lines are marks, not foreign lines
                first.foreign_lines += 1
    if not by_rank:
        first.rank = _rank_from_name(log_set.name)
        for point in foreign_steps:
            first.sink.add(point)
        first.records = len(foreign_steps)
        return [first]
    return list(by_rank.values())


def _lines(path: Path, damaged_tails: list[Location]) -> Iterator[tuple[object, Location]]:
    """The parsed lines of `path`, one at a time."""
    # A line that fails to parse is only an error once another line follows it: the last
    # line of a file is where a killed writer leaves half a record.
    failed: tuple[Location, str] | None = None
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, text in safe_json.bounded_lines(handle):
                if text is not None and not text.strip():
                    continue
                if failed is not None:
                    location, reason = failed
                    raise LogReadError(f"{location}: not a JSON line ({reason})")
                location = Location(path, number)
                if text is None:
                    failed = (location, safe_json.TOO_LONG)
                    continue
                try:
                    data = safe_json.loads(text)
                except ValueError as exc:
                    failed = (location, f"{getattr(exc, 'msg', exc)}: {text.strip()[:80]!r}")
                    continue
                yield data, location
    except OSError as exc:
        raise LogReadError(f"{path}: cannot read: {exc.strerror}") from None
    if failed is not None:
        damaged_tails.append(failed[0])


_OWN, _FOREIGN_STEP, _OTHER = object(), object(), object()


def _classify(data: dict, location: Location, alerts: list[AlertMark]) -> object:
    """_OWN (a line of our sink), _FOREIGN_STEP (another writer's step line) or _OTHER;
    alert lines, and the alerts a step line names, are added to `alerts`."""
    if "alert" in data or _is_notifier_alert(data):
        if data.get("status") != "resolved":
            alerts.append(
                AlertMark(
                    step=_int_or_none(data.get("step")),
                    time_stamp=_float_or_none(data.get("time_stamp")),
                    rule=str(data["rule"]) if "rule" in data else None,
                    message=str(data.get("alert") or data.get("message") or data.get("rule")),
                    location=location,
                )
            )
        return None
    fired = data.get("alerts")
    for rule in fired if isinstance(fired, list) else ():  # our step lines name what fired there
        alerts.append(
            AlertMark(
                step=_int_or_none(data.get("step")),
                time_stamp=_float_or_none(data.get("time_stamp")),
                rule=str(rule),
                message=str(rule),
                location=location,
            )
        )
    if _int_or_none(data.get("step")) is None:
        return _OTHER
    return _OWN if data.keys() >= _OWN_KEYS else _FOREIGN_STEP


def _is_notifier_alert(data: dict) -> bool:
    """The JSON body of `alerts.alert.Alert.to_json_dict` (what the webhook notifier sends)."""
    return data.get("source") == "otel_mindformers" and "rule" in data and "status" in data


def _point(data: dict, location: Location) -> StepPoint:
    listed = data.get("nonfinite")
    nonfinite = {str(n) for n in listed} if isinstance(listed, list) else set()
    values: dict[str, float] = {}
    for key, raw in data.items():
        if key in _NOT_VALUES:
            continue
        name = _ALIASES.get(key, key)
        if raw is None:
            values[name] = math.nan
        elif isinstance(raw, (int, float)):  # bool too: overflow becomes 1.0 / 0.0
            value = float(raw)
            if not math.isfinite(value):  # NaN / Infinity literals from other writers
                nonfinite.add(name)
                value = math.nan
            values[name] = value
    return StepPoint(
        step=int(data["step"]),
        time_stamp=_float_or_none(data.get("time_stamp")),
        epoch=_int_or_none(data.get("epoch")),
        values=values,
        nonfinite=frozenset(_ALIASES.get(n, n) for n in nonfinite),
        location=location,
        model_state=data["model_state"] if isinstance(data.get("model_state"), dict) else None,
        time=_seconds_by_phase(data.get("time")),
        sections=_finite_numbers(data.get("sections")),
        job=_job_attempt(data.get("job")),
        world_size=_int_or_none(data.get("world_size")),
    )


def _job_attempt(raw: object) -> tuple[str, int] | None:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str) and type(raw.get("attempt")) is int:
        return raw["id"], raw["attempt"]
    return None


def _finite_numbers(raw: object) -> dict[str, float] | None:
    """An object's finite numbers by key; None when it is no object or holds none."""
    if not isinstance(raw, dict):
        return None
    kept = {
        str(key): float(value)
        for key, value in raw.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }
    return kept or None


def _seconds_by_phase(raw: object) -> dict[str, float] | None:
    """A `time` object's finite numbers; None when the line has none (or it holds no `wall`)."""
    kept = _finite_numbers(raw)
    return kept if kept and "wall" in kept else None


def as_records(series: Series) -> list[StepRecord]:
    """The series as the StepRecords the live pipeline built (points without a time stamp
    cannot be placed in time and are left out). Known metrics become values (NaN where
    non-finite), other numbers device readings; the window is the distance to the previous
    record."""
    records: list[StepRecord] = []
    previous: int | None = None
    for point in series.points:
        window = point.step - previous if previous is not None and point.step > previous else 1
        previous = point.step
        if point.time_stamp is None:
            continue
        values: dict[str, float | bool] = {}
        device: dict[str, float] = {}
        for name, value in point.values.items():
            if name not in tm.BY_KEY:
                if not math.isnan(value):
                    device[name] = value
            elif name in point.nonfinite or not math.isnan(value):
                values[name] = bool(value) if name == tm.OVERFLOW else value
        records.append(
            StepRecord(
                step=point.step,
                epoch=point.epoch or 0,
                rank=series.rank or 0,
                time_stamp=point.time_stamp,
                steps_in_window=window,
                values=values,
                device=device,
                model_state=ModelState.from_summary(point.model_state) if point.model_state else None,
                job={"id": point.job[0], "attempt": point.job[1]} if point.job else None,
            )
        )
    return records


# OTLP carries integers as int64 and times as int64 nanoseconds since the epoch.
_INT64 = 2**63
_LATEST_TIME_STAMP = (_INT64 - 1) / 1e9  # 2262-04-11


def number_problem(rank: int | None, point: StepPoint) -> str | None:
    """What in a line no analysis can hold: a step, epoch or rank past 64 bits (2**70), a
    time stamp outside 1970..2262 (1e300); None when it can be read, reported and sent."""
    if rank is not None and not 0 <= rank < _INT64:
        return f"rank {rank} is outside 0..2**63-1"
    if not 0 <= point.step < _INT64:
        return f"step {point.step} is outside 0..2**63-1"
    if point.epoch is not None and not 0 <= point.epoch < _INT64:
        return f"epoch {point.epoch} is outside 0..2**63-1"
    if point.time_stamp is not None and not 0 <= point.time_stamp <= _LATEST_TIME_STAMP:
        return f"time_stamp {point.time_stamp!r} is not a time between 1970 and 2262 (seconds since the epoch)"
    return None


def replay_problems(series: Sequence[Series]) -> list[str]:
    """`FILE:LINE: what` for every record whose numbers cannot be sent as telemetry (the
    reader left them out, `out_of_range`); empty when the whole run can be."""
    return [note for one in series for note in one.out_of_range]


def local_time(seconds: float, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """`seconds` since the epoch as local time; a finite time stamp no calendar holds (a
    hand-edited record) as the number itself."""
    try:
        return time.strftime(pattern, time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return f"{seconds:g}"


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _rank_from_name(path: Path) -> int | None:
    match = _RANK_IN_NAME.search(path.name)
    return int(match[1]) if match else None


# --- labels --------------------------------------------------------------------------------


def _labels(keys: Iterable[tuple[Path, int | None]]) -> list[str]:
    """`rank N` when that alone tells the series apart, else the shortest distinct path."""
    keys = list(keys)
    ranks = [rank for _, rank in keys]
    if None not in ranks and len(set(ranks)) == len(ranks):
        return [f"rank {rank}" for rank in ranks]
    shortest = _shortest_distinct([path for path, _ in keys])
    names = [shortest[path] for path, _ in keys]
    per_name = Counter(names)
    return [
        f"{name} rank {rank}" if per_name[name] > 1 and rank is not None else name
        for name, (_, rank) in zip(names, keys)
    ]


def _shortest_distinct(paths: list[Path]) -> dict[Path, str]:
    """Each path's shortest tail of components (`.json` dropped) that no other path ends in;
    one count of tails per depth, so linear in the number of paths."""
    parts = {
        path: path.with_suffix("").parts if path.suffix == ".json" else path.parts for path in dict.fromkeys(paths)
    }
    names = {path: "/".join(p) for path, p in parts.items()}
    pending = set(parts)
    for depth in range(1, max((len(p) for p in parts.values()), default=0) + 1):
        tails = Counter(p[-depth:] for p in parts.values())
        for path in [path for path in pending if depth <= len(parts[path])]:
            if tails[parts[path][-depth:]] == 1:
                names[path] = "/".join(parts[path][-depth:])
                pending.discard(path)
    return names
