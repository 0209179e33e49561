"""Who this process is in the job: rank, world, device, node and launcher.

Read from the launcher's environment (msrun, Slurm, Kubernetes/Volcano) and, when the
process has initialised communication, from `mindspore.communication`. Never initialises
anything itself: `init()` outside a launcher raises.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from dataclasses import dataclass
from typing import Mapping

from otel_mindformers import semconv

# uuid5 namespace for service.instance.id: stable per (job, host, rank), unlike the SDK's
# random default, so a restarted rank keeps its identity in the backend.
_INSTANCE_NAMESPACE = uuid.UUID("6f1b3c1e-3f0a-4d55-9a53-6d2f2a1c9b10")


@dataclass(frozen=True)
class Identity:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node_rank: int = 0
    device_id: int = 0
    device_target: str = "CPU"
    job_id: str | None = None
    launcher: str = "none"
    host_name: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def instance_id(self) -> str:
        key = f"{self.job_id or ''}/{self.host_name}/{self.rank}"
        return str(uuid.uuid5(_INSTANCE_NAMESPACE, key))

    def attributes(self) -> dict[str, str | int]:
        """Resource attributes (semconv keys)."""
        attrs: dict[str, str | int] = {
            semconv.ATTR_RANK: self.rank,
            semconv.ATTR_WORLD_SIZE: self.world_size,
            semconv.ATTR_LOCAL_RANK: self.local_rank,
            semconv.ATTR_NODE_RANK: self.node_rank,
            semconv.ATTR_DEVICE_ID: self.device_id,
            semconv.ATTR_DEVICE_TARGET: self.device_target,
            semconv.ATTR_LAUNCHER: self.launcher,
            "service.instance.id": self.instance_id,
            "host.name": self.host_name,
        }
        if self.job_id:
            attrs[semconv.ATTR_JOB_ID] = self.job_id
        return attrs

    def point_attributes(self) -> dict[str, int]:
        """Attributes put on every metric point, so per-rank series stay distinct after
        Prometheus translation (which moves resource attributes to target_info)."""
        return {semconv.ATTR_RANK: self.rank}


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


def _launcher(env: Mapping[str, str]) -> str:
    if "MS_WORKER_NUM" in env or "MS_ROLE" in env:
        return "msrun"
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "VC_TASK_INDEX" in env or "VOLCANO_JOB_NAME" in env:
        return "volcano"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "kubernetes"
    if "RANK_TABLE_FILE" in env or "RANK_ID" in env:
        return "rank_table"
    return "none"


def _job_id(env: Mapping[str, str]) -> str | None:
    for name in ("OTEL_MINDFORMERS_JOB_ID", "MS_JOB_ID", "SLURM_JOB_ID", "VOLCANO_JOB_NAME", "JOB_ID"):
        if env.get(name):
            return env[name]
    return None


def _communication_rank() -> tuple[int, int] | None:
    """Rank and group size from MindSpore, only if this process already initialised it."""
    communication = sys.modules.get("mindspore.communication.management")
    if communication is None:
        return None
    try:
        if not getattr(communication, "GlobalComm").INITED:
            return None
        return communication.get_rank(), communication.get_group_size()
    except Exception:  # an uninitialised or partial backend: fall back to the env
        return None


def _device_target(env: Mapping[str, str]) -> str:
    if "DEVICE_TARGET" in env:
        return env["DEVICE_TARGET"]
    context = sys.modules.get("mindspore")
    if context is not None:
        try:
            return str(context.get_context("device_target"))
        except Exception:
            pass
    return "CPU"


def detect_identity(env: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if env is None else env
    rank = _int(env, "RANK_ID", "SLURM_PROCID", "RANK", default=0)
    world = _int(env, "RANK_SIZE", "MS_WORKER_NUM", "SLURM_NTASKS", "WORLD_SIZE", default=1)
    from_ms = _communication_rank()
    if from_ms is not None:
        rank, world = from_ms
    device_id = _int(env, "DEVICE_ID", "SLURM_LOCALID", "LOCAL_RANK", default=0)
    local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID", "DEVICE_ID", default=0)
    node_rank = _int(env, "MS_NODE_ID", "SLURM_NODEID", "NODE_RANK", default=0)
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
    )
