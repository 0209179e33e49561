"""Where ClusterD is, which job this is to it, and where this rank runs in its words.

The Ascend Operator puts three variables into every training container
(component/ascend-operator/pkg/controllers/v1/env.go): `MINDX_TASK_ID` (the job's id as
ClusterD knows it), `MINDX_SERVER_IP` (the clusterd-grpc-svc service's IP) and
`MINDX_SERVER_DOMAIN` (its DNS name); ClusterD's gRPC listens on port 8899
(component/clusterd/pkg/common/constant/constants.go `GrpcPort`). A public fault names the
Kubernetes node (`NODE_NAME`, which the downward API gives a pod from `spec.nodeName`) and the
NPUs' physical ids: inside the container, device `DEVICE_ID` is the DEVICE_ID-th of the
physical ids `ASCEND_VISIBLE_DEVICES` mounted ("0-3,6" style lists).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from otel_mindformers.config.checks import NODE_NAME, split_host_port
from otel_mindformers.config.schema import ClusterConfig

TASK_ID = "MINDX_TASK_ID"
SERVER_IP = "MINDX_SERVER_IP"
SERVER_DOMAIN = "MINDX_SERVER_DOMAIN"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    target: str | None  # host:port for grpc, None when nothing says where ClusterD is
    job_id: str | None  # MINDX_TASK_ID
    listen: bool  # this job hears ClusterD (on whichever rank holds the subscription)
    why_not: str | None  # why it does not, when it was asked to


def resolve(config: ClusterConfig, env: Mapping[str, str]) -> Endpoint:
    """ClusterD's address and the job id from the config and the Operator's variables."""
    job_id = env.get(TASK_ID) or None
    address = config.server or env.get(SERVER_IP) or env.get(SERVER_DOMAIN) or None
    target = None
    if address:
        host, port = split_host_port(address.strip())
        host = f"[{host}]" if ":" in host else host
        target = f"{host}:{port or config.port}"
    if config.listen is False:
        return Endpoint(target, job_id, False, None)
    if config.listen is None and not (env.get(TASK_ID) and env.get(SERVER_IP)):
        return Endpoint(target, job_id, False, None)  # not under the Ascend Operator: quietly off
    missing = [name for name, value in ((TASK_ID, job_id), ("cluster.server or " + SERVER_IP, target)) if not value]
    if missing:
        return Endpoint(target, job_id, False, f"{' and '.join(missing)} not set")
    return Endpoint(target, job_id, True, None)


def node_name(config: ClusterConfig, env: Mapping[str, str]) -> str | None:
    """The Kubernetes node this pod runs on, when known and a valid node name."""
    name = config.node_name or env.get("NODE_NAME") or env.get("K8S_NODE_NAME")
    return name if name and NODE_NAME.match(name) else None


def visible_devices(text: str) -> list[int]:
    """`0-3,6` -> [0, 1, 2, 3, 6]; what is not a list of ids (chip names, vNPUs) -> []."""
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            return []
        ids.extend(range(int(low), int(high) + 1) if dash else [int(low)])
    return sorted(set(ids))


def physical_device(device_id: int, env: Mapping[str, str]) -> int:
    """The physical NPU id of this rank's logical device (ClusterD's `deviceIds`)."""
    mounted = visible_devices(env.get("ASCEND_VISIBLE_DEVICES", ""))
    return mounted[device_id] if 0 <= device_id < len(mounted) else device_id


__all__ = ["Endpoint", "node_name", "physical_device", "resolve", "visible_devices"]
