"""How a run ends, decided once: the settlement of a job's run, for the Lambdas and the simulator.

`settle(job, end)` takes the job as its record stands (counters, drain reason, placement,
stage, spec) and how its run ended (`RunEnd`), and returns the job as it is once settled and
the commands that carry that out (`Settlement`). The workflow's Release step and the backstop
carry them out on AWS, the simulator on its simulated fleet; neither has a rule of its own.

The rules, in the order they apply:

1. A job that ended already (cancelled while it ran) keeps its status and gets its cost. A run
   whose workflow ended without settling it (`ABANDONED`) ends the job FAILED: no workflow is
   left to take it back to the queue.
2. Why the run was asked to stop (`Job.drain_reason`). Its cost reached its budget: FAILED.
   Released at a checkpoint because its GPUs sat idle: CANCELLED. Stopped to make room
   (preempted, reclaimed), for a new shape (resized), to move off hot hardware
   (overheated), off a reservation about to end (reservation-ending) or for a time window
   that drains its class (window): back to the queue,
   always (it checkpointed and lost nothing), whatever ended the run. Restarted for a
   GPU memory leak: a retry while retries last. A run on a Capacity Block whose node was lost
   (no exit code: the instance gone, its heartbeats stopped) once EC2 had begun terminating the
   block's instances ended with the block, drained or not: back to the queue as
   reservation-ending too (`reserved.ended_with_block`), neither a retry nor a lost node.
3. A spot interruption (the end of the run, or the drain its warning asked for) sends the job
   back to the queue without using a retry. A job that may run on-demand (`spot: auto`) and
   writes checkpoints goes back every time up to a safety cap (`AUTO_MAX_INTERRUPTIONS`,
   1,000): whether its next run is on spot or on-demand is its plan's choice by expected
   cost, which its interruptions (and its time on spot, `spot_held_seconds`) raise the spot
   hazard of (`planning.job_observed_hazard`). One without checkpoints restarts from zero each
   time, so an expected duration that is too short keeps its plans on spot for ever: for it
   the cap is `max_interruptions`. Past its cap it goes back for on-demand capacity only
   (`Job.on_demand_only`; on-demand is never interrupted). Any other job (`spot: required`)
   goes back `max_interruptions` times, and the next one fails it.
4. Otherwise the run's own end. Exit code 0 succeeds; a stage with stages after it goes on to
   the next one (on the same instances when the next stage asks for them and fits on them).
   A run that ran out of GPU memory is retried on GPUs with more memory; another non-zero
   exit code is retried unless the spec says retrying is pointless; a lost node (an instance
   gone, heartbeats stopped, a timeout before the job's own) and a control-plane step that
   failed through its retries are retried. Each retry uses one of the spec's `max_retries`.
   Exceeding the job's own timeout, a launch that gave up, an error that says the job cannot
   run at all, and a workflow that ended without a result are final.

Back in the queue, the job counts the run (`requeue_changes`): interruptions (the one that
moved it to on-demand included) in `interruptions`, the run's time on spot in
`spot_held_seconds`, retries (out of memory included) in
`retries`, preemptions and reclaims in `preemptions`; a multi-stage job's counters, and its
move to on-demand, are its current stage's. Its cost so far moves into its `prior_*` fields
(`domain.cost`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.domain.catalog import InstanceType
from gpufleet.domain.config import Reservation
from gpufleet.domain.cost import held_seconds, run_cost_usd, spent_until, storage_cost_usd
from gpufleet.domain.job import NO_CHANGES, Job, JobChanges, JobStatus
from gpufleet.domain.reserved import ended_with_block
from gpufleet.domain.spec import JobSpec, SpotPolicy
from gpufleet.domain.stages import close_stage, fits_on, next_stage_may_reuse

# Why a run was asked to stop (`Job.drain_reason`), and why a job goes back to the queue.
PREEMPTED = "preempted"
RECLAIMED = "reclaimed"
INTERRUPTED = "interrupted"
# Interrupted once more than `max_interruptions` allows: back to the queue for on-demand only.
ON_DEMAND = "on-demand"
RETRY = "retry"
OUT_OF_MEMORY = "out-of-memory"  # a retry on GPUs with more memory
RESIZED = "resized"
IDLE = "idle"  # released because its GPUs sat idle: the job ends
OVERHEATED = "overheated"  # moved off hardware running too hot: requeued elsewhere
# GPU memory kept growing: restarted (from its checkpoint, if it writes one), counted as a retry.
MEMORY_LEAK = "memory-leak"
# Stopped (at a checkpoint, or at once) because its cost reached its budget: the job ends.
BUDGET = "budget"
# Its reservation ends soon (a Capacity Block's instances are terminated in its last half
# hour): checkpointed and requeued, neither a retry nor a lost node.
RESERVATION_ENDING = "reservation-ending"
# A time window that drains its class began (gpufleet.yaml `queue.windows[].drain`).
WINDOW = "window"
# A stage of a multi-stage job succeeded: the job goes back to the queue for its next stage.
NEXT_STAGE = "next-stage"

# Drains after which the job always goes back to the queue: it checkpointed and lost nothing.
_CHECKPOINTED = frozenset({PREEMPTED, RECLAIMED, RESIZED, OVERHEATED, RESERVATION_ENDING, WINDOW})

# Errors a workflow step raises because of the job itself: retrying it would fail the same way.
JOB_ERRORS = frozenset(
    {
        "NoFeasibleOffering",
        "SpecError",
        "UnknownTemplate",
        "JobNotFound",
        "IllegalTransition",
        "JobAlreadyEnded",
        "ObjectTooLarge",
    }
)

# A `spot: required` job interrupted this often is probably asking for capacity that keeps
# being reclaimed: the next interruption fails it.
DEFAULT_MAX_INTERRUPTIONS = 10
# A `spot: auto` job's plans leave spot by themselves once its interruptions make spot dearer
# than on-demand; this only bounds a job whose plans keep judging spot cheaper (a checkpoint
# every few minutes) against a market that never lets it finish. Large, as a count must be: on
# the measured spot market a checkpointing job meets one about every two hours, so a weeks-long
# one meets hundreds while spot stays the cheaper way to finish it.
AUTO_MAX_INTERRUPTIONS = 1000

# The counter a run that goes back to the queue adds to, by why it went back.
_COUNTERS = {
    INTERRUPTED: "interruptions",
    ON_DEMAND: "interruptions",
    RETRY: "retries",
    OUT_OF_MEMORY: "retries",
    PREEMPTED: "preemptions",
    RECLAIMED: "preemptions",
}

_LOST = "the node was lost"
_SILENT = "the node was lost: its heartbeats stopped"
_IDLE = "released at a checkpoint: its GPUs stayed idle (on_idle: release)"
_BLOCK_ENDED = "its Capacity Block ended: EC2 terminated the block's instances"


class EndKind(StrEnum):
    """How a run ended."""

    EXITED = "exited"  # the node reported its container's exit code
    INTERRUPTED = "interrupted"  # spot capacity reclaimed: its notice seen, or the instance gone
    NODE_LOST = "node-lost"  # an instance stopped or vanished under the run
    HEARTBEAT_TIMEOUT = "heartbeat-timeout"  # the node went silent
    TIMED_OUT = "timed-out"  # the run's timer ran out (its timeout plus the boot allowance)
    STEP_FAILED = "step-failed"  # a control-plane step failed through its retries
    LAUNCH_GAVE_UP = "launch-gave-up"  # no capacity could be launched
    CANCELLED = "cancelled"
    DRAINED = "drained"  # stopped at a checkpoint, as its drain asked
    ABANDONED = "abandoned"  # its workflow ended without settling it
    NO_RESULT = "no-result"  # the workflow ended without saying how the run went


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a job's run ended, and when (its instances are paid until then, unless the job
    recorded an earlier release)."""

    kind: EndKind
    at: float
    exit_code: int | None = None  # what the node reported, whatever stopped the run
    oom: bool = False  # the container died of GPU out-of-memory
    reason: str = ""  # the node's or the instance's words; a failed step's error name
    cause: str = ""  # a failed step's cause
    stage: str | None = None  # the stage of a multi-stage job the run was of, when known


@dataclass(frozen=True, slots=True)
class Terminate:
    """End the run's instances and what lives with them: every one the job holds (None), or
    only these (those a next stage that runs here does not need)."""

    instance_ids: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """Write the run's end on the job: `changes`, moving it to `status` (which may be the
    status it has)."""

    status: JobStatus
    changes: JobChanges


@dataclass(frozen=True, slots=True)
class PublishStatusChange:
    previous: JobStatus
    status: JobStatus


@dataclass(frozen=True, slots=True)
class ReleaseShare:
    """Give the job's share of the quotas back to the admission queue, and charge its team
    the run's `gpu_hours` (the GPUs the share counted, for as long as the run held its
    instances), used until `at`, for fair share (`domain.fair_share`). Charged with the
    release, once: a repeated release finds no share and charges nothing."""

    team: str
    gpu_hours: float
    at: float


@dataclass(frozen=True, slots=True)
class ChargeUsage:
    """Charge the team a stage's `gpu_hours` (until `at`) without releasing its share: the
    stage hands its instances to the next (`RunStageHere`), which runs under the same share."""

    team: str
    gpu_hours: float
    at: float


@dataclass(frozen=True, slots=True)
class Requeue:
    """Back to the queue for another run (`requeue_changes` records it): `kind` says why."""

    kind: str


@dataclass(frozen=True, slots=True)
class RunStageHere:
    """Have the job's nodes run its next stage, `stage`, on the instances it kept."""

    stage: str


Command = (
    Terminate | Record | PublishStatusChange | ReleaseShare | ChargeUsage | Requeue | RunStageHere
)


@dataclass(frozen=True)
class Settlement:
    """A run's end, settled. `job` is the job once the commands are carried out: ended (its
    final status, reason, exit code and cost), back in the queue (QUEUED, its counters and
    resources as its next run has them, its placement cleared), or on its next stage here."""

    job: Job
    requeue: str | None  # why it goes back to the queue (a `_COUNTERS` kind, NEXT_STAGE...)
    reason: str  # why it goes back, or why it ended ("" when it succeeded)
    run_cost_usd: float  # of the run's instances and storage, until their release
    run_held_seconds: float
    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class _Verdict:
    requeue: str | None
    status: JobStatus  # when it ends
    reason: str


def settle(
    job: Job,
    end: RunEnd,
    *,
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS,
    on_demand_after_cap: bool = True,
    instance_type: InstanceType | None = None,
    reservations: Iterable[Reservation] = (),
) -> Settlement:
    """Settle the end of the job's current run (the rules are in the module doc).

    `on_demand_after_cap` False makes `max_interruptions` the cap of every job, and final (the
    simulator's AWS Batch-like peer, whose interruptions use up its retries).
    `instance_type` is the catalog's entry for the type the run held: it says how many GPUs a
    stage's record counts, and whether the next stage fits on the instances. `reservations`
    are the config's: a node lost in its Capacity Block's last half hour went with the block."""
    placement = job.placement
    released_at = job.released_at
    if released_at is None and placement is not None:
        released_at = end.at
    # The release, when this settlement records it: checked with the other changes of the
    # branch taken below, in one go (a settlement's changes are made once, not piece by piece).
    released: dict[str, Any] = {}
    if released_at != job.released_at:
        released["released_at"] = released_at
    ran: float | None = None  # for as long as the run held its instances
    cost = storage = 0.0  # of the run
    if placement is not None and released_at is not None:
        ran = held_seconds(placement, released_at)
        cost = run_cost_usd(placement, released_at)
        storage = storage_cost_usd(placement, released_at)

    # What the run's GPUs add to its team's fair-share usage, with its share's release.
    share = ReleaseShare(
        job.spec.team, job.effective_spec.resources.total_gpus * (ran or 0.0) / 3600, end.at
    )

    def settled(
        new: Job, requeue: str | None, reason: str, commands: tuple[Command, ...]
    ) -> Settlement:
        return Settlement(new, requeue, reason, cost, ran or 0.0, commands)

    if job.status.terminal:
        # Cancelled while it ran, or while it waited after earlier runs (or stages) it paid.
        changes = NO_CHANGES
        if job.cost_usd is None and (placement is not None or job.prior_cost_usd):
            until = released_at if released_at is not None else end.at
            spent = spent_until(job, until)
            changes = JobChanges(
                cost_usd=round(spent.cost_usd, 6),
                storage_usd=round(spent.storage_usd, 6),
                **released,
            ) | _stage_end(job, job.status, until, instance_type)
        recorded: tuple[Command, ...] = (Record(job.status, changes),) if changes else ()
        commands = (Terminate(), share, *recorded)
        return settled(job.with_changes(changes), None, job.failure_reason or "", commands)

    if _moved_past(job, end):
        # A repeated step: the stage the run was of ended, and the next one runs here already.
        return settled(job, None, _here_reason(job), (RunStageHere(job.stage_name or ""),))

    verdict = _verdict(job, end, ran, max_interruptions, on_demand_after_cap, reservations)
    if verdict.requeue == NEXT_STAGE:
        here = _next_stage_here(job, end, instance_type)
        if here is not None:
            changes, keep_out = here
            following = job.with_changes(changes)
            commands = (
                Record(job.status, changes),
                *((Terminate(keep_out),) if keep_out else ()),
                ChargeUsage(share.team, share.gpu_hours, share.at),
                RunStageHere(following.stage_name or ""),
            )
            return settled(following, None, _here_reason(following), commands)

    # Below, the share goes back before the end is recorded: a job that has ended has nothing
    # left to release it again, while a live one's is found by the next pass that looks.
    if verdict.requeue is not None:
        changes = JobChanges(
            drain_reason=verdict.requeue, failure_reason=verdict.reason, **released
        )
        if verdict.requeue == NEXT_STAGE:
            changes |= JobChanges(failure_reason=None)
            changes |= _stage_end(job, JobStatus.SUCCEEDED, released_at, instance_type)
        released_job = job.with_changes(changes)
        queued = released_job.with_changes(
            requeue_changes(released_job, end.at), status=JobStatus.QUEUED
        )
        commands = (
            Terminate(),
            share,
            Record(job.status, changes),
            Requeue(verdict.requeue),
        )
        return settled(queued, verdict.requeue, verdict.reason, commands)

    status, reason = verdict.status, verdict.reason
    if job.stage_name is not None and status is not JobStatus.SUCCEEDED:
        reason = f"stage {job.stage_name!r}: {reason}"
    paid: dict[str, Any] = {}
    if placement is not None or job.prior_cost_usd:
        paid["cost_usd"] = round(job.prior_cost_usd + cost, 6)
        paid["storage_usd"] = round(job.prior_storage_usd + storage, 6)
    changes = JobChanges(
        failure_reason=reason or None, exit_code=end.exit_code, **released, **paid
    ) | _stage_end(job, status, released_at, instance_type)
    commands = (
        Terminate(),
        share,
        Record(status, changes),
        PublishStatusChange(job.status, status),
    )
    ended = job.with_changes(changes, status=status)
    return settled(ended, None, reason, commands)


def requeue_changes(job: Job, now: float) -> JobChanges:
    """What a job whose run was settled for the queue (its `drain_reason` says why) records as
    it goes back: the counter of that kind, its next stage, GPUs with more memory after it ran
    out of memory, its cost so far in `prior_*`; its placement and its workflow's plumbing
    cleared. `now` stands for a release that was not recorded."""
    released_at = job.released_at if job.released_at is not None else now
    # Gathered, then checked once: every requeue goes through here (the simulator's, a
    # hundred thousand of them, too).
    fields: dict[str, Any] = {
        "placement": None,
        "released_at": None,
        "task_token": None,
        "run_result": None,
        "started_instances": [],
        "drain_reason": None,
        "drain_requested_at": None,
        **spent_until(job, released_at).prior_fields(),
    }
    counter = _COUNTERS.get(job.drain_reason or "")
    if counter is not None:
        fields[counter] = getattr(job, counter) + 1
    if job.drain_reason == ON_DEMAND:
        fields["on_demand_only"] = True
    placement = job.placement
    if placement is not None and placement.capacity_type == "spot":
        ran = held_seconds(placement, released_at)
        fields["spot_held_seconds"] = job.spot_held_seconds + ran
    changes = JobChanges.model_validate(fields)
    if job.drain_reason == OUT_OF_MEMORY and job.placement is not None:
        # Next time, only GPUs with more memory than those it ran out of.
        resources = job.effective_spec.resources
        floor = job.placement.gpu_memory_gib + 0.5
        changes |= JobChanges(
            resources_override=resources.model_copy(
                update={"gpu_memory_gib": max(resources.gpu_memory_gib, floor)}
            )
        )
    if job.drain_reason == NEXT_STAGE:
        changes |= next_stage_changes(job)
    return changes


def next_stage_changes(job: Job) -> JobChanges:
    """What moving a multi-stage job to its next stage changes: the stage, and the counters,
    resource override and move to on-demand, which are each stage's own."""
    return JobChanges(
        stage_index=job.stage_index + 1,
        retries=0,
        preemptions=0,
        interruptions=0,
        resources_override=None,
        on_demand_only=False,
        spot_held_seconds=0.0,
    )


def _verdict(
    job: Job,
    end: RunEnd,
    ran: float | None,
    max_interruptions: int,
    on_demand_after_cap: bool,
    reservations: Iterable[Reservation],
) -> _Verdict:
    """Requeue (and why) or the end (and how) of a job that has not ended yet."""
    spec = job.effective_spec
    status, reason = _own_end(end, ran, spec.timeout_seconds)
    if end.kind in (EndKind.ABANDONED, EndKind.CANCELLED):
        return _Verdict(None, status, reason)
    drain = job.drain_reason
    retries_left = job.retries < spec.max_retries
    if drain == BUDGET:
        budget = job.failure_reason or "stopped: the cost reached its budget"
        return _Verdict(None, JobStatus.FAILED, budget)
    if drain == IDLE:
        return _Verdict(None, JobStatus.CANCELLED, _IDLE)
    if drain in _CHECKPOINTED:
        return _Verdict(drain, status, f"stopped at a checkpoint: {drain}")
    if _lost_with_its_block(job, end, reservations):
        return _Verdict(RESERVATION_ENDING, status, _BLOCK_ENDED)
    if drain == MEMORY_LEAK:
        if retries_left:
            return _Verdict(RETRY, status, "its GPU memory kept growing (a leak)")
        return _ended(job, status, reason)
    # ON_DEMAND: a repeated Release, after the first recorded its requeue.
    if drain in (INTERRUPTED, ON_DEMAND) or end.kind is EndKind.INTERRUPTED:
        times = job.interruptions + 1
        auto = on_demand_after_cap and spec.spot is SpotPolicy.AUTO
        cap = AUTO_MAX_INTERRUPTIONS if auto and spec.checkpoint else max_interruptions
        if job.interruptions < cap:
            return _Verdict(INTERRUPTED, status, "spot interruption")
        if auto:
            moved = f"interrupted {times} times on spot: on-demand from now on"
            return _Verdict(ON_DEMAND, status, moved)
        return _Verdict(None, JobStatus.FAILED, f"interrupted {times} times; giving up")
    retry = _retry(spec, end, ran) if retries_left else None
    if retry is not None:
        return _Verdict(retry[0], status, retry[1])
    return _ended(job, status, reason)


def _lost_with_its_block(job: Job, end: RunEnd, reservations: Iterable[Reservation]) -> bool:
    """Whether the run's node was lost (no exit code) to EC2 ending its Capacity Block."""
    lost = end.kind in (EndKind.NODE_LOST, EndKind.HEARTBEAT_TIMEOUT) and end.exit_code is None
    placement = job.placement
    return (
        lost
        and placement is not None
        and ended_with_block(placement.reservation_id, reservations, end.at)
    )


def _ended(job: Job, status: JobStatus, reason: str) -> _Verdict:
    """The run's end is the job's, unless it is a stage that succeeded with stages after it."""
    following = job.stage_index + 1
    if status is JobStatus.SUCCEEDED and following < len(job.spec.stages):
        done = f"stage {job.stage_name!r} done; next {job.spec.stages[following].name!r}"
        return _Verdict(NEXT_STAGE, status, done)
    return _Verdict(None, status, reason)


def _retry(spec: JobSpec, end: RunEnd, ran: float | None) -> tuple[str, str] | None:
    """Why a run that did not succeed is retried (a retry being left); None: it is not."""
    kind, code = end.kind, end.exit_code
    if kind in (EndKind.EXITED, EndKind.NODE_LOST, EndKind.DRAINED):
        if code is None:
            return RETRY, end.reason or _LOST
        if end.oom and spec.retry_oom_with_more_memory:
            return OUT_OF_MEMORY, "the GPUs ran out of memory"
        if (
            code
            and code not in spec.no_retry_exit_codes
            and (not spec.retry_exit_codes or code in spec.retry_exit_codes)
        ):
            return RETRY, f"exit code {code}"
        return None
    if kind is EndKind.HEARTBEAT_TIMEOUT or (
        kind is EndKind.TIMED_OUT and _silent(ran, spec.timeout_seconds)
    ):
        return RETRY, _SILENT
    if kind is EndKind.STEP_FAILED and end.reason not in JOB_ERRORS:
        return RETRY, f"a control-plane step failed: {end.reason or 'unknown error'}"
    return None


def _own_end(end: RunEnd, ran: float | None, timeout_seconds: int) -> tuple[JobStatus, str]:
    """The status and reason the run's end gives on its own (no drain, no retry)."""
    kind = end.kind
    if kind is EndKind.CANCELLED:
        return JobStatus.CANCELLED, "cancelled"
    if kind in (EndKind.EXITED, EndKind.INTERRUPTED, EndKind.NODE_LOST, EndKind.DRAINED):
        if end.exit_code == 0:
            return JobStatus.SUCCEEDED, ""
        if end.exit_code is not None:
            detail = f": {end.reason}" if end.reason else ""
            return JobStatus.FAILED, f"exit code {end.exit_code}{detail}"
        return JobStatus.FAILED, end.reason or _LOST
    if kind is EndKind.HEARTBEAT_TIMEOUT:
        return JobStatus.FAILED, _SILENT
    if kind is EndKind.TIMED_OUT:
        # Step Functions may report a node that went silent as the run's timeout too.
        if _silent(ran, timeout_seconds):
            return JobStatus.FAILED, _SILENT
        return JobStatus.FAILED, "the run exceeded its timeout"
    if kind in (EndKind.STEP_FAILED, EndKind.ABANDONED):
        name, cause = end.reason or "Error", end.cause[:500]
        return JobStatus.FAILED, f"{name}: {cause}" if cause else name
    if kind is EndKind.LAUNCH_GAVE_UP:
        detail = f": {end.reason}" if end.reason else ""
        return JobStatus.FAILED, f"no capacity could be launched{detail}"
    return JobStatus.FAILED, "the workflow ended without a result"


def _silent(ran: float | None, timeout_seconds: int) -> bool:
    """A run timer that ran out before the job's own timeout did: the node went silent."""
    return ran is not None and ran < timeout_seconds


def _moved_past(job: Job, end: RunEnd) -> bool:
    """Whether the run was of a stage the job has moved past, on the instances it holds."""
    names = [stage.name for stage in job.spec.stages]
    return (
        end.stage in names
        and job.placement is not None
        and names.index(end.stage) < job.stage_index
    )


def _next_stage_here(
    job: Job, end: RunEnd, instance_type: InstanceType | None
) -> tuple[JobChanges, tuple[str, ...]] | None:
    """When the stage that succeeded is followed by one that asks for its instances and fits
    on them: the changes that move the job to that stage on them (the instances it needs;
    the others, returned, end). None when the instances are released as usual."""
    placement = job.placement
    if (
        end.stage is None
        or placement is None
        or job.drain_reason is not None
        or not next_stage_may_reuse(job)
        or instance_type is None
    ):
        return None
    following = job.with_changes(next_stage_changes(job)).effective_spec.resources
    if not fits_on(instance_type, len(placement.instance_ids), following):
        return None
    now = end.at
    keep = placement.instance_ids[: following.nodes]
    changes = (
        _stage_end(job, JobStatus.SUCCEEDED, now, instance_type)
        | spent_until(job, now).as_prior()
        | next_stage_changes(job)
        | JobChanges(
            # The next stage's share of the instances starts now (and only theirs: the peers
            # of its run are the instances it keeps).
            placement=placement.model_copy(
                update={
                    "instance_ids": keep,
                    "launched_at": now,
                    "private_ips": {
                        i: placement.private_ips[i] for i in keep if i in placement.private_ips
                    },
                }
            ),
            run_result=None,
            started_instances=[],
            task_token=None,
            failure_reason=None,
        )
    )
    return changes, tuple(placement.instance_ids[following.nodes :])


def _here_reason(job: Job) -> str:
    return f"stage {job.stage_name!r} runs on the previous stage's instances"


def _stage_end(
    job: Job, status: JobStatus, until: float | None, instance_type: InstanceType | None
) -> JobChanges:
    """The changes that record a multi-stage job's current stage as ended with `status`, with
    its cost and held time up to `until`; none for a job without stages."""
    if not job.spec.stages:
        return NO_CHANGES
    spent = spent_until(job, until)
    records = close_stage(
        job,
        status,
        spent_usd=spent.cost_usd,
        held_seconds=spent.held_seconds,
        gpus_per_node=instance_type.gpus if instance_type else None,
    )
    return JobChanges(stage_records=records)
