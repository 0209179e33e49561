"""End to end: a real MindSpore training with the `prometheus` output, scraped by a real
Prometheus that evaluates this repository's rules, whose alert a real Alertmanager routes
with this repository's alertmanager.yaml to a webhook receiver on 127.0.0.1.

The rules and the routing tree are the shipped files, changed only where a test must: the
loss threshold (the training's loss is far below the shipped 8.0), `for` on the alert under
test (minutes in production), Alertmanager's group wait, and the receivers, which all
become webhooks to the local receiver at /<receiver name>.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import prometheus as prom
from tests.support import trainer_process
from tests.support.paths import COLLECTOR_CONFIG, RULE_FILES
from tests.support.webhook_receiver import Received, WebhookReceiver

RANK, WORLD = 2, 4
JOB = "e2e-llama"
SCRAPE_INTERVAL = "1s"
DELIVERY_TIMEOUT = 120.0  # a cold loop (first scrape, rule, group, send) takes ~10 s
MAX_STEPS = 20000  # an upper bound only: the test stops the training once the alert arrived


pytestmark = [pytest.mark.slow, pytest.mark.integration]  # real training against a backend process


def rules_for_test(workdir: Path, alert: str, loss_threshold: float | None = None) -> list[str]:
    """The shipped rule files, with `for` dropped on `alert` (and the loss threshold set)."""
    paths = []
    for source in RULE_FILES:
        document = yaml.safe_load(source.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") != alert:
                    continue
                rule.pop("for", None)
                if loss_threshold is not None:
                    rule["expr"], count = re.subn(r">\s*8\s*$", f"> {loss_threshold}", rule["expr"].strip())
                    assert count == 1, f"the shipped {alert} no longer ends in '> 8': update this test"
        target = workdir / "rules" / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(document, sort_keys=False))
        paths.append(str(target))
    return paths


def alertmanager_for_test(webhook: WebhookReceiver) -> dict:
    """The shipped routing tree and inhibit rules; every receiver posts to the local webhook."""
    config = yaml.safe_load((COLLECTOR_CONFIG / "alertmanager.yaml").read_text())
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": webhook.url(f"/{r['name']}"), "send_resolved": True}]}
        for r in config["receivers"]
    ]
    config["route"].update(group_wait="0s", group_interval="1s")
    return config


def monitor_config(workdir: Path, port: int) -> Path:
    path = workdir / "monitor.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "enable": True,
                    "interval": 5,
                    "output_type": ["prometheus", "json_file"],
                    "json_log_path": str(workdir / "metrics.json"),
                    "prometheus": {"host": "127.0.0.1", "port": port},
                    "report_ranks": "all",
                }
            }
        )
    )
    return path


@dataclass
class AlertLoop:
    webhook: WebhookReceiver
    prometheus: prom.PrometheusServer
    alertmanager: prom.AlertmanagerServer
    workdir: Path

    def wait_for_alert(self, alertname: str, receiver: str) -> Received:
        """The first firing notification of `alertname` that `receiver` delivered."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while time.monotonic() < deadline:
            for request in list(self.webhook.requests):
                if (
                    request.path == f"/{receiver}"
                    and request.body["status"] == "firing"
                    and any(a["labels"]["alertname"] == alertname for a in request.body["alerts"])
                ):
                    return request
            time.sleep(0.1)
        pytest.fail(
            f"{alertname} never reached /{receiver} in {DELIVERY_TIMEOUT:.0f} s.\n"
            f"webhook got: {[(r.path, r.body['status']) for r in self.webhook.requests]}\n"
            f"prometheus alerts: {self.prometheus.alerts()}\n"
            f"rule health: {self.prometheus.rule_health()}\n"
            f"up: {self.prometheus.query('up')}\n"
            f"alertmanager alerts: {self.alertmanager.alerts()}\n"
            f"--- trainer ---\n{trainer_process.log_tail(self.workdir)}\n"
            f"--- prometheus ---\n{self.prometheus.log_tail()}\n"
            f"--- alertmanager ---\n{self.alertmanager.log_tail()}"
        )


@contextmanager
def run_alert_loop(
    workdir: Path, alert: str, *, loss_threshold: float | None = None, nan_at: int | None = None
) -> Iterator[AlertLoop]:
    """Everything up and training; on exit the training is stopped and must end cleanly."""
    port = prom.free_port()
    stop_file = workdir / "stop"
    with ExitStack() as stack:
        webhook = stack.enter_context(WebhookReceiver())
        alertmanager = stack.enter_context(prom.alertmanager(alertmanager_for_test(webhook), workdir / "alertmanager"))
        trainer = trainer_process.spawn(
            monitor_config(workdir, port),
            workdir,
            steps=MAX_STEPS,
            stop_file=stop_file,
            nan_at=nan_at,
            env={"RANK_ID": str(RANK), "RANK_SIZE": str(WORLD)},
        )
        stack.callback(_stop, trainer, stop_file)
        prometheus_config = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "evaluation_interval": SCRAPE_INTERVAL,
            },
            "rule_files": rules_for_test(workdir / "prometheus", alert, loss_threshold),
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.address]}]}]},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        server = stack.enter_context(prom.prometheus(prometheus_config, workdir / "prometheus"))
        yield AlertLoop(webhook, server, alertmanager, workdir)
        stop_file.touch()
        assert trainer.wait(timeout=120) == 0, trainer_process.log_tail(workdir)


def _stop(trainer, stop_file: Path) -> None:
    stop_file.touch()
    try:
        trainer.wait(timeout=60)
    except Exception:
        trainer.kill()
        trainer.wait()


def json_lines(workdir: Path) -> list[dict]:
    path = workdir / f"metrics_rank_{RANK}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def loop_dir(tmp_path):
    prom.require_binary(prom.PROMETHEUS)
    prom.require_binary(prom.ALERTMANAGER)
    return tmp_path


def test_loss_above_a_low_threshold_reaches_the_webhook(loop_dir):
    with run_alert_loop(loop_dir, "MindformersLossAboveThreshold", loss_threshold=1e-6) as loop:
        notification = loop.wait_for_alert("MindformersLossAboveThreshold", "training-webhook")
        payload = notification.body
        (alert,) = [a for a in payload["alerts"] if a["labels"]["alertname"] == "MindformersLossAboveThreshold"]
        assert alert["labels"] == {
            "alertname": "MindformersLossAboveThreshold",
            "severity": "warning",
            "job": JOB,
            "training_rank": str(RANK),
        }
        # Warnings are grouped per alert and job (ranks listed inside), by the shipped route.
        assert payload["groupLabels"] == {"alertname": "MindformersLossAboveThreshold", "job": JOB}
        assert alert["annotations"]["runbook"]
        reported = re.match(r"Loss (\S+) above", alert["annotations"]["summary"]).group(1)
    # Go's %.4g of the scraped float64 is a loss the json_file output logged (read once the
    # training has ended and its writer thread has drained).
    logged = {f"{line['loss']:.4g}" for line in json_lines(loop_dir) if line.get("loss") is not None}
    assert reported in logged


def test_non_finite_loss_pages_wecom_and_the_webhook(loop_dir):
    with run_alert_loop(loop_dir, "MindformersNonFiniteLoss", nan_at=10) as loop:
        webhook = loop.wait_for_alert("MindformersNonFiniteLoss", "training-webhook")
        oncall = loop.wait_for_alert("MindformersNonFiniteLoss", "training-oncall-wecom")
        for notification in (webhook, oncall):
            (alert,) = notification.body["alerts"]
            assert alert["labels"] == {
                "alertname": "MindformersNonFiniteLoss",
                "severity": "critical",
                "job": JOB,
                "training_rank": str(RANK),
            }
        # Critical alerts are grouped per rank, so each rank gets its own page.
        assert oncall.body["groupLabels"] == {
            "alertname": "MindformersNonFiniteLoss",
            "job": JOB,
            "training_rank": str(RANK),
        }
        counted = loop.prometheus.query(f'mindformers_train_nonfinite_total{{training_metric="loss",job="{JOB}"}}')
        assert counted and float(counted[0]["value"][1]) >= 1
    lines = json_lines(loop_dir)
    bad = [line for line in lines if line.get("nonfinite")]
    assert bad and bad[0]["loss"] is None and "loss" in bad[0]["nonfinite"]
    assert bad[0]["step"] >= 10
