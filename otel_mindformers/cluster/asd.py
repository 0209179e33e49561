"""MindSpore's silent-data-corruption detection lines, read from its log as they are written.

MindSpore's detection writes what it finds to its log, not to any API: with
`MS_NPU_ASD_CONFIG` (mindspore/ccsrc/tools/silent_detect/silent_detector.cc, MS_LOG(WARNING))

    [WARNING] DEBUG(2950752,fffee7e591e0,python):2025-08-26-10:46:26.665.782 [mindspore/ccsrc/tools/
    silent_detect/silent_detector.cc:109] SilentDetect] Silent detect strike detected: StrikeRecord{...}
    ... Feature value detection strikes out on rank 3, strikes_num: 3, CheckSum will be enabled globally.
    ... CheckSum detects MatMul error on rank 3
    ... SilentCheck detects SDC error, which means training may be unstable. ...

and with `NPU_ASD_ENABLE` an ERROR line with "accuracy sensitivity feature abnormal" in the
application log, and CANN's `SilentCheck... L1 Error` lines in its device logs (MindSpore's
"Feature Value Detection" tutorial). A thread tails the logs (`cluster.asd_logs`, else
MindSpore's own log file under GLOG_log_dir when GLOG_logtostderr=0, else this process's
stderr when that is a file, as under msrun) and turns each line into a span event on the
run span, an OTel log record, the counter `mindformers.asd.detections` by kind and, from a
strike-out on, an alert with the rank the line names (else this rank).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

THREAD_NAME = "otel-mindformers-asd-watch"
POLL_SECONDS = 0.5
READ_BYTES = 1 << 20  # per file and poll: a log that grows faster is read on over the next polls
MAX_LINE = 64 << 10  # a longer line is cut (an ASD line is a few hundred bytes)

STRIKE, STRIKEOUT, CHECKSUM_ERROR, SDC_ERROR, FEATURE_ABNORMAL, L1_ERROR = (
    "strike", "strikeout", "checksum_error", "sdc_error", "feature_abnormal", "l1_error",
)  # fmt: skip
# (kind, pattern, whether it is an alert, its severity). A rank in the line is group 1.
_PATTERNS = (
    (STRIKE, re.compile(r"Silent detect strike detected"), False, "warning"),
    (STRIKEOUT, re.compile(r"Feature value detection strikes out on rank (\d+)"), True, "warning"),
    (CHECKSUM_ERROR, re.compile(r"CheckSum detects MatMul error on rank (\d+)"), True, "critical"),
    (SDC_ERROR, re.compile(r"SilentCheck detects SDC error"), True, "critical"),
    (FEATURE_ABNORMAL, re.compile(r"accuracy sensitivity feature abnormal"), True, "critical"),
    (L1_ERROR, re.compile(r"SilentCheck(?:V\d+)? ?(?:get L1 Error|ComputeL1Error)"), True, "critical"),
)


@dataclasses.dataclass(frozen=True)
class Detection:
    kind: str
    rank: int  # the rank the line names, else the rank whose log it is
    alert: bool
    severity: str  # the alert's (alerts/alert.py severities)
    line: str


# A log line of MindSpore (C++ and Python), glog or CANN starts with its level in brackets. Our
# own lines about a detection quote it, and under msrun they go to the same file: matching only
# log lines keeps the watcher from reading its own words back.
_LOG_LINE = re.compile(r"^\s*\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|EVENT)\]")


def parse_line(line: str, own_rank: int) -> Detection | None:
    """The detection a MindSpore log line reports, or None."""
    if not _LOG_LINE.match(line):
        return None
    for kind, pattern, alert, severity in _PATTERNS:
        match = pattern.search(line)
        if match:
            rank = int(match[1]) if pattern.groups and match[1] is not None else own_rank
            return Detection(kind, rank, alert, severity, line.strip()[:1024])
    return None


def glog_files(env: Mapping[str, str], rank: int, pid: int) -> list[Path]:
    """MindSpore's C++ log file of this process when it logs to files (GLOG_logtostderr=0):
    `{GLOG_log_dir}/rank_{RANK_ID}/logs/mindspore.{host}.{user}.log.{LEVEL}.{time}.{pid}`,
    the WARNING one (warnings and errors once each), else the INFO one."""
    if env.get("GLOG_logtostderr", "1").strip() != "0" or not env.get("GLOG_log_dir"):
        return []
    folder = Path(env["GLOG_log_dir"]) / f"rank_{env.get('RANK_ID', rank)}" / "logs"
    for level in ("WARNING", "INFO"):
        found = sorted(glob.glob(str(folder / f"mindspore.*.log.{level}.*.{pid}")))
        if found:
            return [Path(found[-1])]
    return []


def stderr_file() -> Path | None:
    """This process's stderr, when it is a regular file (msrun's worker_N.log): never a pipe
    or a terminal, whose data a reader would take away."""
    try:
        if stat.S_ISREG(os.fstat(2).st_mode):
            return Path("/proc/self/fd/2")
    except OSError:
        pass
    return None


class _Tail:
    def __init__(self, path: Path, from_end: bool) -> None:
        self.path = path
        self.offset = path.stat().st_size if from_end else 0
        self.partial = b""

    def lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
            if size < self.offset:  # truncated or replaced: read it from its start
                self.offset, self.partial = 0, b""
            if size == self.offset:
                return []
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(READ_BYTES)
        except OSError:
            return []
        self.offset += len(data)
        *complete, rest = (self.partial + data).split(b"\n")
        self.partial = rest[-MAX_LINE:]
        return [line[:MAX_LINE].decode("utf-8", "replace") for line in complete]


class AsdWatcher:
    """Tails `paths` (or, when none are given, finds MindSpore's log as it appears) on a
    thread; calls `on_detection` there with each Detection."""

    def __init__(
        self,
        paths: list[Path],
        find: Callable[[], list[Path]] | None,
        own_rank: int,
        on_detection: Callable[[Detection], None],
        poll: float = POLL_SECONDS,
    ) -> None:
        self._tails = [_Tail(p, from_end=True) for p in paths if p.exists()]
        self._waiting = [p for p in paths if not p.exists()]  # named, not yet written
        self._find = find
        self._rank = own_rank
        self._on_detection = on_detection
        self._poll = poll
        self._stop = threading.Event()
        self.detections = 0
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> AsdWatcher:
        self._thread.start()
        return self

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(max(timeout, 0.0))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def watching(self) -> list[Path]:
        return [tail.path for tail in self._tails]

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self._poll_once()
        self._poll_once()  # what was written up to the end

    def _poll_once(self) -> None:
        if self._waiting:
            for path in [p for p in self._waiting if p.exists()]:
                self._waiting.remove(path)
                self._tails.append(_Tail(path, from_end=False))  # written since we started
        if not self._tails and self._find is not None:
            self._tails = [_Tail(p, from_end=False) for p in self._find()]
        for tail in self._tails:
            for line in tail.lines():
                found = parse_line(line, self._rank)
                if found is None:
                    continue
                self.detections += 1
                try:
                    self._on_detection(found)
                except Exception as exc:  # telemetry of a detection must not stop the watch
                    _logger.warning(
                        "otel_mindformers: a silent-data-corruption detection could not be recorded: %s", exc
                    )


__all__ = ["AsdWatcher", "Detection", "glog_files", "parse_line", "stderr_file"]
