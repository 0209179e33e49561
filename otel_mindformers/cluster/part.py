"""The run's MindCluster part (`monitor_config.cluster`, docs/mindcluster.md): what it starts
and stops. Started after the run span and the attempt (runtime/parts.py), on the training
thread; every thread it starts is its own and ends with it:

- the pre-flight check, first, when asked (it may keep the run from starting);
- the fault listener on rank `listen_rank` only: ClusterD keeps one subscription per job
  and role, so one rank holds it. If that rank dies the subscription ends with it (ClusterD
  drops the stream); what it heard is in its ledger, and the job's next attempt subscribes
  again;
- the public-fault teller on every rank with `tell` on, fed by the verdicts on the pipeline's
  worker (`on_record`) and by a stall watchdog (hangs/stall_watchdog.py) on the step clock;
- the watch of MindSpore's silent-data-corruption lines, where its detection is on or
  `asd_logs` names logs.

Nothing here runs on the training thread after the start: the step hook's cost is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry._logs import SeverityNumber

from otel_mindformers.cluster import asd, endpoint, preflight
from otel_mindformers.cluster.heard import HeardFaults
from otel_mindformers.cluster.listener import FaultListener
from otel_mindformers.cluster.teller import PublicFaultTeller, Where
from otel_mindformers.cluster.verdicts import OCCUR, RECOVER, SdcVerdict, SlowNodeVerdict
from otel_mindformers.config import MonitorConfig
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import Remaining, RunEnding, RunPart
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.hangs.stall_watchdog import StallWatchdog
from otel_mindformers.job.asd import asd_attributes
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import cluster_names as names
from otel_mindformers.telemetry.events import record_event
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

MAX_ASD_EVENTS = 100  # per kind and run: a storm of strikes is counted, not traced line by line


class ClusterPart(RunPart):
    def __init__(self) -> None:
        self.listener: FaultListener | None = None
        self.teller: PublicFaultTeller | None = None
        self.watcher: asd.AsdWatcher | None = None
        self._watchdog: StallWatchdog | None = None
        self._verdicts: list[tuple[str, Any]] = []

    @property
    def started(self) -> bool:
        return any((self.listener, self.teller, self.watcher))

    # --- pipeline worker -------------------------------------------------------------------
    def on_record(self, record: StepRecord) -> None:
        teller = self.teller
        if teller is None:
            return
        for verdict, judge in self._verdicts:
            transition = judge.feed(record)
            if transition is not None:
                teller.tell(verdict, transition, judge.detail if transition == OCCUR else "cleared", record.step)

    # --- end ---------------------------------------------------------------------------------
    def end(self, ending: RunEnding) -> None:
        """Before the attempt and the run span end: what is heard or read from here on would
        land on an ended span."""
        if self._watchdog is not None:
            self._watchdog.stop(min(1.0, ending.remaining()))
        if self.listener is not None:
            self.listener.stop(min(2.0, ending.remaining()))
        if self.watcher is not None:
            self.watcher.stop(min(2.0, ending.remaining()))  # its last read: lines written up to the end
        if self.teller is not None:
            # A completed run clears what it told; a crash or a stop leaves it for ClusterD.
            self.teller.close(ending.remaining(), recover_open=ending.outcome == "completed")

    def close(self, remaining: Remaining) -> None:
        """What `end` did not finish within its time (and all of it when the start failed)."""
        if self._watchdog is not None:
            self._watchdog.stop(min(1.0, remaining()))
        if self.teller is not None and self.teller.alive:
            self.teller.close(remaining(), recover_open=False)
        if self.listener is not None and self.listener.alive:
            self.listener.stop(remaining())
        if self.watcher is not None and self.watcher.alive:
            self.watcher.stop(remaining())


@dataclass(frozen=True)
class _RunHandles:
    """What the cluster's threads record through: the run's parts they use."""

    config: MonitorConfig
    identity: Identity
    telemetry: Any
    run_span: Any
    alerts: Any
    clock: StepClock

    def point_attributes(self) -> dict[str, Any]:
        return self.identity.point_attributes()


def start_cluster(
    monitor_config: MonitorConfig,
    identity: Identity,
    telemetry: Any,
    run_span: Any,
    attempt: Any,
    alerts: Any,
    clock: StepClock,
    env: Mapping[str, str] | None = None,
) -> RunPart | None:
    """cluster/: the pre-flight check, ClusterD heard and told, MindSpore's SDC lines; after
    the run span and the attempt (`attempt`: its AttemptTracker, or None), which hear of faults."""
    env = os.environ if env is None else env
    ctx = _RunHandles(monitor_config, identity, telemetry, run_span, alerts, clock)
    config = monitor_config.cluster
    points = ctx.point_attributes()
    if config.preflight:
        preflight.run_preflight(telemetry.tracer, run_span, points, identity.device_target)
    part = ClusterPart()
    where = endpoint.resolve(config, env)
    if where.why_not:
        _logger.warning("otel_mindformers: cluster.listen is on but ClusterD cannot be heard: %s", where.why_not)
    elif where.listen and identity.rank == config.listen_rank:
        assert where.target is not None and where.job_id is not None
        heard = HeardFaults(telemetry, run_span, attempt, points)
        part.listener = FaultListener(
            where.target, where.job_id, config.role, heard, timeout=config.timeout, retry_max=config.retry_max
        ).start()
    if config.tell:
        _start_teller(ctx, part, where, env)
    _start_watcher(ctx, part, env)
    return part if part.started else None


def _start_teller(ctx: _RunHandles, part: ClusterPart, where: endpoint.Endpoint, env: Mapping[str, str]) -> None:
    config, identity = ctx.config.cluster, ctx.identity
    node = endpoint.node_name(config, env)
    missing = [
        what
        for what, value in (
            ("ClusterD's address (cluster.server, or MINDX_SERVER_IP)", where.target),
            ("the Kubernetes node name (cluster.node_name, or NODE_NAME from the downward API's spec.nodeName)", node),
        )
        if not value
    ]
    if missing:
        _logger.warning("otel_mindformers: cluster.tell is on but nothing is told: it needs %s", " and ".join(missing))
        return
    assert where.target is not None and node is not None
    mounted = tuple(endpoint.visible_devices(env.get("ASCEND_VISIBLE_DEVICES", "")))
    part.teller = teller = PublicFaultTeller(
        where.target,
        config.resource,
        Where(
            job_id=where.job_id or identity.job_id or "",
            rank=identity.rank,
            node_name=node,
            device=endpoint.physical_device(identity.device_id, env),
            node_devices=mounted,
        ),
        {verdict: getattr(config.codes, verdict) for verdict in names.VERDICTS},
        min_interval=config.min_interval,
        timeout=config.timeout,
        retry_max=config.retry_max,
        telemetry=ctx.telemetry,
        run_span=ctx.run_span,
        point_attributes=ctx.point_attributes(),
    ).start()
    part._verdicts = [
        (names.VERDICT_SDC_SUSPECT, SdcVerdict(config.sdc_strikes, config.sdc_window, config.recover_after)),
        (
            names.VERDICT_SLOW_NODE,
            SlowNodeVerdict(ctx.config.stragglers.data_share, ctx.config.stragglers.windows, config.recover_after),
        ),
    ]
    stall_timeout = ctx.config.alert_config.stall_timeout
    if stall_timeout is not None:
        clock = ctx.clock

        def stalled(last_step: int, idle: float, threshold: int) -> None:
            if threshold == 1:
                detail = f"no step finished for {idle:.0f} s (stall_timeout {stall_timeout:g} s) after step {last_step}"
                teller.tell(names.VERDICT_STALLED_RANK, OCCUR, detail, last_step)

        def resumed(step: int) -> None:
            teller.tell(names.VERDICT_STALLED_RANK, RECOVER, f"step {step} finished", step)

        part._watchdog = StallWatchdog(clock, stall_timeout, stalled, resumed).start()


def _start_watcher(ctx: _RunHandles, part: ClusterPart, env: Mapping[str, str]) -> None:
    config, rank = ctx.config.cluster, ctx.identity.rank
    named = [Path(p.replace("{rank}", str(rank))).expanduser() for p in config.asd_logs]
    if not named and not asd_attributes(env)[names.ATTR_ASD_ENABLED]:
        return  # detection off, no log named: nothing will write such lines
    find = None
    paths = named
    if not paths:
        paths = asd.glog_files(env, rank, os.getpid())
        if not paths and env.get("GLOG_logtostderr", "1").strip() == "0":
            find = lambda: asd.glog_files(env, rank, os.getpid())  # noqa: E731  # glog makes the file at its first warning
        elif not paths:
            stderr = asd.stderr_file()
            paths = [stderr] if stderr is not None else []
    if not paths and find is None:
        _logger.warning(
            "otel_mindformers: MindSpore's silent-data-corruption detection is on, but its log is not a file "
            "this process can read (stderr is a terminal or a pipe): name it in cluster.asd_logs"
        )
        return
    recorder = _AsdRecorder(ctx)
    part.watcher = asd.AsdWatcher(paths, find, rank, recorder).start()


class _AsdRecorder:
    """A detection as telemetry (watcher thread): event, log record, counter; an alert from a
    strike-out on, through the alert engine when alerts are on."""

    def __init__(self, ctx: _RunHandles) -> None:
        self._span, self._logger, self._alerts = ctx.run_span, ctx.telemetry.logger, ctx.alerts
        self._points = ctx.point_attributes()
        self._counter = create_instrument(ctx.telemetry.meter, names.ASD_DETECTIONS)
        self._seen: dict[str, int] = {}

    def __call__(self, found: asd.Detection) -> None:
        self._counter.add(1, {**self._points, names.ATTR_ASD_KIND: found.kind})
        count = self._seen[found.kind] = self._seen.get(found.kind, 0) + 1
        if count > MAX_ASD_EVENTS:
            return
        message = f"MindSpore silent-data-corruption detection ({found.kind}) on rank {found.rank}: {found.line}"
        attributes = {**self._points, names.ATTR_ASD_KIND: found.kind, names.ATTR_ASD_RANK: found.rank}
        severity = SeverityNumber.ERROR if found.severity == "critical" else SeverityNumber.WARN
        record_event(self._span, self._logger, names.EVENT_ASD, message, attributes, severity)
        _logger.warning("otel_mindformers: %s", message)
        if found.alert and self._alerts is not None:
            self._alerts.raise_alert(names.ALERT_RULE_SDC, message, severity=found.severity)


__all__ = ["ClusterPart", "start_cluster"]
