"""The reconciler: nothing gpufleet launched runs unless a live job holds it.

The workflow releases every instance on every path, but a crash between CreateFleet and
recording the placement, a deleted execution, or a manual change can leave an instance behind.
Every few minutes the reconciler lists the instances tagged `gpufleet:managed=true` and
terminates those that no live job holds, or that a job holds but has not started on within the
boot allowance (a node that never came up).

It is also the second line behind two events that may never arrive (EventBridge delivers AWS
service events on a best-effort basis, and a delivery can end in a dead-letter queue):

- an instance of a launching or running job that is no longer running while its node never
  reported the end of the run (its "EC2 Instance State-change Notification" was lost): the run
  ends now, as that event would have ended it (`LifecycleService.instance_gone`);
- a job that is not terminal while its workflow has not run for `abandoned_after_seconds` (its
  "Step Functions Execution Status Change" was lost, or the workflow never started): the job is
  ended as the backstop ends it (`BackstopService`).

It also tends the warm pool, when the config has one: idle warm instances are nobody's orphans;
the pool is topped up while launches ask for its type and released when they stop asking
(`domain.warm_pool`). It asks the runs on a Capacity Block that ends soon to checkpoint and
go back to the queue (`domain.reserved`), and it deletes the bookings whose window has ended.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from gpufleet.domain.config import WarmPool
from gpufleet.domain.job import Job, JobNotFound, JobStatus
from gpufleet.domain.release import instance_gone, why_orphaned
from gpufleet.domain.warm_pool import IdleInstance, warm_pool_change
from gpufleet.ports import ManagedInstance, Ports
from gpufleet.services.backstop import BackstopService
from gpufleet.services.bookings import expire as expire_bookings
from gpufleet.services.lifecycle import LifecycleService

# The statuses of a job that its workflow has yet to settle.
LIVE_STATUSES = (JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING)
# Jobs read per status and pass: the newest, so a backlog larger than this is looked at in part.
LIVE_JOBS_PER_STATUS = 5000


@dataclass
class ReconcileResult:
    checked: int = 0
    terminated: dict[str, str] = field(default_factory=dict)  # instance id -> why
    placement_groups_deleted: list[str] = field(default_factory=list)  # by job id
    warm_launched: list[str] = field(default_factory=list)
    warm_released: list[str] = field(default_factory=list)
    runs_ended: dict[str, str] = field(default_factory=dict)  # job id -> the instance found gone
    jobs_ended: list[str] = field(default_factory=list)  # live jobs whose workflow had ended
    bookings_expired: list[str] = field(default_factory=list)  # whose window has ended
    # Asked to checkpoint and requeue: their reservation (a Capacity Block) ends soon.
    reservation_drains: list[str] = field(default_factory=list)


class ReconcilerService:
    def __init__(
        self,
        ports: Ports,
        lifecycle: LifecycleService,
        *,
        grace_seconds: int,
        boot_allowance_seconds: int,
        abandoned_after_seconds: int,
        warm_pool: WarmPool | None = None,
    ) -> None:
        self._ports = ports
        self._lifecycle = lifecycle
        self._backstop = BackstopService(ports, lifecycle)
        self._grace = grace_seconds
        self._boot_allowance = boot_allowance_seconds
        self._abandoned_after = abandoned_after_seconds
        self._warm_pool = warm_pool

    def run(self) -> ReconcileResult:
        now = self._ports.clock.now()
        result = ReconcileResult()
        doomed: dict[str, str] = {}
        managed = self._ports.fleet.managed_instances()
        for instance in managed:
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
        live = [job for status in LIVE_STATUSES for job in self._live_jobs(status)]
        running = {instance.instance_id for instance in managed}
        for job in live:
            gone = instance_gone(job, running, now, grace_seconds=self._grace)
            if gone and self._lifecycle.instance_gone(gone, "not running", job.job_id):
                result.runs_ended[job.job_id] = gone
        result.jobs_ended = self._backstop.abandoned(live, now, self._abandoned_after)
        result.reservation_drains = self._lifecycle.drain_for_reservation_end(
            job for job in live if job.status is not JobStatus.QUEUED
        )
        if self._warm_pool is not None:
            self._tend_warm_pool(self._warm_pool, now, result)
        result.bookings_expired = [b.booking_id for b in expire_bookings(self._ports)]
        return result

    def _live_jobs(self, status: JobStatus) -> list[Job]:
        return self._ports.jobs.list_jobs(status, limit=LIVE_JOBS_PER_STATUS)

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
        job = None
        if instance.job_id is not None:
            with contextlib.suppress(JobNotFound):  # a tag naming no job: judged as such
                job = self._ports.jobs.get(instance.job_id)
        return why_orphaned(
            instance.instance_id,
            now - instance.launched_at,
            job,
            tagged=instance.job_id is not None,
            grace_seconds=self._grace,
            boot_allowance_seconds=self._boot_allowance,
        )
