"""The policies a simulation compares, as configurations of the one engine and the one core.

None of them has scheduling code of its own: each is a `QueuePolicy` for `decide`, a rewrite
of the jobs' queue identity (team, class), and a few engine switches (`SimPolicy`).

Common ground, so that the comparison is about policy and not about size: every policy may hold
at most `cap` GPUs at once, the window's peak concurrent GPU demand (each job running from its
submission for its trace duration, no queueing), rounded up to whole instances of the static
pool's type. The reserve for critical work is 0 unless the workload has critical jobs.

- `gpufleet`: the fleet's own policy. Priority classes with aging (0.1 class per hour), per-team
  quotas (each team's share of the window's GPU-seconds times the cap, adding up to the cap; any
  team may borrow idle quota up to the cap), preemption of borrowers and lower classes
  (10-minute minimum runtime, 2-minute checkpoint grace), spot first with on-demand fallback
  (`auto`), requeued jobs keep their place.
- `fifo-spot`: scale to demand on spot with on-demand fallback; one queue in submission order
  (every job in one team and one class, no aging), no preemption.
- `batch-like`: an AWS Batch-style queue: strict priority classes (no aging, no quotas), no
  preemption; a spot interruption is a failed attempt that goes to the back of its class and
  uses one of the spec's `max_retries`.
- `skypilot-like`: SkyPilot managed jobs (`sky jobs launch --use-spot`, the default
  EAGER_NEXT_REGION recovery): spot only, the cheapest feasible offering first; a launch that
  finds no capacity fails over through the plan's other zones and types and then retries with
  backoff until it gets one (SkyPilot retries forever); after a preemption the relaunch skips
  the pool it was preempted in (SkyPilot skips the region; in a one-region simulation the
  zone and type) and resumes from the checkpoint. No priorities, no quotas, no preemption: one
  queue in submission order under the shared cap, a recovering job keeping its place.
- `static-ondemand`: a fixed on-demand pool held from the first submission to the last
  completion, `cap` GPUs of the cheapest on-demand type (by `selection.select`) that holds the
  largest node any job asks for; FIFO as above; no launches, no boot, no interruptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpufleet.domain.catalog import Catalog, Offering, load_bundled
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.domain.selection import select
from gpufleet.domain.spec import Priority, Resources, SpotPolicy
from gpufleet.sim.engine import SimPolicy, StaticPool, Workload

GPUFLEET = "gpufleet"
STATIC_ONDEMAND = "static-ondemand"
FIFO_SPOT = "fifo-spot"
BATCH_LIKE = "batch-like"
SKYPILOT_LIKE = "skypilot-like"
POLICY_NAMES: tuple[str, ...] = (GPUFLEET, STATIC_ONDEMAND, FIFO_SPOT, BATCH_LIKE, SKYPILOT_LIKE)
BASELINES: tuple[str, ...] = (STATIC_ONDEMAND, FIFO_SPOT, BATCH_LIKE, SKYPILOT_LIKE)
# "Until it gets one": a bound only so that a job no offering could ever hold still ends.
SKYPILOT_LAUNCH_ATTEMPTS = 100_000
# A managed spot job recovers from every preemption "without user intervention" (its restart
# limit, `max_restarts_on_errors`, counts the job's own failures): a bound as above.
SKYPILOT_INTERRUPTIONS = 100_000

ONE_TEAM = "all"


def pool_offering(workload: Workload, catalog: Catalog, region: str) -> Offering:
    """The static pool's instance: the cheapest on-demand offering that holds the largest
    node of the workload (most GPUs per node, most GPU memory, EFA if any job is multi-node)."""
    shapes = [spec.resources for spec in workload.specs]
    if not shapes:
        raise ValueError("an empty workload has no pool to size")
    largest = Resources(
        gpus=max(r.gpus for r in shapes),
        gpu_memory_gib=max(r.gpu_memory_gib for r in shapes),
        vcpus=max(r.vcpus for r in shapes),
        memory_gib=max(r.memory_gib for r in shapes),
        nodes=2 if any(r.nodes > 1 for r in shapes) else 1,
        arch=shapes[0].arch,
    )
    return select(largest, SpotPolicy.NEVER, catalog, region, limit=1).best.offering


def cap_and_pool(
    workload: Workload, catalog: Catalog, region: str, cap_gpus: int | None = None
) -> tuple[int, StaticPool]:
    """The GPU cap every policy shares and the static pool that holds exactly that many:
    `cap_gpus` (default: the window's peak concurrent demand), rounded up to whole pool
    instances."""
    offering = pool_offering(workload, catalog, region)
    per_instance = max(1, offering.instance_type.gpus)
    wanted = workload.peak_gpus() if cap_gpus is None else cap_gpus
    largest_job = max((s.resources.total_gpus for s in workload.specs), default=1)
    count = max(1, math.ceil(max(wanted, largest_job) / per_instance))
    return count * per_instance, StaticPool(offering, count)


def team_quotas(workload: Workload, cap: int) -> dict[str, TeamQuota]:
    """Each team's guaranteed share of the cap: its share of the window's GPU-seconds, rounded
    so that the quotas add up to the cap exactly (largest remainders), so that an idle fleet
    can admit any job up to the cap; every team may borrow idle quota up to the whole cap."""
    demand: dict[str, float] = {}
    for job, spec in zip(workload.jobs, workload.specs, strict=True):
        demand[spec.team] = demand.get(spec.team, 0.0) + spec.resources.total_gpus * max(
            job.duration_seconds, 1.0
        )
    total = sum(demand.values())
    if not total:
        return {}
    exact = {team: cap * seconds / total for team, seconds in demand.items()}
    quotas = {team: math.floor(share) for team, share in exact.items()}
    left = cap - sum(quotas.values())
    by_remainder = sorted(exact, key=lambda t: (-(exact[t] - quotas[t]), t))
    for team in by_remainder[:left]:
        quotas[team] += 1
    return {team: TeamQuota(gpus=quotas[team], borrow=cap) for team in sorted(quotas)}


def _caps(workload: Workload, cap: int, base: QueuePolicy) -> QueuePolicy:
    critical = any(spec.priority is Priority.CRITICAL for spec in workload.specs)
    return base.model_copy(
        update={
            "max_gpus": cap,
            "max_instances": cap + sum(1 for s in workload.specs if s.resources.gpus == 0),
            "reserve_share": base.reserve_share if critical else 0.0,
        }
    )


def _fifo_queue(workload: Workload, cap: int) -> QueuePolicy:
    return _caps(
        workload,
        cap,
        QueuePolicy(
            aging_per_hour=0.0,
            preemption=False,
            teams={ONE_TEAM: TeamQuota(gpus=cap)},
            default_team=TeamQuota(gpus=0, borrow=0),
        ),
    )


def gpufleet_policy(
    workload: Workload, cap: int, _pool: StaticPool, base: QueuePolicy | None = None
) -> SimPolicy:
    queue = base or QueuePolicy()
    if not queue.teams:
        queue = queue.model_copy(
            update={
                "teams": team_quotas(workload, cap),
                "default_team": TeamQuota(gpus=0, borrow=cap),
            }
        )
    return SimPolicy(
        name=GPUFLEET,
        queue=_caps(workload, cap, queue),
        requeue_keeps_place=True,
        description="priorities with aging, team quotas with borrowing, preemption, spot auto",
    )


def fifo_spot_policy(
    workload: Workload, cap: int, _pool: StaticPool, _base: QueuePolicy | None = None
) -> SimPolicy:
    return SimPolicy(
        name=FIFO_SPOT,
        queue=_fifo_queue(workload, cap),
        team_of=ONE_TEAM,
        priority_of=Priority.NORMAL,
        spot=SpotPolicy.AUTO,
        description="one FIFO queue, no priorities, no preemption, spot with on-demand fallback",
    )


def batch_like_policy(
    workload: Workload, cap: int, _pool: StaticPool, _base: QueuePolicy | None = None
) -> SimPolicy:
    return SimPolicy(
        name=BATCH_LIKE,
        queue=_caps(
            workload,
            cap,
            QueuePolicy(
                aging_per_hour=0.0,
                preemption=False,
                teams={ONE_TEAM: TeamQuota(gpus=cap)},
                default_team=TeamQuota(gpus=0, borrow=0),
            ),
        ),
        team_of=ONE_TEAM,
        spot=SpotPolicy.AUTO,
        requeue_keeps_place=False,
        interruptions_use_retries=True,
        description="strict priority classes, no preemption, interruptions retried (max_retries)",
    )


def skypilot_like_policy(
    workload: Workload, cap: int, _pool: StaticPool, _base: QueuePolicy | None = None
) -> SimPolicy:
    return SimPolicy(
        name=SKYPILOT_LIKE,
        queue=_fifo_queue(workload, cap),
        team_of=ONE_TEAM,
        priority_of=Priority.NORMAL,
        spot=SpotPolicy.REQUIRED,
        avoid_interrupted_pool=True,
        max_launch_attempts=SKYPILOT_LAUNCH_ATTEMPTS,
        max_interruptions=SKYPILOT_INTERRUPTIONS,
        description=(
            "managed spot jobs: cheapest spot first, retried until launched, a preempted job "
            "fails over to the next zone or type; one FIFO queue, no priorities"
        ),
    )


def static_ondemand_policy(
    workload: Workload, cap: int, pool: StaticPool, _base: QueuePolicy | None = None
) -> SimPolicy:
    return SimPolicy(
        name=STATIC_ONDEMAND,
        queue=_fifo_queue(workload, cap),
        team_of=ONE_TEAM,
        priority_of=Priority.NORMAL,
        spot=SpotPolicy.NEVER,
        static_pool=pool,
        description=(
            f"{pool.count} x {pool.offering.instance_type.name} on-demand "
            f"({pool.gpus} GPUs) held throughout, FIFO"
        ),
    )


_BUILDERS: dict[str, Callable[[Workload, int, StaticPool, QueuePolicy | None], SimPolicy]] = {
    GPUFLEET: gpufleet_policy,
    STATIC_ONDEMAND: static_ondemand_policy,
    FIFO_SPOT: fifo_spot_policy,
    BATCH_LIKE: batch_like_policy,
    SKYPILOT_LIKE: skypilot_like_policy,
}


def build_policies(
    names: list[str] | tuple[str, ...],
    workload: Workload,
    *,
    catalog: Catalog | None = None,
    region: str | None = None,
    queue: QueuePolicy | None = None,
    cap_gpus: int | None = None,
) -> list[SimPolicy]:
    """The named policies for `workload`, sharing one cap. `queue` (e.g. the `queue:` section
    of gpufleet.yaml) replaces the gpufleet policy's defaults; its caps are replaced by the
    shared cap, and its teams by the workload's quotas when it names none. `cap_gpus` sets the
    cap (default: the window's peak concurrent demand); at least the largest job."""
    unknown = [n for n in names if n not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICY_NAMES)}")
    cat = catalog or load_bundled()
    cap, pool = cap_and_pool(workload, cat, region or workload.mapping.region, cap_gpus)
    return [_BUILDERS[name](workload, cap, pool, queue) for name in names]
