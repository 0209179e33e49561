"""Which ranks send their step spans and their training metrics (`monitor_config.export_ranks`).

A large job need not ship every rank's copy of the same step: each rank decides alone, from
its rank, its local rank and the configuration, whether it sends its step spans (`spans`)
and its training metrics (`metrics`). The strategies:

- `all`: every rank (the default);
- `report_ranks`: the ranks `report_ranks` names (the ranks that read training values back);
- `first_per_node`: the first rank of each node (local rank 0);
- a fraction `0 < f < 1`: the ranks whose hash of the rank number falls below f, about f of
  them, spread over the job, the same ranks in every attempt (their series go on across
  restarts) and a superset of those a smaller fraction picks;
- a list of ranks.

What every rank keeps sending whatever the strategy, because the job's view needs each
rank: its run span, its anomalous steps' spans (an alert or a non-finite value starts the
span on any rank), its device and host readings, its straggler sections and signals, its
heartbeat, `mindformers.job.info` and its alert counters.

The job step's root span (`mindformers.job.step`, telemetry/step_ids.py) is emitted by the
lowest rank that sends its step spans, which every rank can name without asking the others
(for `first_per_node`, rank 0: launchers number a node's ranks from its first).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from otel_mindformers.config import MonitorConfig
from otel_mindformers.job.identity import Identity

ALL, REPORT_RANKS, FIRST_PER_NODE = "all", "report_ranks", "first_per_node"
Strategy = str | list[int] | float


def rank_share(rank: int) -> float:
    """Where `rank` falls in [0, 1): a hash of the rank number alone, so the same ranks are
    sampled in every attempt and process."""
    digest = hashlib.blake2b(rank.to_bytes(8, "big"), digest_size=8, person=b"mf-export-rank").digest()
    return int.from_bytes(digest, "big") / 2**64


def selects(strategy: Strategy, report_ranks: str | list[int], rank: int, local_rank: int) -> bool:
    """Whether `strategy` has the rank `rank` (local rank `local_rank`) send."""
    if isinstance(strategy, float):
        return rank_share(rank) < strategy
    if isinstance(strategy, list):
        return rank in strategy
    if strategy == REPORT_RANKS:
        return report_ranks == ALL or rank in report_ranks
    if strategy == FIRST_PER_NODE:
        return local_rank == 0
    return True  # all


def first_rank(strategy: Strategy, report_ranks: str | list[int], world_size: int) -> int | None:
    """The lowest rank `strategy` has send in a job of `world_size` ranks (None: none)."""
    if isinstance(strategy, list):
        return min((r for r in strategy if r < world_size), default=None)
    if strategy == REPORT_RANKS and isinstance(report_ranks, list):
        return min((r for r in report_ranks if r < world_size), default=None)
    if isinstance(strategy, float):
        return next((r for r in range(world_size) if rank_share(r) < strategy), None)
    return 0  # all, report_ranks: all, and first_per_node (launchers number a node's ranks from its first)


@dataclass(frozen=True)
class RankExports:
    """What this rank sends: `spans` (its step spans), `metrics` (its training metrics), and
    `job_root` (it emits the job step's root span)."""

    spans: bool = True
    metrics: bool = True
    job_root: bool = True

    @classmethod
    def of(cls, config: MonitorConfig, identity: Identity) -> RankExports:
        spans, metrics = config.export_ranks.spans, config.export_ranks.metrics
        rank, local = identity.rank, identity.local_rank
        return cls(
            spans=selects(spans, config.report_ranks, rank, local),
            metrics=selects(metrics, config.report_ranks, rank, local),
            job_root=first_rank(spans, config.report_ranks, identity.world_size) == rank,
        )


__all__ = ["ALL", "FIRST_PER_NODE", "REPORT_RANKS", "RankExports", "first_rank", "rank_share", "selects"]
