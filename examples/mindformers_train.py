"""The article's launch code (section 2) with a real MindFormers Trainer: a tiny LLaMA.

    python examples/mindformers_train.py [config.yaml]      # default: mindformers_tiny_llama.yaml

One line is added to the article's code, `import otel_mindformers`: MindFormers then accepts
the article's `monitor_config` keys and its Trainer builds the monitoring pipeline from
them. Without that line, run the unmodified script under `opentelemetry-instrument`
(docs/zero_code.md). Two departures from the article, both MindFormers 1.9's API: the
Trainer takes the config as `args` (it has no `config=` keyword), and the tiny model has no
dataset files, so a synthetic token dataset is passed in.

On a CPU, MindFormers 1.9's loss-scale overflow check needs an Ascend-only operator; the
test suite's runner patches it: `python -m tests.support.mindformers_cpu examples/mindformers_train.py`.
"""

import sys
from pathlib import Path

import numpy as np
from mindformers import MindFormerConfig, Trainer
from mindspore.dataset import GeneratorDataset

import otel_mindformers  # noqa: F401  (the article's monitor_config in a MindFormers YAML)

HERE = Path(__file__).resolve().parent


def token_dataset(config: MindFormerConfig, steps: int = 4) -> GeneratorDataset:
    """`steps` batches of random token ids, one longer than seq_length (inputs + next-token labels)."""
    model = config.model.model_config
    batch_size = config.runner_config.batch_size
    rng = np.random.default_rng(0)
    rows = rng.integers(0, model.vocab_size, size=(steps * batch_size, model.seq_length + 1), dtype=np.int32)
    return GeneratorDataset([(row,) for row in rows], column_names=["input_ids"], shuffle=False).batch(batch_size)


def main(config_path: str) -> None:
    config = MindFormerConfig(config_path)
    # 读取monitor配置, 可代码动态覆写参数 (the article's lines)
    monitor_cfg = config.monitor_config
    if monitor_cfg.enable:
        print(
            f"训练监控已开启, 采集间隔 {monitor_cfg.interval} step (monitoring on, every {monitor_cfg.interval} steps)"
        )
    # monitor_cfg.grad_monitor = False

    trainer = Trainer(args=config, train_dataset=token_dataset(config))
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(HERE / "mindformers_tiny_llama.yaml"))
