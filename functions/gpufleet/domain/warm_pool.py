"""The warm pool: how many idle instances to add or release at a reconciler pass.

The pool is *in demand* while a launch asked for its instance type less than `ttl_minutes` ago
(a new pool starts in demand). In demand, it is kept at `count` idle instances; out of demand,
an idle instance is released once it has waited `ttl_minutes` for a job, and none replaces it
until a launch asks for the type again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.domain.config import WarmPool


@dataclass(frozen=True)
class IdleInstance:
    instance_id: str
    launched_at: float


@dataclass(frozen=True)
class WarmPoolChange:
    launch: int = 0
    release: list[str] = field(default_factory=list)


def warm_pool_change(
    pool: WarmPool, idle: Sequence[IdleInstance], demand_at: float, now: float
) -> WarmPoolChange:
    ttl = pool.ttl_minutes * 60
    if now - demand_at < ttl:
        oldest_first = sorted(idle, key=lambda i: (i.launched_at, i.instance_id))
        surplus = oldest_first[: max(0, len(idle) - pool.count)]  # the pool was made smaller
        return WarmPoolChange(
            launch=max(0, pool.count - len(idle)),
            release=[i.instance_id for i in surplus],
        )
    return WarmPoolChange(release=sorted(i.instance_id for i in idle if now - i.launched_at >= ttl))
