"""Where the file outputs write: checked without touching anything, created at run start.

`check_output_paths` is what `otel-mindformers validate` runs: it creates nothing and
reports each path an enabled output could not use (its nearest existing folder is not a
writable directory; the target is a directory, a FIFO, a read-only file, or a symbolic link
to nothing, or lies under one). At run start
`prepare_output_paths` creates the folders and raises `ConfigError` naming the key, so a
bad path stops the run before its first step, not on the output thread (a FIFO would block
the opening of the JSON log forever).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from otel_mindformers.config import ConfigError, MonitorConfig
from otel_mindformers.config.extras import TENSORBOARD_MODULES, first_problem
from otel_mindformers.job.identity import Identity, detect_identity
from otel_mindformers.outputs.jsonl import rank_path
from otel_mindformers.outputs.tensorboard import rank_dir

JSON_LOG_KEY = "monitor_config.json_log_path"
TENSORBOARD_KEY = "monitor_config.tensorboard_path"


def _targets(config: MonitorConfig, identity: Identity) -> list[tuple[str, Path, bool]]:
    """(key, path, is_file) of each path an enabled output writes to."""
    if not config.enable:
        return []
    targets = []
    if "json_file" in config.output_type:
        targets.append((JSON_LOG_KEY, rank_path(config.json_log_path, identity), True))
    if "tensorboard" in config.output_type:
        targets.append((TENSORBOARD_KEY, rank_dir(config.tensorboard_path, identity), False))
    return targets


def _problem(key: str, path: Path, is_file: bool) -> str | None:
    """Why `path` cannot be written (None: it can), found without creating anything."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        return f"{key}: cannot use {str(path)!r}: {exc.strerror}"
    if mode is not None:
        if is_file and stat.S_ISDIR(mode):
            return f"{key}: {str(path)!r} is a directory; name a file"
        if is_file and not stat.S_ISREG(mode):
            return f"{key}: {str(path)!r} is not a regular file (a FIFO, socket or device)"
        if not is_file and not stat.S_ISDIR(mode):
            return f"{key}: {str(path)!r} exists and is not a directory"
        if not os.access(path, os.W_OK | (0 if is_file else os.X_OK)):
            return f"{key}: {str(path)!r} is not writable"
        return None
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        if ancestor.is_symlink():  # exists() follows it: a dangling link looks absent, yet blocks mkdir
            return f"{key}: {str(ancestor)!r} is a symbolic link to {os.readlink(ancestor)!r}, which does not exist"
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{key}: cannot create {str(path)!r}: {str(ancestor)!r} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{key}: cannot create {str(path)!r}: directory {str(ancestor)!r} is not writable"
    return None


def check_output_paths(config: MonitorConfig, identity: Identity | None = None) -> list[str]:
    """Every problem with the enabled outputs' paths, each naming its key; creates nothing."""
    identity = identity or detect_identity()
    return [p for key, path, is_file in _targets(config, identity) if (p := _problem(key, path, is_file))]


def prepare_output_paths(config: MonitorConfig, identity: Identity | None = None) -> None:
    """Create the enabled outputs' folders; ConfigError naming the key of a path that cannot
    be written. The TensorBoard folder is left uncreated when tensorboardX is missing or
    broken: that output is off for the run (one warning), and an empty folder would say
    otherwise."""
    identity = identity or detect_identity()
    problems = []
    for key, path, is_file in _targets(config, identity):
        if key == TENSORBOARD_KEY and first_problem(TENSORBOARD_MODULES) is not None:
            continue
        problem = _problem(key, path, is_file)
        if problem is None:
            folder = path.parent if is_file else path
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                problem = f"{key}: cannot create directory {str(folder)!r}: {exc.strerror}"
        if problem:
            problems.append(problem)
    if problems:
        raise ConfigError(*problems)
