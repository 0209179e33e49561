"""In-process alerts: anomaly rules, notifications, stall watchdog and early stop.

`AlertEngine.start(alert_config, identity, telemetry, progress, job=..., reports_training=...,
json_log_path=...)` returns None when
`alert_config.enable_alert` is off; see docs/alerts.md.
"""

from otel_mindformers.alerts.alert import Alert
from otel_mindformers.alerts.engine import AlertEngine

__all__ = ["Alert", "AlertEngine"]
