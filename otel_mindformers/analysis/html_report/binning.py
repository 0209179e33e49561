"""Series reduced to a bounded number of points: the page's size grows with its pixels, not
with the job's steps or ranks.

A chart is at most `bins` columns wide. Few ranks: each rank is its own line, and a stretch
with more points than columns keeps each column's lowest and highest point, in the order
they came (a spike survives). Many ranks: per column the median of every rank's points
with the lowest and highest as a band. A heatmap is at most `rows` x `columns` cells: a
cell is a rank's mean over the records covering its steps (a record covers the steps since
the previous one: a sampled window), and a row that holds several ranks shows the highest
of their means, with the rank it came from, so one slow rank among many still shows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    """A numeric range [low, high] split into `bins` equal columns."""

    low: float
    high: float
    bins: int

    @classmethod
    def over(cls, values: Iterable[float], bins: int) -> Axis:
        finite = [v for v in values if math.isfinite(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        if high <= low:
            high = low + 1.0
        return cls(low, high, max(1, bins))

    def bin(self, value: float) -> int:
        index = int((value - self.low) / (self.high - self.low) * self.bins)
        return min(max(index, 0), self.bins - 1)

    def bins_of(self, xs: Iterable[float]) -> list[int]:
        """`bin` of each x, in one pass (the charts bin a million points); every x is in
        [low, high], as for an axis made `over` them."""
        low, scale, top = self.low, self.bins / (self.high - self.low), self.bins - 1
        return [min(int((x - low) * scale), top) for x in xs]

    def centre(self, index: int) -> float:
        return self.low + (index + 0.5) * (self.high - self.low) / self.bins


def runs(xs: Sequence[float]) -> list[tuple[int, int]]:
    """[start, end) index ranges in which x only goes forward: a restarted run that logs
    its steps again starts a new run (drawn as a new segment, never a line going back)."""
    found = []
    start = 0
    for i in range(1, len(xs)):
        if xs[i] <= xs[i - 1]:
            found.append((start, i))
            start = i
    if xs:
        found.append((start, len(xs)))
    return found


def thinned(xs: Sequence[float], ys: Sequence[float], axis: Axis) -> list[list[tuple[float, float]]]:
    """One rank's line as segments of points: split at restarts and at non-finite values;
    per column at most its lowest and highest point, in their order."""
    segments: list[list[tuple[float, float]]] = []
    for start, end in runs(xs):
        current: list[tuple[float, float]] = []
        if end - start <= 2 * axis.bins:
            for i in range(start, end):
                if math.isfinite(ys[i]):
                    current.append((xs[i], ys[i]))
                elif current:
                    segments.append(current)
                    current = []
        else:
            column: list[tuple[float, float]] = []
            last_bin = -1
            for i, index in zip(range(start, end), axis.bins_of(xs[start:end])):
                if not math.isfinite(ys[i]):
                    current += _extremes(column)
                    column = []
                    if current:
                        segments.append(current)
                        current = []
                    continue
                if index != last_bin:
                    current += _extremes(column)
                    column, last_bin = [], index
                column.append((xs[i], ys[i]))
            current += _extremes(column)
        if current:
            segments.append(current)
    return segments


def _extremes(column: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(column) <= 2:
        return column
    low = min(column, key=lambda p: p[1])
    high = max(column, key=lambda p: p[1])
    return sorted({low, high}, key=column.index)


@dataclass(frozen=True)
class Band:
    """Per non-empty column: its centre, and the median, lowest and highest value."""

    xs: list[float]
    medians: list[float]
    lows: list[float]
    highs: list[float]


def band(series: Iterable[tuple[Sequence[float], Sequence[float]]], axis: Axis) -> Band:
    """Every rank's points pooled per column (many ranks: one median line and a band)."""
    columns: list[list[float]] = [[] for _ in range(axis.bins)]
    isfinite = math.isfinite
    for xs, ys in series:
        for index, y in zip(axis.bins_of(xs), ys):
            if isfinite(y):
                columns[index].append(y)
    kept = [(i, c) for i, c in enumerate(columns) if c]
    return Band(
        xs=[axis.centre(i) for i, _ in kept],
        medians=[statistics.median(c) for _, c in kept],
        lows=[min(c) for _, c in kept],
        highs=[max(c) for _, c in kept],
    )


def column_means(xs: Sequence[float], ys: Sequence[float], axis: Axis) -> dict[int, float]:
    """A rank's mean per column (for hover read-outs and heatmap cells)."""
    sums: dict[int, list[float]] = {}
    for index, y in zip(axis.bins_of(xs), ys):
        if math.isfinite(y):
            total = sums.setdefault(index, [0.0, 0.0])
            total[0] += y
            total[1] += 1
    return {i: total / count for i, (total, count) in sums.items()}


@dataclass(frozen=True)
class RankRows:
    """Ranks grouped into at most `count` rows, consecutive ranks together."""

    ranks: list[int]  # the ranks in order; a row is a slice of them
    count: int

    @classmethod
    def of(cls, ranks: Iterable[int], most: int) -> RankRows:
        ordered = sorted(ranks)
        return cls(ordered, min(len(ordered), most))

    def row(self, position: int) -> int:
        """The row of the rank at `position` in `ranks`."""
        return position * self.count // len(self.ranks)

    def members(self, row: int) -> list[int]:
        return [rank for position, rank in enumerate(self.ranks) if self.row(position) == row]

    def label(self, row: int) -> str:
        members = self.members(row)
        return f"rank {members[0]}" if len(members) == 1 else f"ranks {members[0]}–{members[-1]}"


@dataclass(frozen=True)
class Cell:
    row: int
    column: int
    value: float
    rank: int  # the rank whose mean this is (the highest of the row's)


# A record of a heatmap: the first and last step it covers (a sampled window), its value.
Covered = tuple[float, float, float]


def covering(xs: Sequence[float], ys: Sequence[float]) -> list[Covered]:
    """Records of one value logged at sampled steps, each covering the steps since the
    previous record (a restart's first record covers its own step)."""
    found = []
    for start, end in runs(xs):
        previous = None
        for i in range(start, end):
            first = xs[i] if previous is None else previous + 1
            found.append((first, xs[i], ys[i]))
            previous = xs[i]
    return found


def heat_cells(per_rank: Mapping[int, Sequence[Covered]], rows: RankRows, axis: Axis) -> list[Cell]:
    """The heatmap's cells: per rank its mean per column over the records covering it, per
    row the highest rank's."""
    best: dict[tuple[int, int], Cell] = {}
    for position, rank in enumerate(rows.ranks):
        records = [record for record in per_rank.get(rank, ()) if math.isfinite(record[2])]
        firsts = axis.bins_of(first for first, _, _ in records)
        lasts = axis.bins_of(last for _, last, _ in records)
        sums: dict[int, list[float]] = {}
        for low, high, (_, _, value) in zip(firsts, lasts, records):
            for column in range(low, high + 1):
                total = sums.get(column)
                if total is None:
                    sums[column] = [value, 1.0]
                else:
                    total[0] += value
                    total[1] += 1
        row = rows.row(position)
        for column, (summed, count) in sums.items():
            value = summed / count
            held = best.get((row, column))
            if held is None or value > held.value:
                best[(row, column)] = Cell(row, column, value, rank)
    return sorted(best.values(), key=lambda cell: (cell.row, cell.column))


__all__ = [
    "Axis",
    "Band",
    "Cell",
    "Covered",
    "RankRows",
    "band",
    "column_means",
    "covering",
    "heat_cells",
    "runs",
    "thinned",
]
