"""The `prometheus` output's port: busy, reused by the next run, and which rank moves it."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request

import psutil
import pytest
from mindspore.train import Callback

from otel_mindformers import MonitorCallback
from tests.support import training
from tests.support.blackhole import Blackhole
from tests.support.instrumented import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # real training runs

LOSS_SERIES = "mindformers_train_loss"  # the loss gauge as Prometheus names it


class Scrape(Callback):
    """Reads the metrics endpoint from inside training, at the step given."""

    def __init__(self, port: int, at_step: int = 2) -> None:
        super().__init__()
        self.url, self.at_step, self.body = f"http://127.0.0.1:{port}/metrics", at_step, None

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.at_step:
            self.body = self.read()

    def read(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return response.read().decode()


def _config(workdir, port: int, **overrides) -> dict:
    return {
        "interval": 1,
        "output_type": ["json_file", "prometheus"],
        "json_log_path": str(workdir / "m.json"),
        "prometheus": {"port": port},
        "grad_monitor": False,
        "shutdown_timeout": 1.0,
        **overrides,
    }


def _port_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "monitor_config.prometheus.port" in r.getMessage()
    ]


def test_a_busy_port_is_one_warning_and_training_runs(workdir, caplog):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            training.train([MonitorCallback(_config(workdir, port))], steps=4)
    (warning,) = _port_warnings(caplog)
    assert f"127.0.0.1:{port}" in warning
    assert len((workdir / "m.json").read_text().splitlines()) == 4


def _exporting_threads() -> set[threading.Thread]:
    """The SDK's batch and periodic export threads, and ours that shut the providers down."""
    return {thread for thread in threading.enumerate() if thread.name.startswith(("Otel", "otel-mindformers"))}


def test_the_next_run_in_the_process_gets_the_port_while_the_last_still_shuts_down(workdir, caplog):
    """A blackholed collector holds the first run's telemetry shutdown past its deadline: the
    port must already be free when the second run starts. The runs' exporters, left retrying
    with jitter drawn from the global `random`, are waited for at the end: they ran into later
    tests (Hypothesis' "random module" notice in the config fuzz test)."""
    before = _exporting_threads()
    port, hole = free_port(), Blackhole()
    # Past the 1 s shutdown deadline, and short enough to wait out at the end.
    otlp = {"endpoint": f"http://127.0.0.1:{hole.port}", "timeout": 3.0, "export_interval": 0.1}
    try:
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            for run in (1, 2):
                scrape = Scrape(port)
                config = _config(
                    workdir,
                    port,
                    output_type=["json_file", "prometheus", "otlp"],
                    otlp=otlp,
                    json_log_path=str(workdir / f"run{run}.json"),
                )
                training.train([MonitorCallback(config), scrape], steps=3)
                assert f"{LOSS_SERIES}{{" in scrape.body
                # One run's reader per endpoint: the first run's series are not served again.
                assert scrape.body.count(f"{LOSS_SERIES}{{") == 1, scrape.body
    finally:
        hole.close()
        wait_until(lambda: not _exporting_threads() - before, "the runs' exporters to stop")
    assert _port_warnings(caplog) == []


@pytest.mark.parametrize(
    ("env", "offset"),
    [
        ({"DEVICE_ID": "3"}, 0),  # alone on device 3: the configured port
        ({"DEVICE_ID": "1", "RANK_ID": "1", "RANK_SIZE": "2"}, 1),  # two local ranks: port + local rank
        # The second node's local rank 1 (global rank 9): its node's ports, not rank 9's.
        ({"DEVICE_ID": "1", "LOCAL_RANK": "1", "RANK_ID": "9", "RANK_SIZE": "16"}, 1),
    ],
)
def test_the_port_moves_by_local_rank_only_with_several_ranks(workdir, monkeypatch, env, offset):
    for name in ("DEVICE_ID", "LOCAL_RANK", "SLURM_LOCALID", "RANK_ID", "RANK_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    base = free_port()
    while not _free(base + offset):
        base = free_port()
    scrape = Scrape(base + offset)
    training.train([MonitorCallback(_config(workdir, base, report_ranks="all")), scrape], steps=3)
    assert f"{LOSS_SERIES}{{" in scrape.body


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _listening() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


class _NewListeners(Callback):
    """The ports this process listens on at a step that it did not before training, and
    what the one port serves."""

    def __init__(self, before: set[int]) -> None:
        super().__init__()
        self.before, self.ports, self.body = before, set(), ""

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 2:
            self.ports = _listening() - self.before
            if len(self.ports) == 1:
                self.body = Scrape(next(iter(self.ports))).read()


def test_port_0_is_any_free_port_on_every_rank(workdir, monkeypatch):
    """`prometheus.port: 0` is any free port (docs): with several ranks, not `0 + local rank`."""
    for name in ("DEVICE_ID", "LOCAL_RANK", "SLURM_LOCALID", "RANK", "RANK_ID", "RANK_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEVICE_ID", "1")
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    listeners = _NewListeners(_listening())
    training.train([MonitorCallback(_config(workdir, 0, report_ranks="all")), listeners], steps=3)
    (port,) = listeners.ports
    assert port >= 1024, port  # the kernel's pick, not a privileged port picked by a sum
    assert f"{LOSS_SERIES}{{" in listeners.body
