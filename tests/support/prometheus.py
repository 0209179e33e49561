"""Real Prometheus and Alertmanager processes on 127.0.0.1 for tests.

The binaries come from Debian (`apt-get install prometheus prometheus-alertmanager`:
Prometheus 2.42, promtool, Alertmanager 0.25, amtool). A test that needs one skips when it
is absent, except under CI=true, where a missing binary is a failure: CI must not go green
by skipping the alert loop.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.backends import unavailable

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
ALERTMANAGER = "prometheus-alertmanager"
AMTOOL = "amtool"
APT_PACKAGES = "prometheus prometheus-alertmanager"

_STARTUP_TIMEOUT = 30.0


def require_binary(name: str) -> str:
    """Path of `name` on PATH; skip the test without it, or fail under CI=true."""
    path = shutil.which(name)
    if path:
        return path
    unavailable(f"{name!r} is not installed (apt-get install -y --no-install-recommends {APT_PACKAGES})")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need it up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_tool(*argv: str) -> subprocess.CompletedProcess:
    """Run promtool / amtool (or any binary found by `require_binary`) and capture its output."""
    return subprocess.run([require_binary(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120)


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def _wait_ready(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {_STARTUP_TIMEOUT:.0f} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process(process: subprocess.Popen) -> None:
    """Terminate a server the test started; kill it if it does not exit within 15 s."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def _process(argv: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen]:
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait_ready(process, ready_url, log)
            yield process
        finally:
            stop_process(process)


@dataclass
class PrometheusServer:
    url: str
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the `result` list of the HTTP API's answer."""
        query = urllib.parse.urlencode({"query": expr})
        return _get_json(f"{self.url}/api/v1/query?{query}")["data"]["result"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active (pending and firing) alerts as Prometheus' rule evaluation sees them."""
        return _get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def rule_health(self) -> dict[str, str]:
        """Rule name → health ("ok", "err", "unknown"), for diagnosing a silent rule."""
        groups = _get_json(f"{self.url}/api/v1/rules")["data"]["groups"]
        return {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}

    def log_tail(self) -> str:
        return _tail(self.log)


@contextmanager
def prometheus(config: dict[str, Any], workdir: Path) -> Iterator[PrometheusServer]:
    """Prometheus on an ephemeral 127.0.0.1 port with `config` (prometheus.yml as a dict).

    Relative `rule_files` in `config` resolve against `workdir`, where the config is written.
    """
    binary = require_binary(PROMETHEUS)
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    address = f"127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={address}",
        "--log.level=debug",
    ]
    url = f"http://{address}"
    log = workdir / "prometheus.log"
    with _process(argv, log, f"{url}/-/ready"):
        yield PrometheusServer(url=url, log=log)


@dataclass
class AlertmanagerServer:
    url: str
    log: Path

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def alerts(self) -> list[dict[str, Any]]:
        return _get_json(f"{self.url}/api/v2/alerts")

    def log_tail(self) -> str:
        return _tail(self.log)


@contextmanager
def alertmanager(config: dict[str, Any], workdir: Path) -> Iterator[AlertmanagerServer]:
    """Alertmanager on an ephemeral 127.0.0.1 port, clustering off (its default binds 0.0.0.0)."""
    binary = require_binary(ALERTMANAGER)
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    address = f"127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--config.file={config_file}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address={address}",
        "--cluster.listen-address=",
        "--log.level=debug",
    ]
    url = f"http://{address}"
    log = workdir / "alertmanager.log"
    with _process(argv, log, f"{url}/-/ready"):
        yield AlertmanagerServer(url=url, log=log)
