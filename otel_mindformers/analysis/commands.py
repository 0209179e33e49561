"""The `plot`, `report` and `replay` subcommands of `otel-mindformers`."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from otel_mindformers.config import OTLP_PROTOCOLS
from otel_mindformers.config.extras import MATPLOTLIB_MODULES, TENSORBOARD_MODULES, missing_package
from otel_mindformers.core.image_file import image_file
from otel_mindformers.outputs.jsonl_reader import (
    AnalysisError,
    Location,
    Series,
    read_logs,
    replay_problems,
)

_LOGS_HELP = (
    "JSON-lines logs: files, globs or folders (a folder finds every *_rank_*.json under it, or, "
    "if there is none, the *.json files directly in it); rotated backups (name.json.1 ... .N) "
    "are read with their file"
)


def add_commands(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser("plot", help="plot loss, learning rate, grad norm and step time")
    plot.add_argument("logs", nargs="+", metavar="LOG", help=_LOGS_HELP)
    plot.add_argument(
        "-o",
        "--output",
        type=image_file,
        default="training.png",
        help="image file; the suffix picks the format (.png, .svg, .pdf)",
    )
    plot.add_argument(
        "--smooth",
        type=_ema_weight,
        metavar="WEIGHT",
        help="draw an exponential moving average of this weight (e.g. 0.9) over the raw curve",
    )
    plot.add_argument("--size", type=_pixels, default="1600x1000", metavar="WxH", help="image size in pixels")
    plot.add_argument("--title", help="figure title")
    plot.add_argument(
        "--attempts",
        action="store_true",
        help="draw the job's attempts on a time axis instead (from the ledgers beside the logs: docs/restarts.md)",
    )
    plot.set_defaults(func=_plot)

    report = commands.add_parser("report", help="summarise a run: loss, throughput, anomalies, stragglers, gaps")
    report.add_argument("logs", nargs="+", metavar="LOG", help=_LOGS_HELP)
    report.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    report.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    report.add_argument(
        "--straggler-threshold",
        type=float,
        default=0.10,
        metavar="FRACTION",
        help="name series whose median step time exceeds the median of all series "
        "by more than this fraction (default 0.10)",
    )
    report.add_argument(
        "--captures", metavar="DIR", help="also list the captures under DIR (alert_config.capture.path)"
    )
    report.add_argument(
        "--html",
        metavar="FILE",
        help="write the run as one self-contained HTML page to FILE (charts inline, nothing fetched when viewed)",
    )
    report.set_defaults(func=_report)

    replay = commands.add_parser(
        "replay", help="send a recorded run to an OTLP endpoint or a TensorBoard folder, with its original times"
    )
    replay.add_argument("logs", nargs="+", metavar="LOG", help=_LOGS_HELP)
    replay.add_argument(
        "--endpoint", help="OTLP endpoint, e.g. http://127.0.0.1:4317 (default: OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    replay.add_argument("--protocol", choices=OTLP_PROTOCOLS, help="default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc")
    replay.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="KEY=VALUE",
        help="request header, repeatable (e.g. authorization=Bearer ...)",
    )
    replay.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per export request")
    replay.add_argument(
        "--insecure",
        action="store_true",
        help="gRPC without TLS to an endpoint given as host:port (a scheme says it itself)",
    )
    replay.add_argument(
        "--run-id",
        help="the id ids are derived from (default: the run's first time stamp); also sent as "
        "training.job.id for lines that name no job",
    )
    replay.add_argument("--service-name", help="service.name (default: OTEL_SERVICE_NAME, else mindformers-train)")
    replay.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard scalars under DIR/rank_<x>/ instead")
    replay.set_defaults(func=_replay)


def _ema_weight(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a weight in [0, 1), got {text}")
    return value


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name.strip(), value.strip()


def _pixels(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit() and int(width) >= 200 and int(height) >= 200):
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, each >= 200, got {text!r}")
    return int(width), int(height)


def _read(args: argparse.Namespace) -> list[Series]:
    series = read_logs(args.logs)
    _note_damaged_tails(location for one in series for location in one.damaged_tails)
    return series


def _note_damaged_tails(locations: Iterable[Location | str]) -> None:
    for location in locations:
        print(f"note: skipped a truncated last line at {location}", file=sys.stderr)


def _one_line_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Unreadable logs, refused replays, missing optional packages and an output the system
    refuses (a folder under a file, no permission) end in one stderr line."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except AnalysisError as exc:
            print(f"error: {exc}", file=sys.stderr)
        except OSError as exc:
            if exc.filename is None:  # not a path of the user's: a fault to show whole
                raise
            print(f"error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 1

    return run


def _require(command: str, modules: Iterable[str]) -> None:
    """An optional package the command needs, missing or failing on import: one line naming
    it, the error and the extra."""
    problem = missing_package(command, modules)
    if problem is not None:
        raise AnalysisError(problem)


@_one_line_errors
def _plot(args: argparse.Namespace) -> int:
    _require("plot", MATPLOTLIB_MODULES)  # both drawings, the curves and the attempts
    if args.attempts:
        return _plot_attempts(args)
    from otel_mindformers.analysis.plot import plot  # matplotlib loads only for this command

    series = _read(args)
    output = plot(series, args.output, smoothing=args.smooth, size=args.size, title=args.title)
    records = sum(len(s.points) for s in series)
    print(f"wrote {output} ({len(series)} series, {records} records)")
    return 0


def _plot_attempts(args: argparse.Namespace) -> int:
    from otel_mindformers.restarts.offline.attempts_plot import plot_attempts
    from otel_mindformers.restarts.offline.attempts_report import job_report, left_out_lines

    job = job_report(args.logs)
    if job is None:
        raise AnalysisError(f"no job ledger (*.job.rank_N.ledger) beside {', '.join(map(str, args.logs))}")
    output = plot_attempts(job, args.output, size=args.size, title=args.title)
    print(f"wrote {output} ({len(job['attempts'])} attempts, {len(job['ranks'])} rank(s))")
    for line in left_out_lines(job):
        print(line.strip())
    return 0


@_one_line_errors
def _report(args: argparse.Namespace) -> int:
    from otel_mindformers.analysis.report import read_job, render, report_logs
    from otel_mindformers.flight_recorder.offline.recover_logs import recover_dead_runs
    from otel_mindformers.restarts.offline.attempts_report import with_job

    recover_dead_runs(args.logs)
    if args.html:
        return _report_html(args)
    report = report_logs(args.logs, args.straggler_threshold)
    _note_damaged_tails(location for summary in report.series for location in summary.damaged_tails)
    job = read_job(report, args.logs)  # before rendering: a resume the ledger explains is no finding
    text = with_job(render(report, args.format), job, args.format)
    if getattr(args, "captures", None):
        from otel_mindformers.captures.offline.capture_command import with_captures

        text = with_captures(text, args.captures, args.format)
    sys.stdout.write(text)
    return 0


def _report_html(args: argparse.Namespace) -> int:
    from otel_mindformers.analysis.html_report import write_page

    written = write_page(args.logs, args.html, args.straggler_threshold, args.captures)
    _note_damaged_tails(location for summary in written.run.report.series for location in summary.damaged_tails)
    print(f"wrote {written.path} ({written.size / 1e6:.2f} MB, {len(written.run.series)} series)")
    return 0


def _default_protobuf() -> None:
    """Let protobuf pick its compiled implementation for a replay.

    The package selects the pure-Python one for MindSpore's sake (see otel_mindformers'
    __init__); a replay never imports MindSpore, and encodes its requests about ten times
    faster compiled. The choice is only open until protobuf is first imported.
    """
    variable = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
    if "google.protobuf" not in sys.modules and os.environ.get(variable) == "python":
        del os.environ[variable]


@_one_line_errors
def _replay(args: argparse.Namespace) -> int:
    _default_protobuf()
    from otel_mindformers.analysis import replay
    from otel_mindformers.config import OtlpConfig
    from otel_mindformers.config.redaction import printable_endpoint
    from otel_mindformers.flight_recorder.offline.recover_logs import recover_dead_runs

    recover_dead_runs(args.logs)
    series = _read(args)
    problems = replay_problems(series)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"error: nothing sent: {len(problems)} record(s) cannot be replayed", file=sys.stderr)
        return 1
    if args.tensorboard:
        _require("replay --tensorboard", TENSORBOARD_MODULES)
        result = replay.replay_tensorboard(series, args.tensorboard)
        print(
            f"wrote {result.points} scalars of {result.records} records "
            f"({result.series} series) under {Path(args.tensorboard)}"
        )
    else:
        otlp = OtlpConfig(
            endpoint=args.endpoint,
            protocol=args.protocol,
            headers=dict(args.header),
            timeout=args.timeout,
            insecure=args.insecure or None,
        )
        result = replay.replay_otlp(series, otlp, run_id=args.run_id, service_name=args.service_name)
        print(
            f"sent {result.spans} spans and {result.points} metric points of {result.records} records "
            f"({result.series} series, run id {result.run_id}) to "
            f"{printable_endpoint(args.endpoint or 'the OTEL_EXPORTER_OTLP_ENDPOINT endpoint')}"
        )
    if result.skipped:
        print(f"note: {result.skipped} records without a time_stamp were left out", file=sys.stderr)
    return 0
