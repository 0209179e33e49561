"""`otel-mindformers capture`: ask running ranks for a capture, list captures, analyse
deferred profiles; and the captures section of `otel-mindformers report --captures DIR`.

    otel-mindformers capture --steps 5 --ranks 0,3 DIR   # ranks 0 and 3 profile 5 steps
    otel-mindformers capture --list DIR
    otel-mindformers capture --analyse DIR                # profiles taken with analysis: deferred
    otel-mindformers capture --cancel DIR                 # stop the capture in flight
    otel-mindformers capture --plot trace.png DIR         # the newest trace, step by step

DIR is `alert_config.capture.path` of the job (runs watch it with `on_demand: true`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from otel_mindformers.captures import store
from otel_mindformers.captures.offline.profile_trace import TraceError
from otel_mindformers.compat.profiler import CPU_ANALYSIS, ApiNotFound, check_cpu_analysis
from otel_mindformers.config.extras import MATPLOTLIB_MODULES, is_installed, missing_package, needs_line
from otel_mindformers.config.limits import MAX_PROFILE_STEPS
from otel_mindformers.core.image_file import image_file
from otel_mindformers.names import capture_names as names


def add_command(commands: argparse._SubParsersAction) -> None:
    capture = commands.add_parser(
        "capture",
        help="ask running ranks for a profile / stacks / batch capture, or list and analyse captures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    capture.add_argument("dir", metavar="DIR", help="the job's alert_config.capture.path")
    action = capture.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list the captures under DIR")
    action.add_argument("--analyse", action="store_true", help="analyse the profiles taken with `analysis: deferred`")
    action.add_argument(
        "--plot", metavar="PNG", type=image_file, help="draw the newest analysed capture's operators, step by step"
    )
    action.add_argument(
        "--cancel", action="store_true", help="stop the capture the ranks have in flight (a profile of too many steps)"
    )
    capture.add_argument("--steps", type=_positive, default=5, help="steps to profile (default 5)")
    capture.add_argument("--ranks", type=_ranks, default=None, metavar="0,3", help="ranks that capture (default all)")
    capture.add_argument(
        "--kinds", type=_kinds, default=list(names.KINDS), metavar="profile,stacks,batch", help="what to capture"
    )
    capture.add_argument(
        "--wait", type=_seconds, default=0.0, metavar="SECONDS", help="wait this long for the ranks to answer"
    )
    capture.add_argument("--format", choices=("text", "json"), default="text", help="for --list")
    capture.set_defaults(func=_capture)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps, got {text!r}") from None
    if not 1 <= value <= MAX_PROFILE_STEPS:
        raise argparse.ArgumentTypeError(f"expected a step count from 1 to {MAX_PROFILE_STEPS}, got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ranks like 0,3, got {text!r}") from None
    if not ranks or ranks[0] < 0:
        raise argparse.ArgumentTypeError(f"expected ranks >= 0 like 0,3, got {text!r}")
    return ranks


def _kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in names.KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(names.KINDS)}, got {text!r}")
    return kinds


def _capture(args: argparse.Namespace) -> int:
    if args.list:
        sys.stdout.write(render_captures(store.list_captures(args.dir), args.format))
        return 0
    if args.analyse:
        return _analyse(Path(args.dir))
    if args.plot:
        return _plot(args.dir, args.plot)
    if not Path(args.dir).is_dir():
        print(
            f"error: {args.dir} does not exist: no run has written captures there "
            "(it is the run's alert_config.capture.path, created when a run with capture.on_demand: true starts)",
            file=sys.stderr,
        )
        return 1
    who = (
        "every rank"
        if args.ranks is None
        else f"rank{'s' if len(args.ranks) > 1 else ''} " + ",".join(map(str, args.ranks))
    )
    try:
        if args.cancel:
            request = store.write_request(args.dir, ranks=args.ranks, cancel=True)
        else:
            request = store.write_request(args.dir, steps=args.steps, ranks=args.ranks, kinds=args.kinds)
    except OSError as exc:  # FileLocked: another `capture` froze while adding its request
        print(f"error: {exc}", file=sys.stderr)
        return 1
    written = f"request {request['id']} written to {Path(args.dir) / names.CONTROL_FILE}: {who}"
    if args.cancel:
        print(
            f"{written} stop the capture in flight and drop the requests made before this one, at the next "
            "sampled step (the capture's capture.json then says cancelled)"
            + ("" if args.wait > 0 else "; --wait SECONDS prints the ranks' answers")
        )
    else:
        print(
            f"{written} capture {', '.join(args.kinds)}"
            + (f" ({args.steps} steps)" if names.KIND_PROFILE in args.kinds else "")
            + " at the next sampled step (runs with alert_config.capture.on_demand: true and this path)"
        )
    if args.wait <= 0:
        return 0
    answered = _wait_for(args.dir, request["id"], args.ranks, args.wait)
    for answer in answered:
        print(f"rank {answer['rank']}: step {answer['step']}: {answer['text']}")
    if not answered:
        print(
            f"no answer within {args.wait:g} s from {'any rank' if args.ranks is None else who} "
            "(is a run with alert_config.capture.on_demand: true "
            f"writing its captures under {args.dir}?)",
            file=sys.stderr,
        )
        return 1
    missing = sorted(_expected(args.ranks, answered) - {m["rank"] for m in answered})
    if missing:
        print(f"no answer within {args.wait:g} s from rank(s) {','.join(map(str, missing))}", file=sys.stderr)
        return 1
    return 0


def _expected(ranks: list[int] | None, answered: list[dict[str, Any]]) -> set[int]:
    """The ranks asked; for every rank, those of the job as its answers give its size."""
    if ranks is not None:
        return set(ranks)
    sizes = [m["world_size"] for m in answered if isinstance(m.get("world_size"), int)]
    return set(range(max(sizes, default=0)))


def _wait_for(root: str, request_id: str, ranks: list[int] | None, timeout: float) -> list[dict[str, Any]]:
    """The request's answers, once every rank expected has answered or at the timeout: each
    rank's capture (its manifest names the request), or its answer to a request that took no
    capture (a cancel; a request a cancel dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        answered = _answers(root, request_id)
        if answered and {m["rank"] for m in answered} >= _expected(ranks, answered):
            return answered
        if time.monotonic() >= deadline:
            return answered
        time.sleep(0.2)


def _answers(root: str, request_id: str) -> list[dict[str, Any]]:
    taken = [{**m, "text": m["folder"]} for m in store.list_captures(root) if m.get("request_id") == request_id]
    others = [
        {**answer, "text": _answer_text(answer)}
        for answer in store.read_answers(root)
        if answer.get("id") == request_id and type(answer.get("rank")) is int
    ]
    return taken + others


def _answer_text(answer: dict[str, Any]) -> str:
    said = str(answer.get("answer"))
    if said == "cancelled":
        return f"cancelled the capture in flight: {answer.get('folder')}"
    if said == "nothing in flight":
        return "no capture in flight to cancel"
    return f"{said}: not taken"


def _analyse(root: Path) -> int:
    raw = list(store.iter_raw_profiles(root))
    if not raw:
        print(f"nothing to analyse under {root}")
        return 0
    if not is_installed("mindspore"):  # the profiler's parser is MindSpore's; not imported here
        line = needs_line("capture --analyse", "mindspore", "is not installed")
        print(f"error: {line} (the version that took the profiles)", file=sys.stderr)
        return 1
    try:
        check_cpu_analysis()  # MindSpore's private CPU parser, where this release has it
    except ApiNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = 0
    for folder in raw:
        # Absolute: MindSpore's parser resolves a relative folder against a data root of its own.
        analysis = [sys.executable, "-c", CPU_ANALYSIS, str(folder.resolve())]
        done = subprocess.run(analysis, capture_output=True, text=True)
        trace = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
        if done.returncode == 0 and trace.exists():
            print(f"analysed {folder}: {trace}")
        else:
            failed += 1
            print(f"error: {folder}: {_why_not_analysed(done)}", file=sys.stderr)
    return 1 if failed else 0


def _why_not_analysed(done: subprocess.CompletedProcess[str]) -> str:
    """The parser's own error (a traceback's last line), not its progress bar or warnings."""
    if done.returncode == 0:  # it ran, and wrote no trace: the raw folder holds no data
        return (
            "MindSpore's parser found no profile data in it and wrote no trace (the run ended before "
            "the profiler saved its data: a capture killed mid-profile)"
        )
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    if errors:
        return errors[-1]
    return f"MindSpore's parser exited with status {done.returncode}" + (f": {lines[-1]}" if lines else "")


def _plot(root: str, output: Path) -> int:
    missing = missing_package("capture --plot", MATPLOTLIB_MODULES)
    if missing is not None:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    analysed = [m for m in store.list_captures(root) if m["traces"]]
    if not analysed:
        print(f"error: no analysed profile under {root}", file=sys.stderr)
        return 1
    from otel_mindformers.captures.offline.capture_plot import plot_capture  # matplotlib loads only here

    newest = analysed[-1]
    trace = Path(newest["traces"][0])
    try:
        print(f"wrote {plot_capture(newest, trace, output)} ({newest['folder']})")
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.filename or trace}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def _steps(manifest: dict[str, Any]) -> str:
    first, last = manifest.get("first_step"), manifest.get("last_step")
    return f"{first}-{last}" if first is not None else "-"


def render_captures(captures: list[dict[str, Any]], fmt: str = "text") -> str:
    """The captures as a table (text, markdown) or a JSON list."""
    if fmt == "json":
        return json.dumps(captures, indent=1) + "\n"
    if not captures:
        return "captures: none\n"
    header = ("time (UTC)", "rank", "step", "trigger", "kinds", "profiled", "status", "size", "folder")
    rows = [
        (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["time_stamp"])) if m.get("time_stamp") else "-",
            str(m.get("rank")),
            str(m.get("step")),
            str(m.get("trigger")),
            ",".join(m.get("kinds") or []) or "-",
            _steps(m),
            str(m.get("status")),
            _size(m.get("bytes") or 0),
            m["folder"],
        )
        for m in captures
    ]
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n## Captures\n\n" + "\n".join(lines) + "\n"
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in (header, *rows)]
    problems = [f"unreadable manifest: {m['problem']}" for m in captures if m.get("problem")]
    return f"captures: {len(captures)}\n" + "\n".join(lines + problems) + "\n"


def with_captures(rendered: str, root: str, fmt: str) -> str:
    """`report --captures DIR`: the report with the job's captures added (a `captures` key
    of the JSON report, a section of the text and markdown ones)."""
    captures = store.list_captures(root)
    if fmt == "json":
        body = json.loads(rendered)
        body["captures"] = captures
        return json.dumps(body, indent=2) + "\n"
    return rendered + ("\n" if fmt == "text" else "") + render_captures(captures, fmt)
