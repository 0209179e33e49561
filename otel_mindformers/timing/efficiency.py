"""Model FLOPs utilisation (MFU), achieved TFLOPS, and the time to the end of training.

FLOPs per token (training: forward + backward = 3 x forward; recomputation is not counted,
so this is *model* FLOPs, as in PaLM's MFU) for a decoder-only transformer with L layers,
hidden size h, sequence length s, vocabulary V, n query heads and k key/value heads (head
size d = h / n), feed-forward size f, SwiGLU (three matrices) or a plain MLP (two):

    forward = L * (2*h*(n*d + 2*k*d) + 2*n*d*h       # Q, K, V and output projections
                   + 2*m*h*f                           # feed-forward, m = 3 (SwiGLU) or 2
                   + 4*s*h)                            # attention scores and context
              + 2*h*V                                  # the output layer
    training = 3 * forward

With n = k, a 4h plain MLP and no output layer this is the familiar 6*N + 12*L*h*s (PaLM,
appendix B). A mixture-of-experts layer counts its *active* feed-forward: top-k routed
experts plus the shared ones, and the router (2*h*E).

MFU = FLOPs per token x this rank's tokens per second / the device's peak FLOPS. Under
data parallelism that is the device's achieved model FLOPs; a rank of a tensor- or
pipeline-parallel group trains a slice of the model, so set `flops_per_token` to the
rank's share (docs/time.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

from otel_mindformers.compat import mindspore_cell
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

# Dense peak TFLOPS by device and dtype ("16" = fp16/bf16 matrix units, no sparsity; "32" =
# fp32). The sources, and how sure each figure is, are in docs/time.md; `peak_tflops` in
# monitor_config overrides the table for any device.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Ascend (npu-smi / MindSpore device names)
    "Ascend910A": {"16": 256.0},
    "Ascend910ProA": {"16": 256.0},
    "Ascend910B1": {"16": 414.0},
    "Ascend910B2": {"16": 376.0},
    "Ascend910B2C": {"16": 376.0},
    "Ascend910B3": {"16": 313.0},
    "Ascend910B4": {"16": 280.0},
    "Ascend910_93": {"16": 752.0},  # Atlas A3 / 910C: two dies per package
    "Ascend910C": {"16": 752.0},
    # NVIDIA (datasheet dense tensor-core figures; fp32 = non-tensor)
    "V100": {"16": 125.0, "32": 15.7},
    "A100": {"16": 312.0, "32": 19.5},
    "A800": {"16": 312.0, "32": 19.5},
    "A10": {"16": 125.0, "32": 31.2},
    "L40S": {"16": 362.05, "32": 91.6},
    "L40": {"16": 181.05, "32": 90.5},
    "L20": {"16": 119.5, "32": 59.8},
    "H100 PCIe": {"16": 756.0, "32": 51.0},
    "H100": {"16": 989.0, "32": 67.0},
    "H800": {"16": 989.0, "32": 67.0},
    "H200": {"16": 989.0, "32": 67.0},
    "H20": {"16": 148.0, "32": 44.0},
    "B200": {"16": 2250.0, "32": 80.0},
    "RTX 4090": {"16": 165.2, "32": 82.6},
}


def peak_tflops(device_name: str | None, dtype: str | None) -> float | None:
    """The table's peak for a device name as drivers report it ("Ascend910B3", "NVIDIA
    A100-SXM4-80GB"): the longest table name it contains. None: unknown device or dtype."""
    if not device_name:
        return None
    width = "32" if dtype and "32" in dtype else "16"
    compact = device_name.replace(" ", "").lower()
    matches = [name for name in PEAK_TFLOPS if name.replace(" ", "").lower() in compact]
    if not matches:
        return None
    return PEAK_TFLOPS[max(matches, key=len)].get(width)


# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_length: int
    swiglu: bool = True
    experts: int = 0  # routed experts (0: dense)
    experts_per_token: int = 0
    shared_experts: int = 0

    def training_flops_per_token(self) -> float:
        head = self.hidden / self.heads
        projections = (
            2 * self.hidden * (self.heads * head + 2 * self.kv_heads * head) + 2 * self.heads * head * self.hidden
        )
        matrices = 3 if self.swiglu else 2
        ffn_one = 2 * matrices * self.hidden * self.ffn
        if self.experts:
            ffn = ffn_one * (self.experts_per_token + self.shared_experts) + 2 * self.hidden * self.experts
        else:
            ffn = ffn_one
        attention = 4 * self.seq_length * self.hidden
        forward = self.layers * (projections + ffn + attention) + 2 * self.hidden * self.vocab
        return 3.0 * forward


def _llama_ffn(config: Any, hidden: int) -> int:
    """MindFormers' LLaMA feed-forward size: `intermediate_size`, else SwiGLU's 2/3 * 4h
    rounded up to `multiple_of` (with `ffn_dim_multiplier`), as LlamaFeedForward computes it."""
    size = getattr(config, "intermediate_size", None)
    if size:
        return int(size)
    multiple_of = int(getattr(config, "multiple_of", 256) or 256)
    dim = 4 * hidden
    multiplier = getattr(config, "ffn_dim_multiplier", None)
    if multiplier is not None:
        dim = int((multiplier + 0.01) * dim)
    dim = int(2 * dim / 3)
    return multiple_of * ((dim + multiple_of - 1) // multiple_of)


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and value > 0


def shape_of(config: Any) -> TransformerShape | None:
    """A MindFormers model config (LlamaConfig and the configs that share its keys) as a
    TransformerShape; None when it is not a transformer config."""
    get = lambda *keys: next((getattr(config, key) for key in keys if getattr(config, key, None)), None)  # noqa: E731
    layers, hidden, heads = (
        get("num_layers", "num_hidden_layers"),
        get("hidden_size"),
        get("num_heads", "num_attention_heads"),
    )
    vocab, seq = get("vocab_size"), get("seq_length", "max_position_embeddings")
    if not (_positive_int(layers) and _positive_int(hidden) and _positive_int(heads)):
        return None
    if not (_positive_int(vocab) and _positive_int(seq)):
        return None
    kv_heads = get("n_kv_heads", "num_key_value_heads") or heads
    moe = getattr(config, "moe_config", None)
    experts = int(getattr(moe, "expert_num", 0) or 0) if moe is not None else 0
    return TransformerShape(
        layers=layers, hidden=hidden, heads=heads, kv_heads=int(kv_heads), ffn=_llama_ffn(config, hidden),
        vocab=vocab, seq_length=seq,
        experts=experts if experts > 1 else 0,
        experts_per_token=int(getattr(moe, "num_experts_chosen", 1) or 1) if experts > 1 else 0,
        shared_experts=int(getattr(moe, "shared_expert_num", 0) or 0) if experts > 1 else 0,
    )  # fmt: skip


def _cells(network: Any, depth: int = 4) -> Iterator[Any]:
    """The network and the cells it wraps (TrainOneStepCell → WithLossCell → the model)."""
    seen: set[int] = set()
    frontier = [network]
    for _ in range(depth):
        next_frontier: list[Any] = []
        for cell in frontier:
            if cell is None or id(cell) in seen:
                continue
            seen.add(id(cell))
            yield cell
            next_frontier += mindspore_cell.own_cells(cell).values()
        frontier = next_frontier


def model_config(network: Any) -> Any:
    """The first cell's `config` under `network` that looks like a transformer's, or None."""
    for cell in _cells(network):
        config = getattr(cell, "config", None)
        if config is not None and shape_of(config) is not None:
            return config
    return None


def device_name(device_target: str | None) -> str | None:
    """The accelerator's model name from MindSpore's runtime (None on CPU or when unknown)."""
    if device_target not in ("Ascend", "GPU"):
        return None
    try:
        from mindspore import hal

        return str(hal.get_device_properties(int(os.environ.get("DEVICE_ID", "0") or 0), device_target).name)
    except Exception as exc:  # an old MindSpore or no device: MFU needs `peak_tflops` then
        _logger.debug("otel_mindformers: no device name for the peak-FLOPS table: %s", exc)
        return None


# --- ETA ------------------------------------------------------------------------------------


class Eta:
    """Seconds to the last step: remaining steps x an exponentially smoothed step time
    (window means, weighted by the window's steps, so one slow window moves it gradually)."""

    SMOOTHING = 0.3  # weight of a one-step window; a window of n steps weighs 1-(1-0.3)^n

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self._step_seconds: float | None = None
        self._first = True

    def update(self, step: int, steps: int, elapsed: float) -> float | None:
        """After a sampled window of `steps` steps lasting `elapsed` seconds ending at `step`.
        The first window (compilation, start-up) is not a step time: no ETA from it."""
        first, self._first = self._first, False
        if first or self.total_steps <= 0 or steps <= 0 or elapsed <= 0:
            return None
        mean = elapsed / steps
        if self._step_seconds is None:
            self._step_seconds = mean
        else:
            weight = 1.0 - (1.0 - self.SMOOTHING) ** steps
            self._step_seconds += weight * (mean - self._step_seconds)
        return max(0, self.total_steps - step) * self._step_seconds


# --- per sampled window -------------------------------------------------------------------------


class StepEfficiency:
    """Goodput, MFU, TFLOPS and ETA of a sampled window, for the keys `monitored` asks for
    (training thread; a few float operations)."""

    def __init__(
        self, monitored: list[str], config: Any, network: Any, total_steps: int, device_target: str | None
    ) -> None:
        """`network`: the cell a step runs, or the model's (its config gives FLOPs per token);
        `total_steps`: the job's last step this run runs to, 0 when unknown (no ETA)."""
        from otel_mindformers.names import training as tm

        self._goodput, self._eta_key = tm.GOODPUT in monitored, tm.ETA in monitored
        self._mfu, self._tflops = tm.MFU in monitored, tm.TFLOPS in monitored
        self._keys = tm
        # The model config gives FLOPs per token and, on every rank, the tokens per sample that
        # tokens per second and TFLOPS share: the one place `tokens_per_sample` defaults.
        wants_tokens = tm.TOKENS_PER_SECOND in config.monitored_metrics and not config.tokens_per_sample
        model = model_config(network) if (self._mfu or self._tflops or wants_tokens) else None
        shape = shape_of(model) if model is not None else None
        self.flops_per_token: float | None = config.flops_per_token or (
            shape.training_flops_per_token() if shape is not None else None
        )
        self.tokens_per_sample: int | None = config.tokens_per_sample or (shape.seq_length if shape else None)
        dtype = str(getattr(model, "compute_dtype", "")) if model is not None else None
        self.peak_tflops: float | None = config.peak_tflops or (
            peak_tflops(device_name(device_target), dtype) if (self._mfu and self.flops_per_token) else None
        )
        self._eta = Eta(total_steps)
        if list(monitored) != list(tm.KNOWN_METRICS):  # chosen by the user, not the default "all"
            self._say_what_is_missing(list(monitored), device_target)

    def _say_what_is_missing(self, chosen: list[str], device_target: str | None) -> None:
        """One warning at start when `monitored_metrics` names a figure this run cannot make,
        with the key that would give it: otherwise the figure is just absent from every output."""
        tm = self._keys
        needs: dict[str, list[str]] = {}
        if not self.tokens_per_sample:
            for key in (tm.TOKENS_PER_SECOND, tm.TFLOPS, tm.MFU):
                needs.setdefault(key, []).append("`tokens_per_sample` (no model config with a `seq_length` was found)")
        if not self.flops_per_token:
            for key in (tm.TFLOPS, tm.MFU):
                needs.setdefault(key, []).append("`flops_per_token` (no transformer model config was found)")
        elif not self.peak_tflops:
            device = device_name(device_target) or device_target or "unknown"
            needs.setdefault(tm.MFU, []).append(f"`peak_tflops` (the device's peak is not known: {device})")
        wanted = [key for key in chosen if key in needs]
        if wanted:
            keys = sorted({need for key in wanted for need in needs[key]})
            _logger.warning(
                "otel_mindformers: monitored_metrics asks for %s, which this run cannot report without %s in "
                "monitor_config (docs/time.md)", ", ".join(wanted), " and ".join(keys),
            )  # fmt: skip

    def add(
        self,
        values: dict,
        step: int,
        steps: int,
        elapsed: float,
        samples_per_second: float | None,
        goodput: Callable[[], float | None],
    ) -> None:
        tm = self._keys
        if self._goodput:
            fraction = goodput()
            if fraction is not None:
                values[tm.GOODPUT] = fraction
        if self._eta_key:
            eta = self._eta.update(step, steps, elapsed)
            if eta is not None:
                values[tm.ETA] = eta
        if samples_per_second and self.flops_per_token and self.tokens_per_sample:
            tflops = self.flops_per_token * self.tokens_per_sample * samples_per_second / 1e12
            if self._tflops:
                values[tm.TFLOPS] = tflops
            if self._mfu and self.peak_tflops:
                values[tm.MFU] = tflops / self.peak_tflops
