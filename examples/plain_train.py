"""A plain MindSpore training script: it knows nothing about monitoring.

Monitor it without changing a line (docs/zero_code.md):

    OTEL_SERVICE_NAME=plain-train opentelemetry-instrument python examples/plain_train.py

`--steps N` sets the number of steps (default 20).
"""

import argparse

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

FEATURES, BATCH = 8, 4


def dataset(steps: int) -> GeneratorDataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32) * 0.5
    return GeneratorDataset(list(zip(x, y)), column_names=["x", "y"], shuffle=False).batch(BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    model.train(1, dataset(args.steps), dataset_sink_mode=False)
    print("training finished")


if __name__ == "__main__":
    main()
