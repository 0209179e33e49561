"""Running scripts the way users do: in a child process under `opentelemetry-instrument`.

The child gets only standard OTEL_* variables pointing at a test OtlpReceiver, and no
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION: choosing protobuf's implementation before the SDK
imports it is the `mindformers` distro's job, and these runs prove it does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

BIN = Path(sys.executable).parent
# A launcher's span, handed down in the environment (the OTel environment-carrier spec).
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
LAUNCHER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{LAUNCHER_SPAN_ID}-01"
MSRUN_NODE_TIMEOUT = "15"


def child_env(receiver=None, **extra: str) -> dict[str, str]:
    """The test's environment without OTEL_* variables, exporting to `receiver` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROTOCOL_BUFFERS_"))}
    env.pop("TRACEPARENT", None)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # msrun starts workers with the `python` on PATH
        PYTHONPATH=str(REPO),
        # msrun's scheduler ends a job whose worker died only when that worker's heartbeat is
        # MS_NODE_TIMEOUT seconds old (30 by default): every job a test kills or crashes
        # waited that long. Heartbeats come every few seconds from a native thread. A value
        # in the test's own environment is kept.
        MS_NODE_TIMEOUT=os.environ.get("MS_NODE_TIMEOUT", MSRUN_NODE_TIMEOUT),
    )
    if receiver is not None:
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_METRIC_EXPORT_INTERVAL="500",
            OTEL_BSP_SCHEDULE_DELAY="200",
        )
    env.update(extra)
    return env


def run(command: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run to completion; fail with the child's output if it did not exit 0."""
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result


def instrumented(*command: str) -> list[str]:
    return [str(BIN / "opentelemetry-instrument"), *command]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of `count` ports in a row free on 127.0.0.1 now (local rank r's is first + r)."""
    while True:
        first = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
