"""The article's offline analysis script (section 5), unchanged in logic.

Reads the JSON log line by line and plots the loss curve to loss_curve.png. It works on the
current file of a rotated set, because rotation only ever happens between whole lines, and
on non-finite steps, which the log writes as `null` (a gap in the curve). For per-rank
files, rotated sets, killed runs and several runs at once, use `otel-mindformers plot`.
"""

import json

import matplotlib.pyplot as plt


def load_metric_log(log_path):
    steps = []
    loss_list = []
    with open(log_path, "r", encoding="utf-8") as f:
        for line in f:
            data = json.loads(line)
            steps.append(data["step"])
            loss_list.append(data["loss"])
    return steps, loss_list


if __name__ == "__main__":
    s, loss = load_metric_log("./output/train_metric.json")
    plt.plot(s, loss)
    plt.xlabel("step")
    plt.ylabel("train loss")
    plt.savefig("loss_curve.png")
