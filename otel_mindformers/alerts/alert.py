"""The alert message every notifier renders, and its plain-text form."""

from __future__ import annotations

import math
from dataclasses import dataclass

INFO = "info"  # run-end notices only; rules fire as warning or critical
WARNING = "warning"
CRITICAL = "critical"

FIRING = "firing"
RESOLVED = "resolved"


def format_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


@dataclass(frozen=True)
class Alert:
    """One notification: a rule started (or kept) firing, or stopped firing."""

    rule: str
    severity: str
    status: str
    step: int
    detail: str
    job: str
    rank: int
    world_size: int
    host: str
    time_stamp: float
    value: float | None = None
    threshold: float | None = None
    capture: str | None = None  # the folder of the evidence taken when it fired (docs/captures.md)

    def title(self) -> str:
        return f"[{self.status.upper()}] {self.rule} ({self.severity}) · rank {self.rank} · step {self.step}"

    def text(self) -> str:
        """The message body chat robots show: job, rank, step, rule, value and threshold."""
        return "\n".join(
            (
                self.title(),
                self.detail,
                f"job: {self.job} · rank {self.rank}/{self.world_size} · host {self.host}",
                f"value: {format_number(self.value)} · threshold: {format_number(self.threshold)}",
                *((f"capture: {self.capture}",) if self.capture else ()),
            )
        )

    def to_json_dict(self) -> dict[str, object]:
        """Strict JSON for the generic webhook. A NaN/Inf value or threshold is written as
        null and named under `"nonfinite"`, as in the JSON log (`threshold: inf` stays known)."""
        nonfinite = [
            name
            for name, number in (("value", self.value), ("threshold", self.threshold))
            if number is not None and not math.isfinite(number)
        ]
        body: dict[str, object] = {
            "source": "otel_mindformers",
            "status": self.status,
            "rule": self.rule,
            "severity": self.severity,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "step": self.step,
            "value": None if "value" in nonfinite else self.value,
            "threshold": None if "threshold" in nonfinite else self.threshold,
            "message": self.detail,
            "time_stamp": round(self.time_stamp, 6),
        }
        if nonfinite:
            body["nonfinite"] = nonfinite
        if self.capture:
            body["capture"] = self.capture
        return body
