"""The reconciler: nothing gpufleet launched runs unless a live job holds it.

The workflow releases every instance on every path, but a crash between CreateFleet and
recording the placement, a deleted execution, or a manual change can leave an instance behind.
Every few minutes the reconciler lists the instances tagged `gpufleet:managed=true` and
terminates those that no live job holds, or that a job holds but has not started on within the
boot allowance (a node that never came up).

It also tends the warm pool, when the config has one: idle warm instances are nobody's orphans;
the pool is topped up while launches ask for its type and released when they stop asking
(`domain.warm_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.domain.config import WarmPool
from gpufleet.domain.job import JobNotFound, JobStatus
from gpufleet.domain.warm_pool import IdleInstance, warm_pool_change
from gpufleet.ports import ManagedInstance, Ports


@dataclass
class ReconcileResult:
    checked: int = 0
    terminated: dict[str, str] = field(default_factory=dict)  # instance id -> why
    placement_groups_deleted: list[str] = field(default_factory=list)  # by job id
    warm_launched: list[str] = field(default_factory=list)
    warm_released: list[str] = field(default_factory=list)


class ReconcilerService:
    def __init__(
        self,
        ports: Ports,
        *,
        grace_seconds: int,
        boot_allowance_seconds: int,
        warm_pool: WarmPool | None = None,
    ) -> None:
        self._ports = ports
        self._grace = grace_seconds
        self._boot_allowance = boot_allowance_seconds
        self._warm_pool = warm_pool

    def run(self) -> ReconcileResult:
        now = self._ports.clock.now()
        result = ReconcileResult()
        doomed: dict[str, str] = {}
        for instance in self._ports.fleet.managed_instances():
            if instance.warm:
                continue  # waiting for a job: the warm pool's, below
            result.checked += 1
            why = self._why_orphaned(instance, now)
            if why:
                doomed[instance.instance_id] = why
        if doomed:
            self._ports.fleet.terminate_instances(sorted(doomed))
        result.terminated = doomed
        for job_id in self._ports.fleet.placement_group_jobs():
            if self._ended(job_id) and self._ports.fleet.delete_placement_group(job_id):
                result.placement_groups_deleted.append(job_id)
        if self._warm_pool is not None:
            self._tend_warm_pool(self._warm_pool, now, result)
        return result

    def _tend_warm_pool(self, pool: WarmPool, now: float, result: ReconcileResult) -> None:
        status = self._ports.fleet.warm_pool()
        idle = [IdleInstance(i.instance_id, i.launched_at) for i in status.idle]
        change = warm_pool_change(pool, idle, status.demand_at, now)
        if change.release:
            self._ports.fleet.terminate_instances(change.release)
            result.warm_released = change.release
        if change.launch:
            result.warm_launched = self._ports.fleet.add_warm_instances(change.launch)

    def _ended(self, job_id: str) -> bool:
        try:
            return self._ports.jobs.get(job_id).status.terminal
        except JobNotFound:
            return True

    def _why_orphaned(self, instance: ManagedInstance, now: float) -> str | None:
        age = now - instance.launched_at
        if age < self._grace:
            return None  # a launch may be recording it right now
        if instance.job_id is None:
            return "no job tag"
        try:
            job = self._ports.jobs.get(instance.job_id)
        except JobNotFound:
            return "its job does not exist"
        if job.status.terminal:
            return f"its job is {job.status.value}"
        placement = job.placement
        if placement is None or instance.instance_id not in placement.instance_ids:
            return "its job does not hold it (left over from a launch)"
        if job.status is JobStatus.LAUNCHING and age > self._boot_allowance:
            return "its node never reported in"
        return None
