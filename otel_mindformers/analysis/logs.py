"""Read JSON-lines training logs back: per-rank files, rotated sets, damaged tails.

What a killed, rotated, multi-rank run leaves behind is read without a traceback:
- a path may be a file, a glob or a directory (a directory yields every `*_rank_*.json`
  under it, or, when there is none, the JSON-lines logs directly inside it);
- a rotated set `name.json.N … name.json.1, name.json` is read oldest first as one log,
  whichever member was named;
- an unparseable last line of a file (a run killed mid-write) is skipped and noted;
- lines written by custom monitors with other keys are counted and skipped, unless a
  file holds nothing else (the article's own monitor writes `step`, `loss`, `lr`);
- `null` values and the `"nonfinite"` list come back as NaN and a set of names;
- alert lines (an `"alert"` key, or an alert in the shape our notifiers send) are marks.
An unparseable line anywhere else raises `LogReadError` naming the file and line number.
"""

from __future__ import annotations

import glob
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_mindformers import training_metrics as tm
from otel_mindformers.record import StepRecord

RANK_FILE_PATTERN = "*_rank_*.json"

_BACKUP_SUFFIX = re.compile(r"^(?P<base>.+)\.(?P<index>\d+)$")
_RANK_IN_NAME = re.compile(r"_rank_(\d+)")
_GLOB_CHARS = frozenset("*?[")

# Keys every line of our JSON sink carries; a line without them came from someone else.
_OWN_KEYS = frozenset({"time_stamp", "step", "epoch", "rank"})
# Spellings other writers use for our metrics (the article's custom monitor writes "lr").
_ALIASES = {"lr": tm.LEARNING_RATE}
_NOT_VALUES = frozenset({"time_stamp", "step", "epoch", "rank", "nonfinite", "alert", "alerts"})


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

    def value(self, name: str) -> float:
        return self.values.get(name, math.nan)

    @property
    def overflow(self) -> bool:
        return self.values.get(tm.OVERFLOW, 0.0) == 1.0


@dataclass(frozen=True)
class AlertMark:
    """An alert line: what fired (rule, when known), and at which step if it says."""

    step: int | None
    time_stamp: float | None
    rule: str | None
    message: str
    location: Location

    def describe(self) -> str:
        return f"{self.rule}: {self.message}" if self.rule else self.message


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


@dataclass(frozen=True)
class LogSet:
    """The files of one log, oldest first: rotated backups `.N … .1`, then the current file."""

    name: Path
    files: tuple[Path, ...]


# --- discovery -----------------------------------------------------------------------------

def discover(inputs: Sequence[str | Path]) -> list[LogSet]:
    """Resolve files, globs and directories into log sets, each named once, in input order."""
    bases: dict[Path, None] = {}
    for item in inputs:
        for path in _expand(str(item)):
            bases.setdefault(_base_of(path), None)
    return [LogSet(base, _members(base)) for base in bases]


def _expand(item: str) -> list[Path]:
    path = Path(item)
    if path.is_dir():
        found = sorted(path.rglob(RANK_FILE_PATTERN)) or [
            p for p in sorted(path.glob("*.json")) if _looks_like_step_log(p)
        ]
        if not found:
            raise LogReadError(
                f"{item}: no step logs in this directory (looked for {RANK_FILE_PATTERN} "
                "and JSON-lines *.json files)"
            )
        return found
    if _GLOB_CHARS & set(item):
        matches = [Path(p) for p in sorted(glob.glob(item, recursive=True)) if Path(p).is_file()]
        if not matches:
            raise LogReadError(f"{item}: no files match")
        return matches
    if path.is_file():
        return [path]
    if _base_of(path) != path and _members(_base_of(path)):
        return [path]  # a backup named after it was rotated away: its set still exists
    raise LogReadError(f"{item}: no such file or directory")


def _base_of(path: Path) -> Path:
    """`x.json.3` → `x.json`; other names are their own base."""
    match = _BACKUP_SUFFIX.match(path.name)
    return path.with_name(match["base"]) if match else path


def _members(base: Path) -> tuple[Path, ...]:
    backups: list[tuple[int, Path]] = []
    prefix = base.name + "."
    if base.parent.is_dir():
        for candidate in base.parent.iterdir():
            suffix = candidate.name[len(prefix):]
            if candidate.name.startswith(prefix) and suffix.isdigit() and candidate.is_file():
                backups.append((int(suffix), candidate))
    ordered = [p for _, p in sorted(backups, reverse=True)]  # .N is the oldest
    if base.is_file():
        ordered.append(base)
    return tuple(ordered)


def _looks_like_step_log(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as handle:
            first = handle.readline()
        data = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "step" in data


# --- reading -------------------------------------------------------------------------------

@dataclass
class _Parsed:
    own: list[tuple[dict, Location]] = field(default_factory=list)
    foreign_steps: list[tuple[dict, Location]] = field(default_factory=list)
    alerts: list[AlertMark] = field(default_factory=list)
    foreign_lines: int = 0
    damaged_tails: list[Location] = field(default_factory=list)


def read_logs(inputs: Sequence[str | Path]) -> list[Series]:
    """Every series found in `inputs`, labelled so that a legend tells them apart."""
    sets = discover(inputs)
    grouped: list[tuple[LogSet, int | None, _Parsed]] = []
    for log_set in sets:
        parsed = _parse_set(log_set)
        for rank, part in _split_by_rank(log_set, parsed):
            grouped.append((log_set, rank, part))
    labels = _labels([(s.name, rank) for s, rank, _ in grouped])
    return [
        _to_series(label, log_set, rank, part)
        for label, (log_set, rank, part) in zip(labels, grouped)
    ]


def _parse_set(log_set: LogSet) -> _Parsed:
    parsed = _Parsed()
    for path in log_set.files:
        _parse_file(path, parsed)
    return parsed


def _parse_file(path: Path, parsed: _Parsed) -> None:
    # A line that fails to parse is only an error once another line follows it: the last
    # line of a file is where a killed writer leaves half a record.
    failed: tuple[Location, str] | None = None
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                if failed is not None:
                    location, reason = failed
                    raise LogReadError(f"{location}: not a JSON line ({reason})")
                location = Location(path, number)
                try:
                    data = json.loads(text)
                except ValueError as exc:
                    failed = (location, f"{getattr(exc, 'msg', exc)}: {text.strip()[:80]!r}")
                    continue
                _classify(data, location, parsed)
    except OSError as exc:
        raise LogReadError(f"{path}: cannot read: {exc.strerror}") from None
    if failed is not None:
        parsed.damaged_tails.append(failed[0])


def _classify(data: object, location: Location, parsed: _Parsed) -> None:
    if not isinstance(data, dict):
        parsed.foreign_lines += 1
        return
    if "alert" in data or _is_notifier_alert(data):
        if data.get("status") != "resolved":
            parsed.alerts.append(
                AlertMark(
                    step=_int_or_none(data.get("step")),
                    time_stamp=_float_or_none(data.get("time_stamp")),
                    rule=str(data["rule"]) if "rule" in data else None,
                    message=str(data.get("alert") or data.get("message") or data.get("rule")),
                    location=location,
                )
            )
        return
    fired = data.get("alerts")
    for rule in fired if isinstance(fired, list) else ():  # our step lines name what fired there
        parsed.alerts.append(
            AlertMark(step=_int_or_none(data.get("step")), time_stamp=_float_or_none(data.get("time_stamp")),
                      rule=str(rule), message=str(rule), location=location)
        )
    if _int_or_none(data.get("step")) is None:
        parsed.foreign_lines += 1
    elif _OWN_KEYS <= data.keys():
        parsed.own.append((data, location))
    else:
        parsed.foreign_steps.append((data, location))


def _is_notifier_alert(data: dict) -> bool:
    """The JSON body of `alerts.alert.Alert.to_json_dict` (what the webhook notifier sends)."""
    return data.get("source") == "otel_mindformers" and "rule" in data and "status" in data


def _split_by_rank(log_set: LogSet, parsed: _Parsed) -> list[tuple[int | None, _Parsed]]:
    """Our lines grouped by their `rank`; a file with none of ours is its writer's series."""
    if not parsed.own:
        rank = _rank_from_name(log_set.name)
        return [(rank, _Parsed(own=parsed.foreign_steps, alerts=parsed.alerts,
                               foreign_lines=parsed.foreign_lines,
                               damaged_tails=parsed.damaged_tails))]
    by_rank: dict[int | None, _Parsed] = {}
    for data, location in parsed.own:
        by_rank.setdefault(_int_or_none(data.get("rank")), _Parsed()).own.append((data, location))
    first = next(iter(by_rank.values()))
    first.alerts = parsed.alerts
    first.damaged_tails = parsed.damaged_tails
    first.foreign_lines = parsed.foreign_lines + len(parsed.foreign_steps)
    return list(by_rank.items())


def _to_series(label: str, log_set: LogSet, rank: int | None, part: _Parsed) -> Series:
    return Series(
        label=label,
        rank=rank,
        files=log_set.files,
        points=[_point(data, location) for data, location in part.own],
        alerts=part.alerts,
        foreign_lines=part.foreign_lines,
        damaged_tails=part.damaged_tails,
    )


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
    )


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
            if name not in tm.KNOWN_METRICS:
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
            )
        )
    return records


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
    names = [_shortest_distinct(path, [p for p, _ in keys]) for path, _ in keys]
    per_name: dict[str, int] = {}
    for name in names:
        per_name[name] = per_name.get(name, 0) + 1
    return [
        f"{name} rank {rank}" if per_name[name] > 1 and rank is not None else name
        for name, (_, rank) in zip(names, keys)
    ]


def _shortest_distinct(path: Path, all_paths: list[Path]) -> str:
    parts = path.with_suffix("").parts if path.suffix == ".json" else path.parts
    others = {
        (p.with_suffix("").parts if p.suffix == ".json" else p.parts)
        for p in all_paths
        if p != path
    }
    for depth in range(1, len(parts) + 1):
        tail = parts[-depth:]
        if all(other[-depth:] != tail for other in others):
            return "/".join(tail)
    return "/".join(parts)
