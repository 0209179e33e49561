"""`otel-mindformers report DIR --html run.html`: the run as one self-contained HTML page.

    otel-mindformers report output/ --html run.html                       # the logs, ledgers
    otel-mindformers report output/ --html run.html --captures output/captures

The page is built from the same analysis as `report --json` (`run_data.py`), and its
figures are that JSON's. Charts are inline SVG drawn here (`charts.py`, `binning.py`), so
the file opens offline in any current browser and fetches nothing; its size is bounded by
its pixels, not by the job's ranks or steps (docs/analysis.md gives the measured budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_mindformers.analysis.html_report.page import build_page
from otel_mindformers.analysis.html_report.run_data import RunData, read_run
from otel_mindformers.outputs.jsonl_reader import AnalysisError


@dataclass(frozen=True)
class Written:
    path: Path
    size: int  # bytes
    run: RunData


def write_page(
    inputs: Sequence[str | Path],
    output: str | Path,
    straggler_threshold: float,
    captures_dir: str | Path | None = None,
) -> Written:
    """Read the logs (as `report` does: bad input raises its `AnalysisError`), then write
    the page to `output` in one go."""
    run = read_run(inputs, straggler_threshold, captures_dir)
    document = build_page(run).encode("utf-8")
    path = Path(output)
    try:
        path.write_bytes(document)
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot write the page: {exc.strerror or exc}") from None
    return Written(path, len(document), run)


__all__ = ["Written", "write_page"]
