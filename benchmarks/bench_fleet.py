"""What a large job sends over OTLP, measured on simulated ranks and projected to 4,096.

    .venv/bin/python benchmarks/bench_fleet.py                     # 16 ranks, then a projection
    .venv/bin/python benchmarks/bench_fleet.py --ranks 32 --step-seconds 5 --interval 10
    .venv/bin/python benchmarks/bench_fleet.py --model-state-only        # model-state series count

1. Fleet: `--ranks` processes, each with RANK_ID / RANK_SIZE set as msrun sets them and the
   real pipeline (MonitorCallback, OTel SDK, OTLP/gRPC exporter, `device_monitor` on), are
   driven through MindSpore's RunContext with MindFormers-shaped step outputs (loss,
   overflow, scale, lr, global norm as tensors) on a compressed clock, exporting to one
   receiver that decodes everything and accounts for it per rank.
2. Ingest: the requests the fleet sent are replayed, pre-serialized, from several client
   threads as fast as the server takes them: into the Python receiver and into `rotel`
   (a Rust OTLP collector, with its blackhole exporter) when it is installed. CPU seconds
   of the server per MB and per data point give the collector cost.
3. Projection: per-rank bytes and data points per sampled step and per export, scaled to
   `--world` ranks at a real step time, interval and export interval, for each knob:
   `report_ranks`, `step_spans`, `otlp.temporality`.
4. Model state: the active series of MindFormers' training-state readings (docs/model_state.md)
   for a 70B-sized model on `--world` ranks, with and without `target` and `report_ranks: all`.
5. Stragglers: the per-rank section series (docs/stragglers.md) and the recording rules' series
   on `--world` ranks, by `stragglers.section_series` (`--stragglers-only` prints just these).
6. Rank export strategies (`export_ranks`, telemetry/export_ranks.py): spans and series per
   second reaching the collector from `--world` ranks for each strategy, from the measured
   per-rank rates split into what a strategy stops (step spans; the training metrics) and
   what every rank keeps sending (its hardware, straggler sections, heartbeat, job info).
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _receiver import ReceiverProcess  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
JOB_ID = "fleet-bench"
SPAN_SCHEDULE_SECONDS = 5.0  # BatchSpanProcessor's default delay: at most one span batch per 5 s


# --- one simulated rank ------------------------------------------------------------------


def rank_worker(
    rank: int, world: int, steps: int, interval: int, step_seconds: float, export_interval: float, endpoint: str
) -> None:
    os.environ.update(
        {"RANK_ID": str(rank), "RANK_SIZE": str(world), "DEVICE_ID": str(rank % 8), "OTEL_MINDFORMERS_JOB_ID": JOB_ID}
    )
    import mindspore as ms  # noqa: F401  (before the exporters import protobuf)
    import numpy as np
    from mindspore import nn
    from mindspore.dataset import NumpySlicesDataset
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    from otel_mindformers.runtime.callback import MonitorCallback

    callback = MonitorCallback(
        {
            "interval": interval,
            "output_type": ["otlp"],
            "device_monitor": True,
            "tokens_per_sample": 4096,
            "otlp": {"endpoint": endpoint, "export_interval": export_interval},
        }
    )
    net = nn.Dense(8, 1)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=1e-4, momentum=0.9)
    params = _InternalCallbackParam()
    params.update(
        batch_num=steps,
        epoch_num=1,
        cur_epoch_num=1,
        cur_step_num=0,
        optimizer=optimizer,
        train_network=nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer),
        train_dataset=NumpySlicesDataset({"x": np.zeros((32, 8), np.float32)}).batch(4),
    )
    scale = ms.Parameter(ms.Tensor(65536.0, ms.float32), name="loss_scale")
    rng = np.random.default_rng(rank)
    run_context = RunContext(params)
    callback.on_train_begin(run_context)
    callback.on_train_epoch_begin(run_context)
    for step in range(1, steps + 1):
        time.sleep(step_seconds)
        loss = 2.0 + 8.0 * math.exp(-step / 300) + 0.05 * rng.standard_normal()
        params.cur_step_num = step
        params.net_outputs = (
            ms.Tensor(np.array([loss], np.float32)),
            ms.Tensor(False),
            scale,
            ms.Tensor(np.float32(1e-4)),
            ms.Tensor(np.array([1.0 + 0.1 * rng.random()], np.float32)),
        )
        callback.on_train_step_end(run_context)
    callback.on_train_epoch_end(run_context)
    callback.on_train_end(run_context)


def sampled_steps(steps: int, interval: int) -> int:
    return len({1, steps} | set(range(interval, steps + 1, interval)))


def run_fleet(args: argparse.Namespace, receiver: ReceiverProcess) -> dict:
    started = time.monotonic()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank-worker",
                str(rank),
                str(args.world),
                str(args.sim_steps),
                str(args.interval),
                str(args.sim_step_seconds),
                str(args.sim_export_interval),
                receiver.grpc_endpoint,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"},
        )
        for rank in range(args.ranks)
    ]
    for worker in workers:
        _, stderr = worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{stderr[-3000:]}")
    stats = receiver.wait_quiet()
    stats["wall"] = time.monotonic() - started
    return stats


# --- ingest ------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay(records: list[tuple[str, bytes]], endpoint: str, pid: int, repeats: int, threads: int) -> dict:
    """Send the recorded requests `repeats` times from `threads` clients; the server's CPU."""
    import grpc

    channel = grpc.insecure_channel(endpoint.removeprefix("http://"))
    calls = {
        method: channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        for method in {m for m, _ in records}
    }
    work = [record for _ in range(repeats) for record in records]

    def send(part: list[tuple[str, bytes]]) -> None:
        for method, body in part:
            calls[method](body, timeout=60)

    cpu_before, wall_before = _cpu_seconds(pid), time.monotonic()
    clients = [threading.Thread(target=send, args=(work[i::threads],)) for i in range(threads)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    wall, cpu = time.monotonic() - wall_before, _cpu_seconds(pid) - cpu_before
    channel.close()
    return {"wall": wall, "cpu": cpu, "bytes": repeats * sum(len(body) for _, body in records)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rotel_replay(records: list, repeats: int, threads: int, folder: Path) -> dict | None:
    try:
        from rotel.agent import Agent
    except ImportError:
        return None
    port = _free_port()
    process = subprocess.Popen(
        [
            str(Agent.agent_path),
            "start",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{_free_port()}",
            "--exporter",
            "blackhole",
            "--pid-file",
            str(folder / "rotel.pid"),
            "--log-file",
            str(folder / "rotel.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        return replay(records, f"http://127.0.0.1:{port}", process.pid, repeats, threads)
    finally:
        process.terminate()
        process.wait(15)


# --- projection ----------------------------------------------------------------------------


def per_rank_rates(entry: dict, sim_sampled: int) -> dict:
    """Per-rank quantities that do not depend on the clock."""
    exports = max(1, entry["metric_exports"])
    step_spans = entry["span_names"].get("mindformers.train.step", 0)
    return {
        "span_bytes": entry["span_bytes"] / max(1, entry["spans"]),
        "span_envelope": entry["span_envelope_bytes"] / max(1, entry["span_batches"]),
        "step_spans_per_sampled_step": step_spans / sim_sampled,
        "metric_envelope": entry["metric_envelope_bytes"] / exports,
        # Cumulative temporality: each export carries every series once.
        "series": entry["series"],
        "bytes_per_point": {kind: entry["point_bytes"][kind] / entry["points"][kind] for kind in entry["points"]},
    }


def project(
    rates: dict, step_seconds: float, interval: int, export_interval: float, span_every: int, temporality: str
) -> dict[str, float]:
    """One rank's spans, data points and bytes per minute."""
    sampled_per_min = 60.0 / (step_seconds * interval)
    spans_per_min = sampled_per_min * rates["step_spans_per_sampled_step"] / span_every
    span_batches = min(spans_per_min, 60.0 / SPAN_SCHEDULE_SECONDS)
    exports_per_min = 60.0 / export_interval
    # Delta: counters and the histogram are sent only by exports after a sampled step.
    changed_exports = exports_per_min if temporality == "cumulative" else min(exports_per_min, sampled_per_min)
    points = bytes_ = 0.0
    for kind, series in rates["series"].items():
        per_min = series * (exports_per_min if kind == "gauge" else changed_exports)
        points += per_min
        bytes_ += per_min * rates["bytes_per_point"][kind]
    bytes_ += exports_per_min * rates["metric_envelope"]
    bytes_ += spans_per_min * rates["span_bytes"] + span_batches * rates["span_envelope"]
    return {"spans": spans_per_min, "points": points, "bytes": bytes_}


def main() -> None:
    if "--stragglers-only" in sys.argv:  # the series arithmetic alone, without the fleet
        print_straggler_projection(4096, 10.0, None)
        return
    if "--model-state-only" in sys.argv:  # the series arithmetic alone, without the fleet
        print_model_state_projection(4096, 10.0, None)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-worker":
        rank, world, steps, interval, step_seconds, export_interval, endpoint = sys.argv[2:]
        rank_worker(
            int(rank), int(world), int(steps), int(interval), float(step_seconds), float(export_interval), endpoint
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16, help="simulated rank processes")
    parser.add_argument("--world", type=int, default=4096, help="RANK_SIZE the ranks report, and the projection's size")
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=5.0, help="real step time for the projection")
    parser.add_argument("--export-interval", type=float, default=10.0, help="real export interval for the projection")
    parser.add_argument("--sim-steps", type=int, default=300)
    parser.add_argument("--sim-step-seconds", type=float, default=0.02)
    parser.add_argument("--sim-export-interval", type=float, default=1.0)
    parser.add_argument("--replay-repeats", type=int, default=20)
    parser.add_argument("--replay-threads", type=int, default=4)
    args = parser.parse_args()

    print(
        f"fleet: {args.ranks} rank processes (RANK_SIZE={args.world}), {args.sim_steps} steps every "
        f"{args.sim_step_seconds * 1e3:.0f} ms, interval {args.interval}, export every {args.sim_export_interval} s "
        f"(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)"
    )
    with ReceiverProcess(protobuf="python") as receiver, tempfile.TemporaryDirectory() as folder:
        stats = run_fleet(args, receiver)
        records_path = Path(folder) / "requests.pickle"
        receiver.dump(records_path)
        records = pickle.loads(records_path.read_bytes())
        fleet_cpu = stats["cpu_seconds"]
        python_ingest = replay(records, receiver.grpc_endpoint, receiver.pid, args.replay_repeats, args.replay_threads)
        rotel_ingest = rotel_replay(records, args.replay_repeats, args.replay_threads, Path(folder))

    sim_sampled = sampled_steps(args.sim_steps, args.interval)
    per_rank = stats["per_rank"]
    reporting, other = per_rank["0"], per_rank[str(min(1, args.ranks - 1))]
    raw = sum(len(body) for _, body in records)
    packed = sum(len(gzip.compress(body)) for _, body in records)
    print(
        f"\nreceived in {stats['wall']:.1f} s: {stats['requests']} requests, {stats['request_bytes'] / 1e6:.2f} MB, "
        f"receiver CPU {fleet_cpu:.1f} s; gzip (OTEL_EXPORTER_OTLP_COMPRESSION=gzip) sends {packed / raw:.0%} of the bytes"
    )
    print("\n| per rank | rank 0 (training metrics) | other ranks |")
    print("|---|---:|---:|")
    rows = {
        "series (gauge / sum / histogram)": lambda e: " / ".join(
            str(e["series"].get(k, 0)) for k in ("gauge", "sum", "histogram")
        ),
        "data points per export (cumulative)": lambda e: f"{sum(e['series'].values())}",
        "metric bytes per export": lambda e: (
            f"{(sum(e['point_bytes'].values()) + e['metric_envelope_bytes']) / max(1, e['metric_exports']):.0f}"
        ),
        "spans per sampled step": lambda e: f"{e['span_names'].get('mindformers.train.step', 0) / sim_sampled:.2f}",
        "bytes per step span (+ batch envelope)": lambda e: (
            f"{e['span_bytes'] / max(1, e['spans']):.0f} (+{e['span_envelope_bytes'] / max(1, e['span_batches']):.0f})"
        ),
    }
    for label, cell in rows.items():
        print(f"| {label} | {cell(reporting)} | {cell(other)} |")
    sampled_per_min = 60.0 / (args.step_seconds * args.interval)
    per_step = [
        project(per_rank_rates(e, sim_sampled), args.step_seconds, args.interval, args.export_interval, 1, "cumulative")
        for e in (reporting, other)
    ]
    print(
        f"| bytes per sampled step (step {args.step_seconds:g} s, export every {args.export_interval:g} s) | "
        + " | ".join(f"{p['bytes'] / sampled_per_min:,.0f}" for p in per_step)
        + " |"
    )
    print(
        "| data points per sampled step (same clock) | "
        + " | ".join(f"{p['points'] / sampled_per_min:,.1f}" for p in per_step)
        + " |"
    )

    def ingest_line(name: str, result: dict | None) -> None:
        if result is None:
            print(f"| {name} | not installed | | |")
            return
        mb = result["bytes"] / 1e6
        print(
            f"| {name} | {mb / result['wall']:.1f} MB/s | {result['cpu'] / mb:.3f} CPU-s per MB | "
            f"{len(records) * args.replay_repeats / result['wall']:.0f} requests/s |"
        )

    print(
        f"\ningest (replay of the fleet's {len(records)} requests x {args.replay_repeats}, "
        f"{args.replay_threads} client threads, uncompressed OTLP/gRPC)"
    )
    print("| server | replay rate (client-bound here) | server cost | requests/s |")
    print("|---|---:|---:|---:|")
    ingest_line("Python receiver (tests/support)", python_ingest)
    ingest_line("rotel collector, blackhole exporter", rotel_ingest)

    reporting_rates = per_rank_rates(reporting, sim_sampled)
    other_rates = per_rank_rates(other, sim_sampled)
    collector_cost = rotel_ingest or python_ingest
    cost_per_mb = collector_cost["cpu"] / (collector_cost["bytes"] / 1e6)
    print(
        f"\nprojection: {args.world} ranks, step {args.step_seconds:g} s, interval {args.interval}, "
        f"export every {args.export_interval:g} s; collector cost at "
        f"{'rotel' if rotel_ingest else 'the Python receiver'}'s {cost_per_mb:.3f} CPU-s per MB"
    )
    print("| knobs | spans/min | data points/min | MB/min | collector cores |")
    print("|---|---:|---:|---:|---:|")
    cases = [
        ("defaults: report_ranks [0], step_spans true, cumulative", [0], 1, "cumulative"),
        ("otlp.temporality: delta", [0], 1, "delta"),
        ("step_spans: 100 + delta", [0], 100 // args.interval, "delta"),
        ("report_ranks: all, cumulative (worst case)", "all", 1, "cumulative"),
        ("report_ranks: all + step_spans: 100 + delta", "all", 100 // args.interval, "delta"),
    ]
    for label, report_ranks, span_every, temporality in cases:
        reporters = args.world if report_ranks == "all" else len(report_ranks)
        total = {"spans": 0.0, "points": 0.0, "bytes": 0.0}
        for rates, count in ((reporting_rates, reporters), (other_rates, args.world - reporters)):
            one = project(rates, args.step_seconds, args.interval, args.export_interval, span_every, temporality)
            for key in total:
                total[key] += one[key] * count
        cores = total["bytes"] / 1e6 * cost_per_mb / 60.0
        print(
            f"| {label} | {total['spans']:,.0f} | {total['points']:,.0f} | {total['bytes'] / 1e6:,.1f} | {cores:.2f} |"
        )
    print_strategy_projection(reporting, other, sim_sampled, args, cost_per_mb)
    print_model_state_projection(args.world, args.export_interval, reporting_rates["bytes_per_point"].get("gauge"))
    print_straggler_projection(args.world, args.export_interval, reporting_rates["bytes_per_point"].get("sum"))


def training_metric_names() -> frozenset[str]:
    """What `export_ranks.metrics` stops on a rank it leaves out (pipeline.py, parts.py)."""
    from otel_mindformers.names import training as tm
    from otel_mindformers.names.phase_names import PHASE_DURATION

    return frozenset({spec.name for spec in tm.INSTRUMENTS} | {PHASE_DURATION.name})


def metric_split(entry: dict) -> dict[str, tuple[int, float]]:
    """One rank's (series, bytes per data point) of its training metrics and of the rest."""
    training = training_metric_names()
    out = {}
    for part, keep in (("training", lambda name: name in training), ("kept", lambda name: name not in training)):
        names = [name for name in entry["series_by_metric"] if keep(name)]
        points = sum(entry["metric_points"][name] for name in names)
        out[part] = (
            sum(entry["series_by_metric"][name] for name in names),
            sum(entry["metric_bytes"][name] for name in names) / points if points else 0.0,
        )
    return out


def strategy_cases(world: int) -> list[tuple[str, object]]:
    return [
        ("`all` (the default)", "all"),
        ("`report_ranks` (`[0]`)", "report_ranks"),
        (f"`first_per_node` ({RANKS_PER_NODE} ranks a node)", "first_per_node"),
        ("`0.125` (a sampled eighth)", 0.125),
        ("`0.01`", 0.01),
        ("a list: one rank per pipeline stage (8)", [stage * world // 8 for stage in range(8)]),
    ]


def print_strategy_projection(
    reporting: dict, other: dict, sim_sampled: int, args: argparse.Namespace, cost_per_mb: float
) -> None:
    """Spans and series per second at the collector, one row per strategy, the same one for
    `export_ranks.spans` and `.metrics`; `report_ranks: [0]` throughout."""
    from otel_mindformers.telemetry.export_ranks import selects

    world = args.world
    sampled_per_second = 1.0 / (args.step_seconds * args.interval)
    exports_per_second = 1.0 / args.export_interval
    step_span = reporting["span_names"].get("mindformers.train.step", 0) / sim_sampled  # per rank and sampled step
    roots = reporting["span_names"].get("mindformers.job.step", 0) / sim_sampled  # from the root rank
    span_bytes = reporting["span_bytes"] / max(1, reporting["spans"])
    span_envelope = reporting["span_envelope_bytes"] / max(1, reporting["span_batches"])
    metric_envelope = other["metric_envelope_bytes"] / max(1, other["metric_exports"])  # every rank, every export
    first, rest = metric_split(reporting), metric_split(other)
    print(
        f"\nexport strategies (`export_ranks.spans` = `.metrics`): {world} ranks, step {args.step_seconds:g} s, "
        f"interval {args.interval}, export every {args.export_interval:g} s, cumulative; per rank measured: "
        f"{step_span:.2f} step span and {roots:.2f} root span (root rank) per sampled step, "
        f"series training / kept: rank 0 {first['training'][0]} / {first['kept'][0]}, "
        f"other ranks {rest['training'][0]} / {rest['kept'][0]}"
    )
    print(
        "| strategy | ranks sending spans | spans/s | ranks sending training metrics | active series | "
        "series (data points)/s | MB/min | collector cores |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, strategy in strategy_cases(world):
        chosen = [rank for rank in range(world) if selects(strategy, [0], rank, rank % RANKS_PER_NODE)]
        spans = sampled_per_second * (len(chosen) * step_span + (roots if chosen else 0.0))
        series = first["kept"][0] + (world - 1) * rest["kept"][0]
        point_bytes = first["kept"][0] * first["kept"][1] + (world - 1) * rest["kept"][0] * rest["kept"][1]
        senders = set(chosen)
        if 0 in senders:
            series += first["training"][0]
            point_bytes += first["training"][0] * first["training"][1]
        others = len(senders - {0})
        series += others * rest["training"][0]
        point_bytes += others * rest["training"][0] * rest["training"][1]
        points_per_second = series * exports_per_second
        # A rank's spans leave in batches, at most one per schedule delay.
        batches = len(chosen) * min(sampled_per_second * step_span, 1.0 / SPAN_SCHEDULE_SECONDS)
        bytes_per_second = (
            points_per_second * point_bytes / max(series, 1)
            + world * exports_per_second * metric_envelope
            + spans * span_bytes
            + batches * span_envelope
        )
        mb_per_minute = bytes_per_second * 60 / 1e6
        cores = mb_per_minute * cost_per_mb / 60.0
        print(
            f"| {label} | {len(chosen):,} | {spans:,.2f} | {len(chosen):,} | {series:,} | {points_per_second:,.0f} | "
            f"{mb_per_minute:,.1f} | {cores:.3f} |"
        )


# A 70B LLaMA's model state (docs/model_state.md): 80 layers, ~720 parameters per rank.
MODEL_LAYERS = 80
MODEL_PARAMETERS = 720


def model_state_cases(world: int) -> list[tuple[str, int]]:
    """(case, active series in the whole job) with every model-state family lit."""
    from otel_mindformers.names import model_state as specs

    naive = len(specs.FAMILIES) * MODEL_PARAMETERS  # one series per parameter and family
    bounded = specs.series_per_rank(MODEL_LAYERS, selected_parameters=0)
    targeted = specs.series_per_rank(MODEL_LAYERS, selected_parameters=32)
    return [
        ("report_ranks [0], no target", bounded),
        ("report_ranks [0], target selecting 32 parameters", targeted),
        ("report_ranks: all, no target", bounded * world),
        ("report_ranks: all, target selecting 32 parameters", targeted * world),
        ("per-parameter series, report_ranks: all (what the bounds avoid)", naive * world),
    ]


def print_model_state_projection(world: int, export_interval: float, gauge_point_bytes: float | None) -> None:
    """Series count (and, with a measured bytes-per-gauge-point, OTLP MB/min) of the model state."""
    print(
        f"\nmodel state: {MODEL_LAYERS}-layer model, {MODEL_PARAMETERS} parameters per rank, {world} ranks, "
        f"export every {export_interval:g} s"
    )
    print("| case | active series | MB/min |")
    print("|---|---:|---:|")
    for label, series in model_state_cases(world):
        mb = f"{series * 60.0 / export_interval * gauge_point_bytes / 1e6:,.1f}" if gauge_point_bytes else "n/a"
        print(f"| {label} | {series:,} | {mb} |")


RANKS_PER_NODE = 8
# Sections a rank usually has: data_wait and in_step every window; checkpoint, evaluation and
# other only in the windows that hold one (cumulative series stay once they exist).
USUAL_SECTIONS, ALL_SECTIONS = 2, 5


def straggler_cases(world: int) -> list[tuple[str, int, int]]:
    """(case, exported series, recorded series) in the whole job for the section series."""
    nodes = max(1, world // RANKS_PER_NODE)
    # Per rank: a series per section, the section steps; signals only on a rank that raised one.
    recorded = lambda sections: world * sections * 2 + sections + world * 2  # noqa: E731
    return [
        ("section_series: rank, data_wait and in_step", world * (USUAL_SECTIONS + 1), recorded(USUAL_SECTIONS)),
        ("section_series: rank, every section", world * (ALL_SECTIONS + 1), recorded(ALL_SECTIONS)),
        (
            f"section_series: node ({RANKS_PER_NODE} ranks a node), once the backend drops the instance",
            nodes * (ALL_SECTIONS + 1),
            nodes * ALL_SECTIONS * 2 + ALL_SECTIONS + nodes * 2,
        ),
        ("section_series: off (JSON lines and the in-process signal only)", 0, 0),
    ]


def print_straggler_projection(world: int, export_interval: float, sum_point_bytes: float | None) -> None:
    """Series the section times add (and, with a measured bytes-per-sum-point, OTLP MB/min)."""
    print(f"\nstragglers: {world} ranks, export every {export_interval:g} s (docs/stragglers.md)")
    print("| case | exported series | recorded series (rules) | MB/min |")
    print("|---|---:|---:|---:|")
    for label, series, recorded in straggler_cases(world):
        mb = f"{series * 60.0 / export_interval * sum_point_bytes / 1e6:,.2f}" if sum_point_bytes else "n/a"
        print(f"| {label} | {series:,} | {recorded:,} | {mb} |")


if __name__ == "__main__":
    main()
