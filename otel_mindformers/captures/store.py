"""Where captures live on disk, what describes them, and the on-demand request file.

Layout under `alert_config.capture.path` (a folder every rank can reach, shared or not):

    <path>/capture_request.json                   the on-demand requests, the last REQUESTS_KEPT
    <path>/rank_<r>/request_answers.json          this rank's answers to requests that took no capture
    <path>/rank_<r>/<UTC time>-step<k>-<trigger>/  one capture
        capture.json      the manifest: rank, trigger, kinds, the steps profiled and their
                          wall-clock windows, status
        profile/<host>_<pid>_<time>_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json
        stacks.txt        every thread's stack
        batch.json        what identifies the step's data

Each rank writes and bounds only its own `rank_<r>` folder. Everything here runs off the
training thread (the pipeline worker, a capture's finishing thread, the CLI).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_mindformers.config.limits import MAX_PROFILE_STEPS
from otel_mindformers.core import safe_json
from otel_mindformers.core.bounded_read import read_small_file
from otel_mindformers.core.file_lock import lock_within
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import capture_names as names

_logger = get_logger(__name__)

TRACE_GLOB = f"{names.PROFILE_DIR}/*_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json"
RAW_GLOB = f"{names.PROFILE_DIR}/*_ascend_ms"
# A request (`otel-mindformers capture`) is ~150 bytes and a manifest a few hundred: a file
# past these is not ours, and is not read whole into a training process.
_MAX_REQUEST_BYTES = 64 * 1024
_MAX_MANIFEST_BYTES = 1024 * 1024


def rank_folder(root: str | os.PathLike[str], rank: int) -> Path:
    return Path(root) / f"rank_{rank}"


def capture_folder_name(step: int, trigger: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{stamp}-step{step:08d}-{trigger}"


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(body, indent=1, ensure_ascii=False, allow_nan=False), encoding="utf-8")
    os.replace(partial, path)


def folder_bytes(path: Path) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def capture_folders(rank_root: Path) -> list[Path]:
    """This rank's captures, oldest first (folder names start with their UTC time)."""
    try:
        return sorted(p for p in rank_root.iterdir() if p.is_dir() and (p / names.MANIFEST_FILE).exists())
    except OSError:
        return []


def make_room(rank_root: Path, max_bytes: int) -> list[Path]:
    """Remove this rank's oldest captures until the rest fit in `max_bytes` (0: unbounded)."""
    if max_bytes <= 0:
        return []
    folders = capture_folders(rank_root)
    sizes = {folder: folder_bytes(folder) for folder in folders}
    total = sum(sizes.values())
    removed = []
    for folder in folders:
        if total <= max_bytes:
            break
        shutil.rmtree(folder, ignore_errors=True)
        total -= sizes[folder]
        removed.append(folder)
    return removed


def _read_json(path: Path, max_bytes: int) -> Any:
    """A small JSON file we wrote, read within a bound (core/bounded_read.py); None when it is
    missing, unreadable, too large, no regular file (a FIFO), or not JSON."""
    try:
        data = read_small_file(path, max_bytes)
        return None if data is None else safe_json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None


def read_manifest(folder: Path) -> dict[str, Any] | None:
    return _read_json(folder / names.MANIFEST_FILE, _MAX_MANIFEST_BYTES)


def traces(folder: Path) -> list[Path]:
    return sorted(folder.glob(TRACE_GLOB))


def list_captures(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every capture under `root` (all ranks), oldest first, each manifest with its folder,
    its size on disk and its trace files added."""
    found = []
    for rank_root in sorted(Path(root).glob("rank_*")):
        for folder in capture_folders(rank_root):
            manifest = read_manifest(folder)
            if manifest is None:
                continue
            problem = manifest_problem(manifest)
            if problem is not None:  # written by hand or by another tool: shown as such, never a crash
                manifest = {"status": "unreadable", "problem": f"{folder / names.MANIFEST_FILE}: {problem}"}
            manifest["folder"] = str(folder)
            manifest["bytes"] = folder_bytes(folder)
            manifest["traces"] = [str(p) for p in traces(folder)]
            if manifest.get("status") == "waiting" and _process_gone(manifest):
                manifest["status"] = "interrupted"  # killed mid-profile: it will never finish
            if manifest.get("status") in ("analysing", "raw") and manifest["traces"]:
                # The run ended before its finishing thread saw the trace, or `--analyse` ran.
                manifest["status"] = "analysed"
            found.append(manifest)
    found.sort(key=lambda m: (m.get("time_stamp") or 0, m.get("rank") or 0))
    return found


def _process_gone(manifest: dict[str, Any]) -> bool:
    """Whether the process that took the capture, on this host, no longer runs."""
    pid = manifest.get("pid")
    if type(pid) is not int or pid <= 0 or manifest.get("host") != socket.gethostname():
        return False  # another node's process: its state is not known here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, as another user
        return False
    return False


def manifest_problem(manifest: Any) -> str | None:
    """What makes a manifest unusable for listing (None: nothing), naming the field."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    stamp = manifest.get("time_stamp")
    if stamp is not None and (type(stamp) not in (int, float) or not 0 <= stamp < _LATEST_TIME_STAMP):
        return f"time_stamp: expected Unix seconds, got {stamp!r}"
    kinds = manifest.get("kinds")
    if kinds is not None and (not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds)):
        return f"kinds: expected a list of names, got {kinds!r}"
    for key in ("rank", "step"):
        if manifest.get(key) is not None and type(manifest[key]) is not int:
            return f"{key}: expected a whole number, got {manifest[key]!r}"
    return None


_LATEST_TIME_STAMP = 1e11  # Unix seconds in the year 5138: past it, a time stamp is garbage


# --- the on-demand requests --------------------------------------------------------------
# The request file keeps the last requests, oldest first, so a request written right after
# another (a cancel, then a new request) never replaces one a rank has not read yet. A rank
# more than this many requests behind loses the oldest.
REQUESTS_KEPT = 16
# `capture` waits this long for another `capture` to finish adding its request.
REQUEST_LOCK_SECONDS = 5.0
# This rank's answers to requests that took no capture (a cancel, a request a cancel
# dropped), newest last: what `capture --cancel --wait` prints.
ANSWERS_KEPT = 32


def write_request(
    root: str | os.PathLike[str],
    *,
    steps: int = 0,
    ranks: list[int] | None,
    kinds: list[str] | None = None,
    cancel: bool = False,
) -> dict[str, Any]:
    """What `otel-mindformers capture` adds to the request file: every watching rank listed
    in `ranks` (None: every rank) takes one capture of `kinds`, profiling `steps` steps; with
    `cancel`, those ranks stop the capture they have in flight and drop the requests before
    it instead. Raises FileLocked when another writer holds the file past REQUEST_LOCK_SECONDS."""
    request: dict[str, Any] = {"id": uuid.uuid4().hex[:12], "ranks": ranks, "requested_at": round(time.time(), 3)}
    if cancel:
        request["cancel"] = True
    else:
        request.update(steps=steps, kinds=kinds)
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / names.REQUEST_LOCK_FILE
    with open(lock_path, "a") as lock:  # two `capture` commands at once: both requests stay
        lock_within(lock.fileno(), lock_path, REQUEST_LOCK_SECONDS)
        queued = queued_requests(_read_json(folder / names.CONTROL_FILE, _MAX_REQUEST_BYTES))
        write_json(folder / names.CONTROL_FILE, {"requests": [*queued, request][-REQUESTS_KEPT:]})
    return request


def queued_requests(body: Any) -> list[dict[str, Any]]:
    """The requests a request file holds, oldest first: its `requests` list, or the file
    itself where it is one request (written by hand, or by an earlier `capture`)."""
    if not isinstance(body, dict):
        return []
    if "requests" in body:
        listed = body["requests"]
        return [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
    return [body]


def write_answers(rank_root: Path, answers: list[dict[str, Any]]) -> None:
    rank_root.mkdir(parents=True, exist_ok=True)
    write_json(rank_root / names.ANSWERS_FILE, {"answers": answers[-ANSWERS_KEPT:]})


def read_answers(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's answers to requests that took no capture (`write_answers`)."""
    found = []
    for rank_root in sorted(Path(root).glob("rank_*")):
        body = _read_json(rank_root / names.ANSWERS_FILE, _MAX_REQUEST_BYTES)
        listed = body.get("answers") if isinstance(body, dict) else None
        found += [a for a in listed if isinstance(a, dict)] if isinstance(listed, list) else []
    return found


class RequestWatcher:
    """Watches `<root>/capture_request.json` with one stat per `poll()`; the file is read
    only when its stat changed. The requests already there when the run starts are old
    (answered, or meant for another run): they are taken as seen. While the file is missing,
    the watched folder is made again if someone removed it: `capture` refuses a folder
    that does not exist, and this run still reads requests there."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.path = self.root / names.CONTROL_FILE
        # The folder exists while a run watches it, so `otel-mindformers capture` can tell a
        # path no run watches (a typo) from one whose runs took no capture yet.
        self._make_folder()
        self._signature = self._stat()
        self._seen = {r.get("id") for r in self._read() if isinstance(r.get("id"), str)}

    def _make_folder(self) -> None:
        try:
            os.mkdir(self.root)  # one system call where the folder is there (EEXIST)
        except FileExistsError:
            return
        except FileNotFoundError:  # its parent went too
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError:
                return
        except OSError:  # an unwritable path is the capture's own warning, when it is taken
            return
        _logger.info("otel_mindformers: made the capture folder %s (again): requests are read there", self.root)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._make_folder()
            return None
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _read(self) -> list[dict[str, Any]]:
        return queued_requests(_read_json(self.path, _MAX_REQUEST_BYTES))

    def poll(self) -> list[dict[str, Any]]:
        """The requests not seen before, oldest first."""
        signature = self._stat()
        if signature is None or signature == self._signature:
            return []
        self._signature = signature
        fresh, queued = [], self._read()
        for request in queued:
            request_id = request.get("id")
            if not isinstance(request_id, str) or request_id in self._seen:
                continue
            self._seen.add(request_id)
            problem = request_problem(request)
            if problem is not None:  # a hand-written file: said once, never a failed step
                _logger.warning("otel_mindformers: ignoring capture request %s: %s", self.path, problem)
                continue
            fresh.append(request)
        if len(self._seen) > 64 * REQUESTS_KEPT:  # a long run's ids: only the file's can come back
            self._seen = {r.get("id") for r in queued if isinstance(r.get("id"), str)}
        return fresh


def request_problem(request: dict[str, Any]) -> str | None:
    """What is wrong with a request's fields (None: nothing), naming the field."""
    steps, ranks, kinds = request.get("steps"), request.get("ranks"), request.get("kinds")
    if request.get("cancel") not in (None, True, False):
        return f"cancel: expected true or false, got {request['cancel']!r}"
    if steps is not None and (type(steps) is not int or not 1 <= steps <= MAX_PROFILE_STEPS):
        return f"steps: expected a whole number from 1 to {MAX_PROFILE_STEPS}, got {steps!r}"
    if ranks is not None and (not isinstance(ranks, list) or not all(type(r) is int and r >= 0 for r in ranks)):
        return f"ranks: expected a list of ranks >= 0, got {ranks!r}"
    if kinds is not None and (not isinstance(kinds, list) or not all(k in names.KINDS for k in kinds)):
        return f"kinds: expected a list of {', '.join(names.KINDS)}, got {kinds!r}"
    return None


def wanted_by(request: dict[str, Any], rank: int) -> bool:
    ranks = request.get("ranks")
    return ranks is None or rank in ranks


def iter_raw_profiles(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Profiler folders of captures taken with `analysis: deferred` and not yet analysed."""
    for rank_root in sorted(Path(root).glob("rank_*")):
        for folder in capture_folders(rank_root):
            for raw in sorted(folder.glob(RAW_GLOB)):
                if not (raw / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").exists():
                    yield raw
