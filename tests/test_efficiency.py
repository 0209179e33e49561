"""MFU and achieved TFLOPS: the FLOPs formula, the peak table, and the real MindFormers tiny
LLaMA on the CPU with a `peak_tflops` override, checked against a hand calculation."""

from __future__ import annotations

import pytest
import yaml

from otel_mindformers.names import training as tm
from otel_mindformers.timing.efficiency import Eta, TransformerShape, peak_tflops
from tests.support.instrumented import child_env, run
from tests.support.jsonl import json_lines
from tests.support.mindformers_trainer import CPU_RUNNER, write_trainer
from tests.support.paths import REFERENCE_YAML

pytestmark = pytest.mark.mindspore_api

PEAK = 0.002  # TFLOPS: a CPU-sized "peak", so the MFU is a readable number


def test_dense_formula_is_6n_plus_12lhs():
    # A GPT-style shape: n = k heads, a plain 4h MLP. Without the output layer the formula is
    # PaLM's 6 N + 12 L h s with N = 12 L h^2.
    layers, hidden, seq, vocab = 4, 256, 512, 1000
    shape = TransformerShape(
        layers=layers, hidden=hidden, heads=8, kv_heads=8, ffn=4 * hidden, vocab=vocab, seq_length=seq, swiglu=False
    )
    output_layer = 6 * hidden * vocab
    assert shape.training_flops_per_token() - output_layer == 6 * 12 * layers * hidden**2 + 12 * layers * hidden * seq


def test_grouped_query_attention_counts_the_kv_heads_it_has():
    """LLaMA-2 70B: 64 query heads share 8 key/value heads. Its matrices per layer are q and o
    (h x h), k and v (h x kv_heads * head_dim) and SwiGLU's three (h x ffn): the FLOPs are
    6 x those parameters per token plus attention, and the matrices sum to its 69 B."""
    import types

    from otel_mindformers.timing.efficiency import shape_of

    config = types.SimpleNamespace(
        num_layers=80, hidden_size=8192, num_heads=64, n_kv_heads=8, intermediate_size=28672,
        vocab_size=32000, seq_length=4096,
    )  # fmt: skip
    shape = shape_of(config)
    assert shape.kv_heads == 8
    h, head, layers = 8192, 8192 // 64, 80
    per_layer = 2 * h * h + 2 * h * 8 * head + 3 * h * 28672
    assert layers * per_layer + h * 32000 == pytest.approx(68.98e9, rel=0.005)
    expected = 3 * (layers * (2 * per_layer + 4 * 4096 * h) + 2 * h * 32000)
    assert shape.training_flops_per_token() == expected


def test_moe_counts_active_experts_only():
    dense = TransformerShape(layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=100, seq_length=32)
    moe = TransformerShape(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=4,
        ffn=128,
        vocab=100,
        seq_length=32,
        experts=8,
        experts_per_token=2,
        shared_experts=1,
    )
    one_ffn = 3 * 2 * 3 * 64 * 128  # training x (2 FLOPs x 3 SwiGLU matrices x h x f)
    router = 3 * 2 * 64 * 8
    assert moe.training_flops_per_token() - dense.training_flops_per_token() == 2 * (2 * one_ffn + router)


def test_peak_table_matches_driver_names():
    assert peak_tflops("Ascend910B3", "bfloat16") == 313.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float16") == 312.0
    assert peak_tflops("NVIDIA H100 PCIe", None) == 756.0  # the longest name wins over "H100"
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 19.5
    assert peak_tflops("Ascend910B3", "float32") is None  # not in the table: MFU needs peak_tflops
    assert peak_tflops("Some CPU", "float16") is None


def test_eta_skips_the_compile_window_and_smooths():
    eta = Eta(total_steps=100)
    assert eta.update(1, 1, 30.0) is None  # the first window: compilation, not a step time
    assert eta.update(11, 10, 10.0) == pytest.approx(89 * 1.0)
    assert eta.update(21, 10, 20.0) == pytest.approx(79 * (1 + (1 - 0.7**10) * 1.0))


@pytest.mark.mindformers
@pytest.mark.slow
def test_tiny_llama_mfu_and_tflops_match_a_hand_calculation(workdir):
    config = yaml.safe_load(REFERENCE_YAML.read_text())
    for callback in config["callbacks"]:
        if callback["type"] == "OtelCallback":
            callback["peak_tflops"] = PEAK
    run([*CPU_RUNNER, write_trainer(workdir, yaml.safe_dump(config), rows=6)], child_env(), workdir)

    # By hand, for the YAML's LLaMA: L=2 layers, h=32, 2 heads (= KV heads), SwiGLU f=64,
    # V=64, s=16. Per token, forward: per layer QKV 2*32*96 + output 2*32*32 + FFN 2*3*32*64
    # + attention 4*16*32 = 22528, times 2 layers, plus the output layer 2*32*64 = 49152;
    # training is 3x that.
    flops_per_token = 3 * (2 * (2 * 32 * 96 + 2 * 32 * 32 + 2 * 3 * 32 * 64 + 4 * 16 * 32) + 2 * 32 * 64)
    assert flops_per_token == 147456
    lines = json_lines(workdir / "output" / "train_metric.json")
    assert lines
    for line in lines:
        tokens_per_second = line["samples_per_second"] * 16
        # tokens per second from the model's seq_length, the same figure TFLOPS is made of
        assert line[tm.TOKENS_PER_SECOND] == pytest.approx(tokens_per_second, rel=1e-9)
        assert line[tm.TFLOPS] == pytest.approx(flops_per_token * tokens_per_second / 1e12, rel=1e-9)
        assert line[tm.MFU] == pytest.approx(line[tm.TFLOPS] / PEAK, rel=1e-9)


@pytest.mark.slow
def test_model_train_with_a_transformer_config_reports_tokens_per_second_from_its_seq_length(workdir):
    """`tokens_per_sample` defaults to the model config's `seq_length` in one place, for
    tokens per second as for TFLOPS, whatever the path (here plain `Model.train`)."""
    from types import SimpleNamespace

    from otel_mindformers import MonitorCallback
    from tests.support import training

    llama = SimpleNamespace(num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, seq_length=16)
    callback = MonitorCallback(
        {
            "interval": 5,
            "output_type": ["json_file"],
            "monitored_metrics": ["loss", "samples_per_second", "tokens_per_second"],
        }
    )
    training.train([callback], steps=10, model_config=llama)
    lines = json_lines(workdir / "output" / "train_metric.json")
    assert lines
    for line in lines:
        assert line[tm.TOKENS_PER_SECOND] == pytest.approx(line[tm.SAMPLES_PER_SECOND] * 16, rel=1e-9)


def _missing_notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cannot report without" in r.getMessage()]


@pytest.mark.slow
def test_a_chosen_figure_the_run_cannot_make_is_said_once_with_the_key_that_gives_it(workdir, caplog):
    """`monitored_metrics` that names MFU or tokens per second where nothing gives their inputs
    (no model config, no peak for the CPU): one warning naming the keys, before training, not
    an absent series found later. The default list (all figures) says nothing."""
    from types import SimpleNamespace

    from otel_mindformers import MonitorCallback
    from tests.support import training

    chosen = {"interval": 5, "output_type": ["json_file"], "monitored_metrics": ["loss", "mfu", "tokens_per_second"]}
    training.train([MonitorCallback(chosen)], steps=10)
    (notice,) = _missing_notices(caplog)
    assert "mfu, tokens_per_second" in notice
    assert "`tokens_per_sample`" in notice and "`flops_per_token`" in notice and "`peak_tflops`" not in notice
    assert not any(
        tm.MFU in line or tm.TOKENS_PER_SECOND in line for line in json_lines(workdir / "output" / "train_metric.json")
    )

    # With a model config, FLOPs and tokens are known: only the CPU's peak is missing.
    caplog.clear()
    llama = SimpleNamespace(num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, seq_length=16)
    training.train(
        [MonitorCallback({**chosen, "json_log_path": str(workdir / "second.json")})], steps=10, model_config=llama
    )
    (notice,) = _missing_notices(caplog)
    assert "asks for mfu," in notice and "`peak_tflops` (the device's peak is not known: CPU)" in notice
    assert "`flops_per_token`" not in notice and "`tokens_per_sample`" not in notice

    caplog.clear()
    training.train([MonitorCallback({"interval": 5, "json_log_path": str(workdir / "third.json")})], steps=10)
    assert _missing_notices(caplog) == []


@pytest.mark.parametrize(
    ("chosen", "given", "named", "unnamed"),
    [
        # TFLOPS needs the FLOPs per token as well as the tokens.
        (["tflops"], {"tokens_per_sample": 16}, "`flops_per_token`", "`tokens_per_sample`"),
        # MFU needs the tokens per sample as well as the FLOPs and the peak.
        (["mfu"], {"flops_per_token": 1.0e6, "peak_tflops": 100.0}, "`tokens_per_sample`", "`flops_per_token`"),
    ],
)
def test_each_figure_names_every_input_it_lacks(caplog, chosen, given, named, unnamed):
    from otel_mindformers import load_monitor_config
    from otel_mindformers.timing.efficiency import StepEfficiency

    config = load_monitor_config({"monitored_metrics": chosen, **given})
    StepEfficiency(chosen, config, None, 0, "CPU")
    (notice,) = _missing_notices(caplog)
    assert f"asks for {chosen[0]}, " in notice and named in notice and unnamed not in notice
