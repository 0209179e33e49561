"""End to end: a real MindSpore training with `device_monitor` and the fake npu-smi and
hccn_tool first on PATH (910b fixtures: NPU 1 has an error code and a throttled clock, its
RoCE port is down with low receive power) serves the `prometheus` output; a real Prometheus
scrapes it and evaluates the shipped device rules, with `for` dropped on the alerts under
test, and must fire each of them for that NPU and port."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from tests.support import prometheus as prom
from tests.support import trainer_process
from tests.support.paths import FAKE_BIN, RULE_FILES

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # real training against a real Prometheus

EXPECTED = {  # alert -> hw_id it must name
    "MindformersNpuErrorCode": "npu-1",
    "MindformersDeviceThrottled": "npu-1",
    "MindformersNetworkDown": "npu-1-roce",
    "MindformersOpticalPowerOutOfRange": "npu-1-roce",
}
TIMEOUT_S = 240.0  # a loaded 2-core machine starts the trainer slowly


def shipped_rules_without_for(workdir: Path) -> list[str]:
    paths = []
    for source in RULE_FILES:
        document = yaml.safe_load(source.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") in EXPECTED:
                    rule.pop("for", None)
        target = workdir / "rules" / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(document, sort_keys=False))
        paths.append(str(target))
    return paths


def test_fixture_faults_fire_the_shipped_device_rules_in_a_real_prometheus(tmp_path):
    prom.require_binary(prom.PROMETHEUS)
    served = prom.free_port()
    port = served - 1  # local rank 1 (DEVICE_ID) of a two-rank job serves on `prometheus.port + 1`
    config = tmp_path / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "interval": 5,
                    "output_type": ["prometheus"],
                    "prometheus": {"host": "127.0.0.1", "port": port},
                    "report_ranks": "all",
                    "device_monitor": True,
                    "device_config": {"poll_interval": 1.0},
                }
            }
        )
    )
    stop_file = tmp_path / "stop"
    trainer = trainer_process.spawn(
        config,
        tmp_path,
        steps=20000,
        stop_file=stop_file,
        env={
            "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
            "RANK_ID": "1",
            "RANK_SIZE": "2",
            "DEVICE_ID": "1",
        },
    )
    try:
        prometheus_config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": shipped_rules_without_for(tmp_path / "prometheus"),
            "scrape_configs": [{"job_name": "npu-job", "static_configs": [{"targets": [f"127.0.0.1:{served}"]}]}],
        }
        with prom.prometheus(prometheus_config, tmp_path / "prometheus") as server:
            firing: dict[str, str] = {}
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline and set(firing) != set(EXPECTED):
                firing = {
                    a["labels"]["alertname"]: a["labels"].get("hw_id")
                    for a in server.alerts()
                    if a["state"] == "firing" and a["labels"]["alertname"] in EXPECTED
                }
                time.sleep(0.2)
            assert firing == EXPECTED, (
                f"firing: {firing}\nup: {server.query('up')}\n"
                f"--- trainer ---\n{trainer_process.log_tail(tmp_path)}\n--- prometheus ---\n{server.log_tail()}"
            )
            (alert,) = [a for a in server.alerts() if a["labels"]["alertname"] == "MindformersNpuErrorCode"]
            assert alert["labels"]["hw_npu_error_code"] == "0x80E18005" and alert["labels"]["training_rank"] == "1"
            assert alert["annotations"]["runbook"]
    finally:
        stop_file.touch()
        try:
            assert trainer.wait(timeout=120) == 0, trainer_process.log_tail(tmp_path)
        except Exception:
            trainer.kill()
            trainer.wait()
            raise
