"""Who this process is in the job: rank, world, device, node and launcher; `job_attributes`
adds what the job is (layout.py, versions.py).

Read from the launcher's environment (msrun, MindCluster, Slurm, Kubernetes/Volcano) and,
when the process has initialised communication, from `mindspore.communication`. Never
initialises anything itself: `init()` outside a launcher raises.

msrun's `MS_NODE_ID` is the worker's id in the cluster (its rank when msrun assigns ranks),
not the machine's index: the node rank comes only from variables that mean it.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from otel_mindformers.config.checks import job_id_problem
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.job.asd import asd_attributes
from otel_mindformers.job.layout import layout_attributes
from otel_mindformers.job.versions import software_versions
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv

_logger = get_logger(__name__)

# uuid5 namespace for service.instance.id: stable per (job, host, rank), unlike the SDK's
# random default, so a restarted rank keeps its identity in the backend.
_INSTANCE_NAMESPACE = uuid.UUID("6f1b3c1e-3f0a-4d55-9a53-6d2f2a1c9b10")

# Where launchers put the global rank. msrun leaves RANK_ID unset when it cannot assign
# ranks up front (several nodes without --node_rank): the rank is then known only after
# `init()`.
RANK_VARIABLES = ("RANK_ID", "SLURM_PROCID", "RANK")

# Kubernetes resource attributes (OTel semantic conventions) from the variables the
# downward API and Kubernetes itself (HOSTNAME is the pod name) set. The collector's
# k8sattributes processor joins on k8s.pod.uid / k8s.pod.ip to add the job, deployment
# and node labels from the API server.
_KUBERNETES_ATTRIBUTES = (
    ("k8s.pod.name", ("POD_NAME", "K8S_POD_NAME", "HOSTNAME")),
    ("k8s.pod.uid", ("POD_UID", "K8S_POD_UID")),
    ("k8s.pod.ip", ("POD_IP", "K8S_POD_IP")),
    ("k8s.namespace.name", ("POD_NAMESPACE", "K8S_NAMESPACE")),
    ("k8s.node.name", ("NODE_NAME", "K8S_NODE_NAME")),
)


def job_attributes(env: Mapping[str, str]) -> dict[str, str | int]:
    """The parallel layout, the software versions (each only where known) and whether
    MindSpore's silent-data-corruption detection is on. Cheap: a few small file reads."""
    return {**layout_attributes(), **software_versions(env), **asd_attributes(env)}


@dataclass(frozen=True)
class Identity:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node_rank: int | None = None  # None: the launcher does not say which machine this is
    device_id: int = 0
    device_target: str | None = "CPU"  # None: read before MindSpore was imported
    job_id: str | None = None
    attempt: int | None = None  # the job's attempt this process is (restarts/attempt_tracker.py)
    attempt_id: str | None = None
    launcher: str = "none"
    host_name: str = ""
    kubernetes: tuple[tuple[str, str], ...] = ()  # k8s.* resource attributes
    job: tuple[tuple[str, str | int], ...] = ()  # parallel layout and software versions
    # Where the process started: on one host, it tells apart jobs that no launcher names
    # (a job restarted from its folder keeps it).
    workdir: str = ""
    # job_id is the job ledger's own (read at run start, restarts/attempt_tracker.py), not a launcher's or
    # monitor_config.job_id: service.instance.id stays the one derived from workdir, which a
    # resource built at process start (opentelemetry-instrument) already carries.
    job_id_from_ledger: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def node_port(self, port: int) -> int:
        """The port this rank listens on for a server every rank starts on `port` (a
        Prometheus scrape endpoint): ranks sharing a node cannot share one, so with several
        ranks, local rank r takes `port + r`. A process alone keeps `port`; 0 stays "any"."""
        return port + self.local_rank if port and self.distributed else port

    @property
    def instance_id(self) -> str:
        job = self.workdir if self.job_id_from_ledger else self.job_id or self.workdir
        key = f"{job}/{self.host_name}/{self.rank}"
        return str(uuid.uuid5(_INSTANCE_NAMESPACE, key))

    def attributes(self) -> dict[str, str | int]:
        """Resource attributes (semconv keys)."""
        attrs: dict[str, str | int] = {
            semconv.ATTR_RANK: self.rank,
            semconv.ATTR_WORLD_SIZE: self.world_size,
            semconv.ATTR_LOCAL_RANK: self.local_rank,
            semconv.ATTR_DEVICE_ID: self.device_id,
            semconv.ATTR_LAUNCHER: self.launcher,
            "service.instance.id": self.instance_id,
            "host.name": self.host_name,
        }
        if self.device_target is not None:
            attrs[semconv.ATTR_DEVICE_TARGET] = self.device_target
        if self.node_rank is not None:
            attrs[semconv.ATTR_NODE_RANK] = self.node_rank
        if self.job_id:
            attrs[semconv.ATTR_JOB_ID] = self.job_id
        if self.attempt is not None:
            attrs[job_names.ATTR_ATTEMPT] = self.attempt
        if self.attempt_id:
            attrs[job_names.ATTR_ATTEMPT_ID] = self.attempt_id
        attrs.update(self.kubernetes)
        attrs.update(self.job)
        return attrs

    def node_attributes(self) -> dict[str, str | int]:
        """Attributes naming this machine on node-level series: its node rank when the
        launcher gives one (msrun does not), else its host name."""
        if self.node_rank is not None:
            return {semconv.ATTR_NODE_RANK: self.node_rank}
        return {"host.name": self.host_name}

    def point_attributes(self) -> dict[str, int]:
        """Attributes put on every metric point, so per-rank series stay distinct after
        Prometheus translation (which moves resource attributes to target_info)."""
        return {semconv.ATTR_RANK: self.rank}


@overload
def _int(env: Mapping[str, str], *names: str, default: int) -> int: ...
@overload
def _int(env: Mapping[str, str], *names: str, default: None = None) -> int | None: ...
def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


def _launcher(env: Mapping[str, str]) -> str:
    if "MINDX_TASK_ID" in env:
        return "mindcluster"
    if "MS_WORKER_NUM" in env or "MS_ROLE" in env:
        return "msrun"
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchelastic"
    if "VC_TASK_INDEX" in env or "VOLCANO_JOB_NAME" in env:
        return "volcano"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "kubernetes"
    if "RANK_TABLE_FILE" in env or "RANK_ID" in env:
        return "rank_table"
    return "none"


def _job_id(env: Mapping[str, str]) -> str | None:
    for name in (
        "OTEL_MINDFORMERS_JOB_ID",
        "MS_JOB_ID",
        "MINDX_TASK_ID",
        "SLURM_JOB_ID",
        "TORCHELASTIC_RUN_ID",
        "VOLCANO_JOB_NAME",
        "JOB_ID",
    ):
        value = env.get(name)
        if not value:
            continue
        problem = job_id_problem(value)
        if problem is None:
            return value
        if name not in _refused_variables:  # said once per process, then the next variable
            _refused_variables.add(name)
            _logger.warning("otel_mindformers: ignoring %s as the job id: %s", name, problem)
    return None


_refused_variables: set[str] = set()


# The launcher's restart counter, where it keeps one (0 on the first run): torchrun's, and
# Slurm's for a requeued job (unset on the first run). msrun never restarts its workers;
# MindCluster's `version` pod label reaches a process only through the downward API, which
# a job spec may map to OTEL_MINDFORMERS_ATTEMPT.
_RESTART_VARIABLES = ("OTEL_MINDFORMERS_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def launcher_restart_count(env: Mapping[str, str] | None = None) -> int | None:
    """How many times the launcher restarted this job before this process, where it says."""
    env = os.environ if env is None else env
    return _int(env, *_RESTART_VARIABLES)


def _communication_rank() -> tuple[int, int] | None:
    """Rank and group size from MindSpore, only if this process already initialised it."""
    communication = sys.modules.get("mindspore.communication.management")
    if communication is None:
        return None
    try:
        if not communication.GlobalComm.INITED:
            return None
        return communication.get_rank(), communication.get_group_size()
    except Exception:  # an uninitialised or partial backend: fall back to the env
        return None


def _device_target(env: Mapping[str, str]) -> str | None:
    if "DEVICE_TARGET" in env:
        return env["DEVICE_TARGET"]
    context = sys.modules.get("mindspore")
    if context is None:
        return None  # the script has not chosen its device yet (e.g. at SDK start-up)
    try:
        return str(context.get_context("device_target"))
    except Exception:
        return "CPU"


def _kubernetes(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if "KUBERNETES_SERVICE_HOST" not in env:
        return ()
    found = []
    for attribute, names in _KUBERNETES_ATTRIBUTES:
        value = next((env[name] for name in names if env.get(name)), None)
        if value is not None:
            found.append((attribute, value))
    return tuple(found)


def runs_no_training(env: Mapping[str, str] | None = None) -> bool:
    """msrun's launcher and its scheduler (`MS_ROLE=MS_SCHED`), which `opentelemetry-instrument
    msrun` starts with the workers' environment: they coordinate the workers and never train."""
    env = os.environ if env is None else env
    launcher = os.path.basename(sys.argv[0]) if sys.argv else ""
    return env.get("MS_ROLE") == "MS_SCHED" or launcher == "msrun"


def rank_in_environment(env: Mapping[str, str] | None = None) -> bool:
    """True when the launcher told this process its rank before communication is set up."""
    env = os.environ if env is None else env
    return _int(env, *RANK_VARIABLES) is not None


def detect_identity(env: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if env is None else env
    rank = _int(env, *RANK_VARIABLES, default=0)
    world = _int(env, "RANK_SIZE", "MS_WORKER_NUM", "SLURM_NTASKS", "WORLD_SIZE", default=1)
    from_ms = _communication_rank()
    if from_ms is not None:
        rank, world = from_ms
    device_id = _int(env, "DEVICE_ID", "SLURM_LOCALID", "LOCAL_RANK", default=0)
    local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID", "DEVICE_ID", default=0)
    node_rank = _int(env, "MS_NODE_RANK", "SLURM_NODEID", "NODE_RANK")
    return Identity(
        rank=rank,
        world_size=max(world, rank + 1),
        local_rank=local_rank,
        node_rank=node_rank,
        device_id=device_id,
        device_target=_device_target(env),
        job_id=_job_id(env),
        launcher=_launcher(env),
        host_name=socket.gethostname(),
        kubernetes=_kubernetes(env),
        job=tuple(job_attributes(env).items()),
        workdir=os.getcwd(),
    )
