"""The software a job runs on: MindSpore, MindFormers, CANN, the driver and firmware versions,
each only where it can be read (package metadata and a few small version files)."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path

from otel_mindformers.compat import releases
from otel_mindformers.names import semconv

# Where the Ascend packages write their versions (`Version=...` / `version=...` lines).
ASCEND_HOME = Path(os.environ.get("ASCEND_HOME", "/usr/local/Ascend"))
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def _version_file(path: Path) -> str | None:
    """`Version=` / `version=` of an Ascend version.info / *_install.info file."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"^version\s*=\s*(\S+)", text, re.IGNORECASE | re.MULTILINE)
    return match.group(1) if match else None


def _cann_version(env: Mapping[str, str]) -> str | None:
    homes = [Path(env[name]) for name in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(name)]
    homes += [ASCEND_HOME / "ascend-toolkit" / "latest", ASCEND_HOME / "cann" / f"{platform.machine()}-linux"]
    for home in homes:
        for name in ("ascend_toolkit_install.info", "version.cfg", "compiler/version.info"):
            if (version := _version_file(home / name)) is not None:
                return version
    return None


def _nvidia_driver_version() -> str | None:
    try:
        match = re.search(r"Kernel Module\s+(\S+)", _NVIDIA_DRIVER.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def software_versions(env: Mapping[str, str]) -> dict[str, str]:
    """The versions known on this host, by resource attribute."""
    versions = (
        (semconv.ATTR_MINDSPORE_VERSION, releases.installed(releases.MINDSPORE)),
        (semconv.ATTR_MINDFORMERS_VERSION, releases.installed(releases.MINDFORMERS)),
        (semconv.ATTR_CANN_VERSION, _cann_version(env)),
        (
            semconv.ATTR_DRIVER_VERSION,
            _version_file(ASCEND_HOME / "driver" / "version.info") or _nvidia_driver_version(),
        ),
        (semconv.ATTR_FIRMWARE_VERSION, _version_file(ASCEND_HOME / "firmware" / "version.info")),
    )
    return {key: value for key, value in versions if value}
