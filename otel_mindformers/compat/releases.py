"""Which MindSpore and MindFormers this process has, and the range the package is tested in.

The versions come from package metadata (no import of either library). The tested range is
what the version matrix (scripts/matrix.sh) runs: the oldest MindSpore with a wheel for
Python 3.11 (2.7.0) up to 2.10, MindFormers 1.6 to 1.9. Outside it, the package still runs;
the start-up log and `otel-mindformers validate` say so once.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import threading

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

MINDSPORE = "mindspore"
MINDFORMERS = "mindformers"
# (floor, ceiling); kept equal to integration/package.py `_instruments`, the `instruments`
# extra and the README's table.
TESTED = {MINDSPORE: (">= 2.7.0", "< 2.11"), MINDFORMERS: (">= 1.6.0", "< 1.10")}
LABELS = {MINDSPORE: "MindSpore", MINDFORMERS: "MindFormers"}

_warned = threading.Event()


@functools.cache  # parsing a package's METADATA is slow (docs/performance.md); it does not change in a process
def installed(package: str) -> str | None:
    """The installed version of `package`, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(package: str) -> str:
    """'MindSpore 2.9.0', or 'MindSpore (not installed)'."""
    return f"{LABELS.get(package, package)} {installed(package) or '(not installed)'}"


def tested_range(package: str) -> str:
    """'>= 2.7.0, < 2.11', as the README writes it and `_instruments` declares it."""
    return ", ".join(TESTED[package])


def found() -> str:
    """The versions found and the tested range, for the start-up log and `validate`:
    'MindSpore 2.9.0, MindFormers 1.9.0 (tested: MindSpore >= 2.7.0, < 2.11; MindFormers ...)'."""
    tested = "; ".join(f"{LABELS[package]} {tested_range(package)}" for package in TESTED)
    return f"{', '.join(release(package) for package in TESTED)} (tested: {tested})"


def comparable(version: str) -> Version | None:
    """The version a vendor's build is of: PEP 440 as it stands, or the leading release
    numbers of a vendor-suffixed one ('2.9.0-ascend-b050' is 2.9.0, '2.7.0rc1.ascend' is
    2.7.0rc1); None where no version can be read ('dev', '')."""
    try:
        return Version(version)
    except InvalidVersion:
        pass
    leading = _LEADING_RELEASE.match(version)
    if leading is None:
        return None
    try:
        return Version(leading.group(0))
    except InvalidVersion:
        return None


_LEADING_RELEASE = re.compile(r"v?\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?", re.IGNORECASE)


def outside_tested_range() -> list[str]:
    """One line per installed package outside its tested range, or whose version cannot be read."""
    lines = []
    for package in TESTED:
        version = installed(package)
        if version is None:
            continue
        parsed = comparable(version)
        if parsed is None:
            lines.append(
                f"{release(package)}: unrecognised version, so whether it is in the tested range "
                f"({LABELS[package]} {tested_range(package)}) is not known: it may work; anything that does not "
                "is turned off with a message naming it"
            )
        elif parsed not in SpecifierSet(tested_range(package)):
            lines.append(
                f"{release(package)} is outside the tested range ({LABELS[package]} {tested_range(package)}): "
                "it may work; anything that does not is turned off with a message naming it"
            )
    return lines


def first_warning() -> list[str]:
    """`outside_tested_range()` the first time it is asked in this process, then nothing:
    the start-up log and each run share one warning."""
    if _warned.is_set():
        return []
    _warned.set()
    return outside_tested_range()
