"""What every step of a job's lifecycle shares: the ports, the policy and the planner; status
moves that tell who listens; plans for the job as it now is; asking a run to checkpoint and stop;
what the node agent and the queue read of a job.

Every step is safe to run twice: the state machine retries tasks, events arrive twice and out of
order, and a Lambda can die half way. Status changes are conditional writes; a step that finds
its work already done returns what it would have returned the first time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.domain.boot import efa_environment
from gpufleet.domain.catalog import InstanceType
from gpufleet.domain.config import CostPolicy, DataSources, MetricPolicy, Reservation
from gpufleet.domain.duration import HISTORY_DEPTH, DurationEstimate, estimate_duration, past_runs
from gpufleet.domain.job import IllegalTransition, Job, JobChanges, JobStatus
from gpufleet.domain.node_access import manifest_access
from gpufleet.domain.planning import LaunchPlan, job_observed_hazard
from gpufleet.domain.queueing import QueuedJob, QueuePolicy
from gpufleet.domain.rendezvous import MASTER_PORT, ranked_peers
from gpufleet.domain.reserved import (
    FreeReservation,
    drain_lead_seconds,
    free_reservations,
    runs_to_drain,
    warned_block_key,
    warning_kept_until,
)
from gpufleet.domain.settlement import DEFAULT_MAX_INTERRUPTIONS, RESERVATION_ENDING
from gpufleet.domain.spec import JobSpec
from gpufleet.domain.stages import next_stage_may_reuse, stage_environment
from gpufleet.errors import Conflict
from gpufleet.ports import Ports
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    DETAIL_CAPACITY_FREED,
    DETAIL_JOB_STATUS_CHANGED,
    HOLDS_ASKED,
    RECONCILE_PERIOD_SECONDS,
    RUNS_PREFIX,
)


class Planner(Protocol):
    def __call__(
        self,
        spec: JobSpec,
        *,
        unavailable: frozenset[str],
        expected: DurationEstimate,
        free_reservations: Sequence[FreeReservation],
        observed_hazard: float,
    ) -> LaunchPlan: ...


@dataclass(frozen=True)
class LifecyclePolicy:
    region: str
    capacity_memory_seconds: int = 300
    reservations: tuple[Reservation, ...] = ()
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS
    gpu_memory_of: Callable[[str], float] = lambda _instance_type: 0.0
    metrics: MetricPolicy = field(default_factory=MetricPolicy)
    cost: CostPolicy = field(default_factory=CostPolicy)
    root_volume_gib: int = 200  # each node's EBS volume
    # Catalog lookup (None: unknown type): whether a stage fits on the last one's instances,
    # and how many GPUs a stage held.
    instance_type_of: Callable[[str], InstanceType | None] = lambda _instance_type: None
    data_bucket: str = ""  # where stages pass data to each other (runs/<job>/stages/<stage>/)
    # The file systems and buckets jobs may mount (gpufleet.yaml `data`).
    data_sources: DataSources = field(default_factory=DataSources)
    # The admission policy: a job no state of the fleet could ever admit is refused at intake.
    queue: QueuePolicy = field(default_factory=QueuePolicy)
    # How long a node of a multi-node run may be silent (and, never heard, how long it may
    # boot first) before its run is taken for lost: the plan's heartbeat timeout, per node.
    node_heartbeat_timeout_seconds: int = 900
    boot_allowance_seconds: int = 900


class JobAlreadyEnded(Conflict):
    def __init__(self, job_id: str, status: JobStatus) -> None:
        super().__init__(f"job {job_id} already ended: {status.value}")


def run_manifest_key(job_id: str) -> str:
    return f"{RUNS_PREFIX}{job_id}/run.json"


def control_key(job_id: str) -> str:
    """Where the node agent looks for instructions (checkpoint and stop, run the next stage)."""
    return f"{RUNS_PREFIX}{job_id}/control.json"


def stage_data_root(bucket: str, job_id: str) -> str:
    """Where a multi-stage job's stages write their output, one prefix per stage."""
    return f"s3://{bucket}/{RUNS_PREFIX}{job_id}/stages/"


class LifecycleBase:
    """The ports, planner and policy every step works with, and what they all do."""

    def __init__(self, ports: Ports, planner: Planner, policy: LifecyclePolicy) -> None:
        self._ports = ports
        self._planner = planner
        self._policy = policy

    def _now(self) -> float:
        return self._ports.clock.now()

    def _move(self, job: Job, target: JobStatus, changes: JobChanges | None = None) -> Job:
        """Move to `target` with `changes`, and tell who listens; a job already there (a
        repeated step) only gets the changes."""
        moved, changed = self._write(job, target, changes)
        if changed:
            self._status_changed(moved, job.status)
        return moved

    def _write(
        self, job: Job, target: JobStatus, changes: JobChanges | None = None
    ) -> tuple[Job, bool]:
        """`_move` without telling anyone: the job as written, and whether its status moved."""
        if job.status == target:
            updated = self._ports.jobs.update(job.job_id, self._now(), changes) if changes else job
            return updated, False
        try:
            return self._ports.jobs.transition(job.job_id, target, self._now(), changes), True
        except IllegalTransition as exc:
            if exc.current == target:
                if changes:
                    return self._ports.jobs.update(job.job_id, self._now(), changes), False
                return self._ports.jobs.get(job.job_id), False
            raise

    def _status_changed(self, job: Job, previous: JobStatus, *, holds_asked: bool = False) -> None:
        detail = job.status_event(previous)
        if holds_asked:
            detail[HOLDS_ASKED] = True
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_STATUS_CHANGED, detail)

    def _capacity_freed(self, job_id: str) -> None:
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_CAPACITY_FREED, {"job_id": job_id})

    def _plan(self, job: Job) -> LaunchPlan:
        """The order of capacity types and the timeouts for the job as it now is; which
        offerings to try is decided at each launch, against the capacity memory of that moment."""
        spec = job.effective_spec
        return self._planner(
            spec,
            unavailable=frozenset(),
            expected=self._expected_duration(spec),
            free_reservations=self._free_reservations(),
            observed_hazard=job_observed_hazard(job),
        )

    def _free_reservations(self, warned: Collection[str] = ()) -> list[FreeReservation]:
        """Active reservations with the instances live jobs do not hold and the time a run
        launched into each now has (none on the blocks EC2 `warned` of); then the Capacity
        Blocks that start later."""
        now, reservations = self._now(), self._policy.reservations
        if not reservations:
            return []
        active = any(r.active_at(now) for r in reservations)
        held = self._held_reservations() if active else {}
        return free_reservations(reservations, held, now, self._block_drain_lead(), warned)

    def _held_reservations(self) -> dict[str, int]:
        """The instances live jobs hold in each reservation (by id)."""
        held: dict[str, int] = {}
        for status in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            for job in self._ports.jobs.list_jobs(status):
                if job.placement is not None and job.placement.reservation_id:
                    held[job.placement.reservation_id] = held.get(
                        job.placement.reservation_id, 0
                    ) + len(job.placement.instance_ids)
        return held

    def _block_drain_lead(self) -> int:
        """How long before a Capacity Block's instances are terminated its runs checkpoint."""
        return drain_lead_seconds(
            RECONCILE_PERIOD_SECONDS, self._policy.queue.preemption_grace_seconds
        )

    def drain_for_reservation_end(
        self, jobs: Iterable[Job], warned: Collection[str] = ()
    ) -> list[str]:
        """Ask the runs on reservations about to end (a Capacity Block's last half hour, or one
        EC2 `warned` of) to checkpoint and go back to the queue, neither a retry nor a lost node
        (`settlement.RESERVATION_ENDING`); the dispatcher stops one that does not within the
        checkpoint grace. The jobs asked now: a run asked already (by the reconciler, by an
        earlier warning) is not asked again."""
        placements = [
            (job.job_id, job.placement.reservation_id)
            for job in jobs
            if job.placement is not None and job.placement.reservation_id
        ]
        due = runs_to_drain(
            placements, self._policy.reservations, self._now(), self._block_drain_lead(), warned
        )
        drained = []
        for job_id in due:
            self._ports.queue.mark_draining(job_id, RESERVATION_ENDING)
            if self.drain(job_id, RESERVATION_ENDING):
                drained.append(job_id)
        return drained

    def block_warned(self, reservation_id: str, ends_at: float) -> list[str]:
        """EC2 warned that a Capacity Block ends at `ends_at` (its instances terminate in 10
        minutes): the capacity memory keeps the warning, so that no launch takes the block
        again (`reserved.drain_at`), and its runs are drained now, not at the reconciler's
        next look. The jobs asked."""
        until = warning_kept_until(reservation_id, self._policy.reservations, ends_at)
        self._ports.capacity.remember([warned_block_key(reservation_id)], until=until)
        live = [
            j
            for s in (JobStatus.LAUNCHING, JobStatus.RUNNING)
            for j in self._ports.jobs.list_jobs(s)
        ]
        return self.drain_for_reservation_end(live, warned={reservation_id})

    def _expected_duration(self, spec: JobSpec) -> DurationEstimate:
        if spec.expected_duration_seconds:
            return estimate_duration(spec, [])
        recent = self._ports.jobs.recent_for_team(spec.team, HISTORY_DEPTH)
        return estimate_duration(spec, past_runs(recent))

    def drain(self, job_id: str, reason: str, for_job_id: str | None = None) -> bool:
        """Ask a running job's node to checkpoint and stop; the job is then requeued."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal or job.drain_reason is not None:
            return False
        self._ports.jobs.update(
            job_id,
            self._now(),
            JobChanges(drain_reason=reason, drain_requested_at=self._now()),
        )
        self._ports.objects.put_json(
            control_key(job_id),
            {"action": "checkpoint", "reason": reason, "for_job_id": for_job_id},
        )
        return True


def run_manifest(
    job: Job,
    data_bucket: str,
    data_sources: DataSources,
    instance_type_of: Callable[[str], InstanceType | None] = lambda _instance_type: None,
) -> dict[str, Any]:
    """What the node agent needs to run the job (its current stage): read by the agent, never
    passed to a shell. Secrets by reference: their values are read on the node. Once the job
    holds its instances it names them, in rank order, with their private IPs (each node finds
    its rank by its own instance id), and what accelerator their type has (the catalog's: how
    many Neuron devices the container gets). A multi-node job on EFA types gets the
    NCCL/libfabric environment of its EFAs; a name the job's own env sets keeps the job's
    value (a user tuning NCCL or libfabric knows their job better than the default)."""
    spec = job.effective_spec
    stage_env = stage_environment(job, stage_data_root(data_bucket, job.job_id))
    placement = job.placement
    instance_type = instance_type_of(placement.instance_type) if placement else None
    efa_env = efa_environment(instance_type, spec.resources.nodes) if instance_type else {}
    peers = ranked_peers(placement.instance_ids, placement.private_ips) if placement else []
    return {
        "job_id": job.job_id,
        "name": spec.name,
        "team": spec.team,
        "image": spec.image,
        "command": list(spec.command),
        "env": {**efa_env, **spec.env, **stage_env},
        "gpus": spec.resources.gpus,
        "nodes": spec.resources.nodes,
        "peers": [{"instance_id": p.instance_id, "private_ip": p.private_ip} for p in peers],
        "port": MASTER_PORT,
        "accelerator": instance_type.accelerator if instance_type else _accelerator_of(spec),
        "accelerator_devices": instance_type.gpus if instance_type else spec.resources.gpus,
        "checkpoint": spec.checkpoint,
        "timeout_seconds": spec.timeout_seconds,
        # An earlier run was stopped (preempted, interrupted, resized, moved, restarted): the
        # job resumes from its checkpoint, if it writes one.
        "resume": job.prior_held_seconds > 0 and spec.checkpoint is not None,
        "stage": job.stage_name,
        # The next stage may run on these instances: the agent waits for it after this one.
        "await_next_stage": next_stage_may_reuse(job),
        **manifest_access(spec, data_sources),
    }


def _accelerator_of(spec: JobSpec) -> str:
    """Before the instances are known: NVIDIA GPUs when the job asks for GPUs, else none."""
    return "nvidia" if spec.resources.gpus else "none"


def queued_job(job: Job) -> QueuedJob:
    """What the queue needs to know of a job (its cost estimate comes from the plan)."""
    spec = job.effective_spec
    return QueuedJob(
        job_id=job.job_id,
        team=spec.team,
        priority=spec.priority,
        gpus=spec.resources.total_gpus,
        instances=spec.resources.nodes,
        enqueued_at=job.created_at,
        preempted_for=job.preempted_for,
        preemptions=job.preemptions,
        depends_on=tuple(job.spec.depends_on),
        array_index=job.array_index,
    )
