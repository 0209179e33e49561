"""An AlertEngine from a whole MonitorConfig, the way MonitorRun starts one (run.py)."""

from __future__ import annotations

from typing import Any

from otel_mindformers.alerts import AlertEngine
from otel_mindformers.config import MonitorConfig
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.providers import service_name


def engine_for(config: MonitorConfig, identity: Identity, telemetry: Any, progress: Any) -> AlertEngine | None:
    return AlertEngine.start(
        config.alert_config,
        identity,
        telemetry,
        progress,
        job=service_name(config.telemetry),
        reports_training=config.reports_training_metrics(identity.rank),
        json_log_path=config.json_log_path,
    )
