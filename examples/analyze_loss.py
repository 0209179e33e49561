"""The article's offline analysis script (section 5), with one line added.

Reads the JSON log line by line and plots the loss curve to loss_curve.png. The file holds
one run (a new run sets the previous one's file aside as `train_metric.<when>.json`; a
resumed run writes on after it), so the steps only go forward. The added line skips what
the article's custom monitor appends to the same file (its lines carry no "rank"), which
would otherwise be a second curve zig-zagging with ours. It works on the current file of a
rotated set, because rotation only happens between whole lines, and on non-finite steps,
which the log writes as `null` (a gap in the curve). For per-rank files, rotated sets,
killed runs and several runs at once, use `otel-mindformers plot`.
"""

import json

import matplotlib.pyplot as plt


def load_metric_log(log_path):
    steps = []
    loss_list = []
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            data = json.loads(line)
            if "rank" not in data:  # the custom monitor's own line
                continue
            steps.append(data["step"])
            loss_list.append(data["loss"])
    return steps, loss_list


if __name__ == "__main__":
    s, loss = load_metric_log("./output/train_metric.json")
    plt.plot(s, loss)
    plt.xlabel("step")
    plt.ylabel("train loss")
    plt.savefig("loss_curve.png")
