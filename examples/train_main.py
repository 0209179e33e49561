"""The article's launch code (section 2), runnable on a CPU.

The article hands the whole YAML to MindFormers' Trainer; here a tiny causal language model
is trained with plain MindSpore so the demo needs no accelerator and no model download
(`examples/mindformers_train.py` runs the article's code through a real MindFormers Trainer,
with `examples/mindformers_tiny_llama.yaml`).
Monitoring is one callback built from `monitor_config`; the training code does not change.
"""

import os
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import yaml
from mindspore import nn, ops
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

from otel_mindformers import MonitorCallback, load_monitor_config

HERE = Path(__file__).resolve().parent


class TinyCausalLM(nn.Cell):
    """Embedding → a few GELU layers → next-token logits."""

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.body = nn.SequentialCell(
            [nn.SequentialCell(nn.Dense(hidden_size, hidden_size), nn.GELU()) for _ in range(num_layers)]
        )
        self.head = nn.Dense(hidden_size, vocab_size)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.vocab_size = vocab_size

    def construct(self, input_ids):
        tokens, labels = input_ids[:, :-1], input_ids[:, 1:]
        logits = self.head(self.body(self.embed(tokens)))
        return self.loss(logits.reshape((-1, self.vocab_size)), labels.reshape((-1,)))


class TrainOneStepWithNorm(nn.TrainOneStepCell):
    """Returns what MindFormers' MFTrainOneStepCell returns: (loss, overflow, scale, lr, global_norm)."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
        grads, global_norm = (
            ops.clip_by_global_norm(grads, 1.0),
            ops.sqrt(sum(ops.reduce_sum(ops.square(g)) for g in grads)),
        )
        overflow = ops.logical_not(ops.isfinite(global_norm))
        lr = self.optimizer.get_lr()
        loss = ops.depend(loss, self.optimizer(grads))
        return loss.reshape((1,)), overflow, ops.ones((), ms.float32), lr, global_norm.reshape((1,))


def token_dataset(vocab_size: int, seq_length: int, batch_size: int, steps: int) -> GeneratorDataset:
    """Sequences following t[i+1] = (3 t[i] + 1) mod vocab: learnable, so the loss falls."""
    rng = np.random.default_rng(0)
    starts = rng.integers(0, vocab_size, size=steps * batch_size)
    rows = np.empty((len(starts), seq_length + 1), dtype=np.int32)
    rows[:, 0] = starts
    for i in range(1, seq_length + 1):
        rows[:, i] = (3 * rows[:, i - 1] + 1) % vocab_size
    return GeneratorDataset([(row,) for row in rows], column_names=["input_ids"], shuffle=False).batch(batch_size)


def main() -> None:
    config_path = HERE / "train_config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    # 读取monitor配置, 可代码动态覆写参数 (the article's lines)
    monitor_cfg = load_monitor_config(config_path)
    if monitor_cfg.enable:
        print(
            f"训练监控已开启, 采集间隔 {monitor_cfg.interval} step (monitoring on, every {monitor_cfg.interval} steps)"
        )
    # monitor_cfg.grad_monitor = False

    runner, model_cfg, trainer = config["runner_config"], config["model"]["model_config"], config["trainer"]
    ms.set_context(mode=ms.GRAPH_MODE if runner["run_mode"] == "graph" else ms.PYNATIVE_MODE)
    ms.set_device(runner["device_target"])
    ms.set_seed(0)
    monitor_cfg.tokens_per_sample = model_cfg["seq_length"]

    net = TinyCausalLM(model_cfg["vocab_size"], model_cfg["hidden_size"], model_cfg["num_layers"])
    optimizer = nn.AdamWeightDecay(
        net.trainable_params(),
        learning_rate=nn.CosineDecayLR(
            0.0, float(trainer["learning_rate"]), trainer["epochs"] * trainer["steps_per_epoch"]
        ),
    )
    model = Model(TrainOneStepWithNorm(net, optimizer))
    dataset = token_dataset(
        model_cfg["vocab_size"], model_cfg["seq_length"], trainer["batch_size"], trainer["steps_per_epoch"]
    )
    model.train(trainer["epochs"], dataset, callbacks=[MonitorCallback(monitor_cfg)], dataset_sink_mode=False)

    print("\nMonitoring outputs:")
    if "json_file" in monitor_cfg.output_type:
        print(f"  JSON lines : {Path(monitor_cfg.json_log_path).resolve()}")
    if "tensorboard" in monitor_cfg.output_type:
        tensorboard = Path(monitor_cfg.tensorboard_path).resolve()
        if tensorboard.exists():
            print(f"  TensorBoard: {tensorboard}  (tensorboard --logdir ...)")
        else:  # tensorboardX is missing or broken: the output was off (the warning above says which)
            print("  TensorBoard: off, see the warning above")
    print("  Plot it    : otel-mindformers plot output/  (or python examples/analyze_loss.py)")


if __name__ == "__main__":
    os.makedirs("./output", exist_ok=True)
    sys.exit(main())
