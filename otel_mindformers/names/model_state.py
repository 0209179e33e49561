"""The model-state series: one row per family of per-parameter readings, and the MoE and
local-loss instruments. Everything that names a model-state series derives from here:
the instruments, the JSON-line keys, TensorBoard tags, docs/telemetry.md's table and the rules.

Cardinality: a family exports one series per layer, one per kind (six at most), one
max-over-parameters series (the parameter's name is an attribute *value*), and per-parameter
series only for the parameters MindFormers' `target` / `invert` filter selects, at most
`PARAMETER_SERIES_CAP` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_mindformers.names.spec import Kind, MetricSpec

ATTR_LAYER = "model.layer"
ATTR_KIND = "model.kind"
ATTR_PARAMETER = "model.parameter"
ATTR_LOSS = "model.loss"  # the loss's tag in MindFormers' device local loss (`lm`, `aux`, ...)

# Per family; the first selected names by sort order are kept, the rest left out (one warning).
PARAMETER_SERIES_CAP = 64

# Keys of the model-state summary (the JSON line's `model_state` object) beside the families'.
SUMMARY_LOCAL_LOSS = "local_loss"
SUMMARY_DEVICE_LOCAL_LOSS = "device_local_loss"
SUMMARY_EXPERT_LOAD = "expert_load"
SUMMARY_EXPERT_LOAD_IMBALANCE = "expert_load_imbalance"
SUMMARY_DROP_RATE = "drop_rate"

GRAD_NORM = "grad_norm"
ADAM_M_NORM = "adam_m_norm"
ADAM_V_NORM = "adam_v_norm"


@dataclass(frozen=True)
class Family:
    """Per-parameter L2 norms of one quantity, aggregated by layer, kind and max."""

    key: str
    what: str  # for descriptions: "gradient", "Adam first moment", ...
    lit_by: str  # the user's key that lights it up

    def _spec(self, level: str, description: str) -> MetricSpec:
        return MetricSpec(f"mindformers.model.{self.key}.{level}", Kind.GAUGE, "", description)

    @property
    def layer(self) -> MetricSpec:
        return self._spec(
            "layer", f"L2 norm of the {self.what} over one transformer layer's parameters ({ATTR_LAYER})."
        )

    @property
    def kind(self) -> MetricSpec:
        return self._spec(
            "kind",
            f"L2 norm of the {self.what} over one kind of parameter ({ATTR_KIND}: embedding, attention, mlp, norm, head, other).",
        )

    @property
    def max(self) -> MetricSpec:
        return self._spec("max", f"Largest per-parameter {self.what} norm; {ATTR_PARAMETER} names the parameter.")

    @property
    def parameter(self) -> MetricSpec:
        return self._spec(
            "parameter",
            f"Per-parameter {self.what} norm, only for parameters `target`/`invert` select (at most {PARAMETER_SERIES_CAP}).",
        )

    @property
    def specs(self) -> tuple[MetricSpec, ...]:
        return (self.layer, self.kind, self.max, self.parameter)


FAMILIES: tuple[Family, ...] = (
    Family(
        GRAD_NORM, "gradient", "`runner_wrapper.local_norm: True` (the 7-tuple), or `local_norm_format` (dump files)"
    ),
    Family(ADAM_M_NORM, "Adam first moment (m)", "`optimizer_state_format`"),
    Family(ADAM_V_NORM, "Adam second moment (v)", "`optimizer_state_format`"),
)
BY_FAMILY: dict[str, Family] = {family.key: family for family in FAMILIES}

LOCAL_LOSS = MetricSpec(
    "mindformers.model.local_loss",
    Kind.HISTOGRAM,
    "",
    "This rank's loss per micro-batch (MindFormers' micro_local_*_loss), one observation each.",
)
DEVICE_LOCAL_LOSS = MetricSpec(
    "mindformers.model.device_local_loss",
    Kind.GAUGE,
    "",
    f"This rank's accumulated local loss per loss ({ATTR_LOSS}: lm, aux, mtp, ...).",
)
EXPERT_LOAD_IMBALANCE = MetricSpec(
    "mindformers.moe.expert_load.imbalance",
    Kind.GAUGE,
    "",
    f"Busiest expert's load over the mean expert load in one MoE layer ({ATTR_LAYER}); 1 is perfectly balanced.",
)
DROP_RATE = MetricSpec(
    "mindformers.moe.drop_rate",
    Kind.GAUGE,
    "",
    f"Share of tokens over expert capacity in one MoE layer ({ATTR_LAYER}), from MoEDropRateCallback.",
)
LOCAL_LOSS_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 25.0, 50.0,
)  # fmt: skip

INSTRUMENTS: tuple[MetricSpec, ...] = (
    *(spec for family in FAMILIES for spec in family.specs),
    LOCAL_LOSS,
    DEVICE_LOCAL_LOSS,
    EXPERT_LOAD_IMBALANCE,
    DROP_RATE,
)


def series_per_rank(layers: int, selected_parameters: int, moe_layers: int = 0, losses: int = 1) -> int:
    """Active series one rank exports for the model state (all families lit): per family one
    per layer, six kinds, one max, the selected parameters; the local-loss histogram counts
    as one; per MoE layer an imbalance and a drop rate."""
    per_family = layers + 6 + 1 + min(selected_parameters, PARAMETER_SERIES_CAP)
    return len(FAMILIES) * per_family + 1 + losses + 2 * moe_layers


def markdown_table() -> str:
    """docs/telemetry.md's table: each model-state series, the key that lights it up, its attributes."""
    lines = ["| OTel instrument | kind | attributes | lit up by | meaning |", "|---|---|---|---|---|"]
    attributes = {
        "layer": ATTR_LAYER,
        "kind": ATTR_KIND,
        "max": f"{ATTR_PARAMETER}, {ATTR_LAYER}",
        "parameter": ATTR_PARAMETER,
    }
    for family in FAMILIES:
        for level, spec in zip(("layer", "kind", "max", "parameter"), family.specs):
            lines.append(f"| `{spec.name}` | gauge | `{attributes[level]}` | {family.lit_by} | {spec.description} |")
    for spec, attribute, lit_by in (
        (LOCAL_LOSS, "", "`local_loss_format` with `log`"),
        (DEVICE_LOCAL_LOSS, ATTR_LOSS, "`device_local_loss_format`"),
        (EXPERT_LOAD_IMBALANCE, ATTR_LAYER, "`TopkBiasBalanceCallback` + `tensorboard.log_expert_load_to_tensorboard`"),
        (DROP_RATE, ATTR_LAYER, "`MoEDropRateCallback` in `callbacks`"),
    ):
        lines.append(
            f"| `{spec.name}` | {spec.kind.value} | {f'`{attribute}`' if attribute else ''} | {lit_by} | {spec.description} |"
        )
    return "\n".join(lines)
