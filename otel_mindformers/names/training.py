"""The training metrics, one row each: the single place that names a training metric.

A row says everything the package does with one metric of a sampled step: its key (the
`monitored_metrics` entry, the JSON-line key and the TensorBoard tag), the OTel instrument
that carries it, its step-span attribute, how the stdout line prints it, and where its value
comes from (a position in the step's outputs, the optimizer, or the host clock). The
instruments, span attributes, stdout line, JSON keys, replay and docs/telemetry.md's name
table are all derived from these rows; adding a metric is one row plus its extraction.

Dimensionless scalars (loss, learning rate, grad norm, loss scale) carry an empty unit on
purpose: with unit ``1`` the Collector's Prometheus translator appends ``_ratio`` and the
Python exporter does not, so alert rules would need two spellings of every name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from otel_mindformers.names import model_state as model_state_specs
from otel_mindformers.names.spec import Kind, MetricSpec

Value = Union[float, bool]


@dataclass(frozen=True)
class TrainingMetric:
    key: str
    instrument: MetricSpec
    stdout_label: str
    stdout_format: Callable[[Value], str]
    # Index in the step's outputs as MindFormers' MFTrainOneStepCell orders them: (loss,
    # overflow, loss_scale, learning_rate, global_norm, local_norm, size). Shorter tuples
    # hold a prefix: (loss,), (loss, overflow, loss_scale). None: not a step output.
    output_position: int | None = None
    # Read from the optimizer's schedule when the outputs do not carry it.
    from_optimizer: bool = False
    # Multiplies the value into the instrument's unit (milliseconds → seconds).
    instrument_scale: float = 1.0
    # A counter incremented on sampled steps where the value is true.
    counted_when_true: MetricSpec | None = None
    # Routed from MindFormers' TrainingStateMonitor (model_state/inbox.py): the named
    # `monitor_config` key lights it up, not `monitored_metrics`.
    routed_from: str | None = None

    @property
    def span_attribute(self) -> str:
        return f"training.{self.key}"

    @property
    def needs_readback(self) -> bool:
        """True when reading it syncs the device (a tensor output or the optimizer's lr)."""
        return self.output_position is not None or self.from_optimizer


def _fixed(digits: int) -> Callable[[Value], str]:
    return lambda value: f"{value:.{digits}f}"


# Seconds-scaled buckets: the SDK defaults (0, 5, 10, 25, ...) suit milliseconds, not
# training steps that last from a few milliseconds (tiny CPU models) to minutes.
STEP_DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

OVERFLOW_STEPS = MetricSpec(
    "mindformers.train.overflow.steps", Kind.COUNTER, "{step}", "Sampled steps that overflowed."
)

LOSS = "loss"
LEARNING_RATE = "learning_rate"
GRAD_NORM = "grad_norm"
STEP_TIME = "train_per_step_time"
OVERFLOW = "overflow"
LOSS_SCALE = "loss_scale"
# The values whose NaN/Inf is the training's own fault: the `nonfinite` rule's and the first
# bad rank's (a custom scalar's NaN, a user's 0/0 accuracy, is the user's metric, not a bad step).
NONFINITE_WATCHED = (LOSS, GRAD_NORM)
SAMPLES_PER_SECOND = "samples_per_second"
TOKENS_PER_SECOND = "tokens_per_second"
GOODPUT = "goodput"
MFU = "mfu"
TFLOPS = "tflops"
ETA = "eta"


def _duration(seconds: Value) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


WEIGHT_NORM = "weight_norm"
DEVICE_LOCAL_NORM = "device_local_norm"
THROUGHPUT_LINEARITY = "throughput_linearity"
MAX_ATTENTION_LOGIT = "max_attention_logit"

# In the order people read them: the stdout line and the JSON line follow it.
TABLE: tuple[TrainingMetric, ...] = (
    TrainingMetric(
        LOSS,
        MetricSpec("mindformers.train.loss", Kind.GAUGE, "", "Training loss of the sampled step."),
        "loss", _fixed(4), output_position=0,
    ),
    TrainingMetric(
        LEARNING_RATE,
        MetricSpec("mindformers.train.learning_rate", Kind.GAUGE, "", "Learning rate the sampled step used."),
        "lr", lambda value: f"{value:.3e}", output_position=3, from_optimizer=True,
    ),
    TrainingMetric(
        GRAD_NORM,
        MetricSpec("mindformers.train.grad_norm", Kind.GAUGE, "", "Global gradient norm of the sampled step."),
        "grad_norm", _fixed(4), output_position=4,
    ),
    TrainingMetric(
        STEP_TIME,
        MetricSpec(
            "mindformers.train.step.duration", Kind.HISTOGRAM, "s",
            "Wall time per training step, averaged over the steps since the previous sample.",
        ),
        # Milliseconds in the JSON line and stdout, as MindFormers prints it; OTel wants seconds.
        "step_time", lambda value: f"{value:.1f}ms", instrument_scale=1e-3,
    ),
    TrainingMetric(
        OVERFLOW,
        MetricSpec(
            "mindformers.train.overflow", Kind.GAUGE, "",
            "1 when the sampled step overflowed (its update was skipped), else 0.",
        ),
        "overflow", lambda value: "YES" if value is True else "no" if value is False else str(value), output_position=1,
        counted_when_true=OVERFLOW_STEPS,
    ),
    TrainingMetric(
        LOSS_SCALE,
        MetricSpec(
            "mindformers.train.loss_scale", Kind.GAUGE, "",
            "Loss scale the train cell returned at the sampled step: MindSpore's loss-scale cells return it "
            "after the step's update (already lowered on a step that overflowed).",
        ),
        "scale", lambda value: f"{value:g}", output_position=2,
    ),
    TrainingMetric(
        SAMPLES_PER_SECOND,
        MetricSpec("mindformers.train.samples.rate", Kind.GAUGE, "{sample}/s", "Training throughput in samples."),
        "samples/s", _fixed(1),
    ),
    TrainingMetric(
        TOKENS_PER_SECOND,
        MetricSpec("mindformers.train.tokens.rate", Kind.GAUGE, "{token}/s", "Training throughput in tokens."),
        "tokens/s", _fixed(0),
    ),
    # Where the time goes (docs/time.md): host-computed on sampled steps, no readback.
    TrainingMetric(
        GOODPUT,
        MetricSpec(
            "mindformers.goodput", Kind.GAUGE, "",
            "Fraction of wall time since the run began spent in productive training steps.",
        ),
        "goodput", _fixed(3),
    ),
    TrainingMetric(
        MFU,
        MetricSpec(
            "mindformers.mfu", Kind.GAUGE, "",
            "Model FLOPs utilization: achieved model FLOPs per second of this device over its peak.",
        ),
        "mfu", _fixed(3),
    ),
    TrainingMetric(
        TFLOPS,
        MetricSpec("mindformers.tflops", Kind.GAUGE, "{TFLOP}/s", "Achieved model TFLOPS of this device."),
        "TFLOPS", _fixed(2),
    ),
    TrainingMetric(
        ETA,
        MetricSpec(
            "mindformers.eta", Kind.GAUGE, "s",
            "Estimated time to the last training step: remaining steps times the smoothed step time.",
        ),
        "eta", _duration,
    ),
    # MindFormers' own readings (TrainingStateMonitor), under MindFormers' tag names.
    TrainingMetric(
        WEIGHT_NORM,
        MetricSpec("mindformers.model.weight_norm", Kind.GAUGE, "", "L2 norm of all trainable weights (MindFormers' weight_norm)."),
        "weight_norm", _fixed(4), routed_from="weight_state_format",
    ),
    TrainingMetric(
        DEVICE_LOCAL_NORM,
        MetricSpec(
            "mindformers.model.device_local_norm", Kind.GAUGE, "",
            "This rank's gradient norm over the parameters it holds (MindFormers' device_local_norm).",
        ),
        "device_local_norm", _fixed(4), routed_from="device_local_norm_format",
    ),
    TrainingMetric(
        THROUGHPUT_LINEARITY,
        MetricSpec(
            "mindformers.train.throughput_linearity", Kind.GAUGE, "",
            "Per-device throughput over `throughput_baseline` (MindFormers' throughput_linearity).",
        ),
        "linearity", _fixed(3), routed_from="throughput_baseline",
    ),
    TrainingMetric(
        MAX_ATTENTION_LOGIT,
        MetricSpec(
            "mindformers.model.max_attention_logit", Kind.GAUGE, "",
            "Largest attention logit over heads and layers (MindFormers' max_attention_logit/max).",
        ),
        "max_attn_logit", _fixed(2), routed_from="max_attention_logit_format",
    ),
)  # fmt: skip

BY_KEY: dict[str, TrainingMetric] = {row.key: row for row in TABLE}
# The `monitored_metrics` choices; routed readings follow MindFormers' keys instead.
KNOWN_METRICS: tuple[str, ...] = tuple(row.key for row in TABLE if row.routed_from is None)
ORDER: dict[str, int] = {key: index for index, key in enumerate(BY_KEY)}
READBACK_METRICS = frozenset(row.key for row in TABLE if row.needs_readback)

# Per sampled step, whatever was monitored.
STEPS = MetricSpec("mindformers.train.steps", Kind.COUNTER, "{step}", "Training steps completed.")
NONFINITE = MetricSpec(
    "mindformers.train.nonfinite",
    Kind.COUNTER,
    "{value}",
    "NaN/Inf values seen (the SDK drops non-finite measurements, so they are counted here).",
)
# Attribute on the non-finite counter naming which value was NaN/Inf.
ATTR_METRIC = "training.metric"

INSTRUMENTS: tuple[MetricSpec, ...] = (
    *(row.instrument for row in TABLE),
    OVERFLOW_STEPS,
    STEPS,
    NONFINITE,
    *model_state_specs.INSTRUMENTS,
)
# Histograms whose observations are not step times.
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    model_state_specs.LOCAL_LOSS.name: model_state_specs.LOCAL_LOSS_BUCKETS
}


def instrument_name(key: str) -> str:
    """The OTel instrument name of a training metric key (`loss` → `mindformers.train.loss`)."""
    return BY_KEY[key].instrument.name


def markdown_table() -> str:
    """docs/telemetry.md's table of training metrics, generated from the rows."""
    lines = [
        "| key (`monitored_metrics`, JSON, TensorBoard) | OTel instrument | kind | unit | step-span attribute | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for row in TABLE:
        spec = row.instrument
        unit = f"`{spec.unit}`" if spec.unit else ""
        lit = f" Lit up by `{row.routed_from}`." if row.routed_from else ""
        lines.append(
            f"| `{row.key}` | `{spec.name}` | {spec.kind.value} | {unit} | `{row.span_attribute}` | {spec.description}{lit} |"
        )
    for spec in (OVERFLOW_STEPS, STEPS, NONFINITE):
        lines.append(f"| | `{spec.name}` | {spec.kind.value} | `{spec.unit}` | | {spec.description} |")
    return "\n".join(lines)
