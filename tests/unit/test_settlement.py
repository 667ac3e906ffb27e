"""The one settlement of a run's end: requeue (and why) or the job's end, its counters, its
resources for the next run, its cost, and the commands that carry it out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import Reservation, ReservationKind
from gpufleet.domain.cost import run_cost_usd
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.reserved import BLOCK_TERMINATION_LEAD_SECONDS
from gpufleet.domain.settlement import (
    AUTO_MAX_INTERRUPTIONS,
    BUDGET,
    IDLE,
    INTERRUPTED,
    MEMORY_LEAK,
    NEXT_STAGE,
    ON_DEMAND,
    OUT_OF_MEMORY,
    PREEMPTED,
    RECLAIMED,
    RESERVATION_ENDING,
    RETRY,
    ChargeUsage,
    EndKind,
    PublishStatusChange,
    Record,
    ReleaseShare,
    Requeue,
    RunEnd,
    RunStageHere,
    Terminate,
    requeue_changes,
    settle,
)
from gpufleet.domain.spec import SpotPolicy, parse_spec
from tests.unit.test_planning import plan_for

SPEC = parse_spec(
    "name: a\nteam: t\nimage: i\ncommand: [x]\nmax_retries: 2\ntimeout: 1h\n"
    "retry_exit_codes: []\nno_retry_exit_codes: [2]\n"
)
LAUNCHED = 1000.0
PLACEMENT = Placement(
    instance_ids=["i-1"],
    instance_type="g5.xlarge",
    capacity_type="spot",
    hourly_usd=1.0,
    gpu_memory_gib=24.0,
    launched_at=LAUNCHED,
    storage_gib=100,
    storage_usd_per_gib_month=0.08,
)


def running(**fields: Any) -> Job:
    values: dict[str, Any] = {
        "job_id": "j-0123456789abcdef0123",
        "status": JobStatus.RUNNING,
        "spec": SPEC,
        "source": "test",
        "created_at": 0.0,
        "updated_at": 0.0,
        "placement": PLACEMENT,
    }
    values.update(fields)
    return Job(**values)


def end(kind: EndKind = EndKind.EXITED, ran: float = 60.0, **fields: Any) -> RunEnd:
    return RunEnd(kind, LAUNCHED + ran, **fields)


def verdict(job: Job, run_end: RunEnd, **kwargs: Any) -> tuple[str | None, JobStatus]:
    settled = settle(job, run_end, **kwargs)
    return settled.requeue, settled.job.status


def test_success_ends_the_job_and_a_cancelled_job_keeps_its_status() -> None:
    assert verdict(running(), end(exit_code=0)) == (None, JobStatus.SUCCEEDED)
    cancelled = running(status=JobStatus.CANCELLED, drain_reason=PREEMPTED)
    assert verdict(cancelled, end(EndKind.CANCELLED)) == (None, JobStatus.CANCELLED)


@pytest.mark.parametrize(
    "drain", [PREEMPTED, RECLAIMED, "resized", "overheated", RESERVATION_ENDING]
)
def test_a_checkpointed_run_is_always_requeued(drain: str) -> None:
    assert verdict(running(drain_reason=drain), end(exit_code=0)) == (drain, JobStatus.QUEUED)
    assert verdict(running(drain_reason=drain, retries=2), end(exit_code=1))[0] == drain


@pytest.mark.parametrize(
    "run_end",
    [
        end(exit_code=0),  # it checkpointed and stopped, as asked
        end(EndKind.NODE_LOST, reason="instance i-1 is terminated"),  # EC2 ended the block first
        end(EndKind.DRAINED, exit_code=None, reason="stopped after the grace period"),
    ],
)
def test_a_run_drained_for_its_reservations_end_is_requeued_using_no_retry(
    run_end: RunEnd,
) -> None:
    job = running(
        drain_reason=RESERVATION_ENDING,
        retries=2,  # none left: the requeue uses none
        placement=PLACEMENT.model_copy(
            update={"capacity_type": "reserved", "reservation_id": "cr-0123456789abcdef0"}
        ),
    )
    settled = settle(job, run_end)
    assert (settled.requeue, settled.job.status) == (RESERVATION_ENDING, JobStatus.QUEUED)
    assert (settled.job.retries, settled.job.preemptions, settled.job.interruptions) == (2, 0, 0)


ON_BLOCK = PLACEMENT.model_copy(
    update={"capacity_type": "reserved", "reservation_id": "cr-0123456789abcdef0"}
)
# EC2 begins terminating the block's instances 1,000 s into the run.
TERMINATES = LAUNCHED + 1000.0


def _block(kind: ReservationKind = ReservationKind.CAPACITY_BLOCK) -> Reservation:
    return Reservation(
        id="cr-0123456789abcdef0",
        kind=kind,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        count=1,
        start=datetime.fromtimestamp(0, UTC),
        end=datetime.fromtimestamp(TERMINATES + BLOCK_TERMINATION_LEAD_SECONDS, UTC),
        hourly_usd=0.5,
    )


@pytest.mark.parametrize(
    "kind", [EndKind.NODE_LOST, EndKind.HEARTBEAT_TIMEOUT], ids=["instance-gone", "silent"]
)
def test_a_node_lost_once_its_block_is_ending_is_requeued_as_the_blocks_end(
    kind: EndKind,
) -> None:
    """The drain never came (or came too late): EC2's termination of the block is no fault of
    the run's, so it goes back to the queue using no retry, even with none left."""
    job = running(retries=2, placement=ON_BLOCK)
    lost = RunEnd(kind, TERMINATES + 5, reason="instance i-1 is terminated")
    settled = settle(job, lost, reservations=[_block()])
    assert (settled.requeue, settled.job.status) == (RESERVATION_ENDING, JobStatus.QUEUED)
    assert (settled.job.retries, settled.job.preemptions, settled.job.interruptions) == (2, 0, 0)
    assert "Capacity Block ended" in settled.reason


def test_a_node_lost_on_a_block_before_its_end_or_off_one_uses_a_retry() -> None:
    job = running(placement=ON_BLOCK)
    early = RunEnd(EndKind.NODE_LOST, TERMINATES - 1)  # a failure of its own, before the end
    assert verdict(job, early, reservations=[_block()])[0] == RETRY
    late = RunEnd(EndKind.NODE_LOST, TERMINATES + 5)
    # An ODCR's instances are never terminated by EC2 at its end; another id is another's.
    assert verdict(job, late, reservations=[_block(ReservationKind.ODCR)])[0] == RETRY
    assert verdict(running(placement=PLACEMENT), late, reservations=[_block()])[0] == RETRY
    # A run that exited on its own in the block's last half hour ended by itself.
    exited = RunEnd(EndKind.EXITED, TERMINATES + 5, exit_code=1)
    assert verdict(job, exited, reservations=[_block()])[0] == RETRY
    assert verdict(job, RunEnd(EndKind.EXITED, TERMINATES + 5, exit_code=0))[0] is None


REQUIRED = SPEC.model_copy(update={"spot": SpotPolicy.REQUIRED})
CHECKPOINTS = SPEC.model_copy(update={"checkpoint": "s3://acme-ckpt/a/"})
CAP = AUTO_MAX_INTERRUPTIONS


def test_interruptions_requeue_up_to_a_cap_without_using_retries() -> None:
    interrupted = end(EndKind.INTERRUPTED)
    assert verdict(running(retries=2), interrupted) == (INTERRUPTED, JobStatus.QUEUED)
    assert verdict(running(drain_reason=INTERRUPTED), end(exit_code=0))[0] == INTERRUPTED
    settled = settle(running(interruptions=9), interrupted)
    assert (settled.job.interruptions, settled.job.retries) == (10, 0)
    # `max_interruptions` is the cap of a job that may not leave spot.
    required = running(spec=REQUIRED, interruptions=2)
    assert settle(required, interrupted, max_interruptions=3).requeue == INTERRUPTED
    assert (
        settle(running(spec=REQUIRED, interruptions=3), interrupted, max_interruptions=3).job.status
        is JobStatus.FAILED
    )


def test_an_auto_job_stays_requeued_past_max_interruptions_for_its_plans_to_judge() -> None:
    """`spot: auto`: whether the next run is on spot is the plan's call (by expected cost, the
    job's interruptions raising the spot hazard), not a count's: `max_interruptions` does not
    apply to a job that checkpoints; only the much larger safety cap does."""
    interrupted = end(EndKind.INTERRUPTED)
    for before in (10, 50, CAP - 1):
        job = running(spec=CHECKPOINTS, interruptions=before)
        settled = settle(job, interrupted, max_interruptions=10)
        assert (settled.requeue, settled.job.status) == (INTERRUPTED, JobStatus.QUEUED)
        assert not settled.job.on_demand_only and settled.job.interruptions == before + 1
    assert settle(running(spec=CHECKPOINTS, interruptions=CAP), interrupted).requeue == ON_DEMAND


def test_an_auto_job_without_checkpoints_keeps_the_count() -> None:
    """Restarting from zero each time, a job whose expected duration is too short would stay
    on spot for ever: `max_interruptions` still moves it to on-demand."""
    interrupted = end(EndKind.INTERRUPTED)
    assert settle(running(interruptions=9), interrupted).requeue == INTERRUPTED
    assert settle(running(interruptions=10), interrupted).requeue == ON_DEMAND
    assert settle(running(interruptions=3), interrupted, max_interruptions=3).requeue == ON_DEMAND


def test_an_auto_job_at_the_safety_cap_goes_on_to_on_demand() -> None:
    """Spot allowed, on-demand allowed: the cap does not fail the job, it ends its use of spot."""
    interrupted = end(EndKind.INTERRUPTED)
    at_cap = settle(running(spec=CHECKPOINTS, interruptions=CAP), interrupted)
    assert (at_cap.requeue, at_cap.job.status) == (ON_DEMAND, JobStatus.QUEUED)
    assert at_cap.reason == f"interrupted {CAP + 1} times on spot: on-demand from now on"
    assert at_cap.commands[3] == Requeue(ON_DEMAND)
    assert at_cap.job.on_demand_only and at_cap.job.interruptions == CAP + 1
    assert at_cap.job.retries == 0 and at_cap.job.placement is None
    # Warned, checkpointed and drained (its node's exit 0): the same.
    warned = running(spec=CHECKPOINTS, interruptions=CAP, drain_reason=INTERRUPTED)
    drained = settle(warned, end(exit_code=0))
    assert drained.requeue == ON_DEMAND and drained.job.on_demand_only
    # A repeated Release (the requeue recorded, not yet carried out) settles it the same way.
    recorded = running(spec=CHECKPOINTS, interruptions=CAP).with_changes(
        at_cap.commands[2].changes  # type: ignore[union-attr]
    )
    assert settle(recorded, interrupted).requeue == ON_DEMAND
    assert settle(recorded, end(exit_code=0)).requeue == ON_DEMAND


def test_the_job_requeued_for_on_demand_is_planned_on_on_demand_only() -> None:
    at_cap = settle(running(spec=CHECKPOINTS, interruptions=CAP), end(EndKind.INTERRUPTED)).job
    assert at_cap.spec.spot is SpotPolicy.AUTO  # what was submitted stays as it was
    assert at_cap.effective_spec.spot is SpotPolicy.NEVER

    def capacity_types(job: Job) -> list[CapacityType]:
        return [step.capacity_type for step in plan_for(job.effective_spec).steps]

    assert capacity_types(running()) == [CapacityType.SPOT, CapacityType.ON_DEMAND]
    assert capacity_types(at_cap) == [CapacityType.ON_DEMAND]


def test_a_requeued_run_counts_its_time_on_spot_and_only_on_spot() -> None:
    """What `planning.job_observed_hazard` reads: the spot instance time of the stage's runs."""
    spot = settle(running(spot_held_seconds=100.0), end(EndKind.INTERRUPTED, ran=600.0)).job
    assert spot.spot_held_seconds == 700.0
    on_demand = running(
        spot_held_seconds=100.0,
        placement=PLACEMENT.model_copy(update={"capacity_type": "on-demand"}),
        drain_reason=PREEMPTED,
    )
    assert settle(on_demand, end(exit_code=0, ran=600.0)).job.spot_held_seconds == 100.0
    # A run that ends the job leaves it as it was.
    assert settle(running(spot_held_seconds=100.0), end(exit_code=0)).job.spot_held_seconds == 100.0


def test_a_spot_required_job_still_fails_at_the_interruption_cap() -> None:
    last = settle(running(spec=REQUIRED, interruptions=10), end(EndKind.INTERRUPTED))
    assert (last.requeue, last.job.status) == (None, JobStatus.FAILED)
    assert last.job.failure_reason == "interrupted 11 times; giving up"
    assert not last.job.on_demand_only
    # On-demand already (nothing left to move to): an interruption past the cap ends it too.
    on_demand = running(spec=CHECKPOINTS, interruptions=CAP + 1, on_demand_only=True)
    assert settle(on_demand, end(EndKind.INTERRUPTED)).job.status is JobStatus.FAILED
    # A caller that keeps the cap final (the simulator's AWS Batch-like peer) fails any job.
    final = settle(running(interruptions=10), end(EndKind.INTERRUPTED), on_demand_after_cap=False)
    assert final.job.status is JobStatus.FAILED


@pytest.mark.parametrize(
    ("exit_code", "retries", "expected"),
    [(1, 0, RETRY), (1, 2, None), (2, 0, None), (137, 1, RETRY)],
)
def test_failed_runs_retry_per_the_spec(exit_code: int, retries: int, expected: str) -> None:
    settled = settle(running(retries=retries), end(exit_code=exit_code))
    assert settled.requeue == expected
    if expected is None:
        assert settled.job.status is JobStatus.FAILED and settled.job.exit_code == exit_code
        assert settled.job.failure_reason == f"exit code {exit_code}"
    else:
        assert settled.job.retries == retries + 1


def test_an_allow_list_of_exit_codes_limits_retries() -> None:
    job = running(spec=SPEC.model_copy(update={"retry_exit_codes": [75]}))
    assert settle(job, end(exit_code=75)).requeue == RETRY
    assert settle(job, end(exit_code=1)).requeue is None


def test_out_of_memory_retries_on_gpus_with_more_memory() -> None:
    settled = settle(running(), end(exit_code=137, oom=True))
    assert settled.requeue == OUT_OF_MEMORY and settled.job.retries == 1
    override = settled.job.resources_override
    assert override is not None and override.gpu_memory_gib == PLACEMENT.gpu_memory_gib + 0.5
    assert settled.job.effective_spec.resources.gpu_memory_gib == 24.5
    # Without the opt-in (or a retry left), an out-of-memory exit is an exit code like any.
    opted_out = running(spec=SPEC.model_copy(update={"retry_oom_with_more_memory": False}))
    assert settle(opted_out, end(exit_code=137, oom=True)).requeue == RETRY
    assert settle(running(retries=2), end(exit_code=137, oom=True)).requeue is None


def test_lost_nodes_are_retried_but_an_exceeded_timeout_is_final() -> None:
    lost = settle(running(), end(EndKind.NODE_LOST, reason="instance i-1 is terminated"))
    assert (lost.requeue, lost.reason) == (RETRY, "instance i-1 is terminated")
    assert settle(running(), end(EndKind.HEARTBEAT_TIMEOUT)).requeue == RETRY
    # Step Functions says Timeout for a node gone silent before the job's own hour, too.
    assert settle(running(), end(EndKind.TIMED_OUT, ran=120)).requeue == RETRY
    exceeded = settle(running(), end(EndKind.TIMED_OUT, ran=4000))
    assert exceeded.requeue is None
    assert exceeded.job.failure_reason == "the run exceeded its timeout"
    given_up = settle(running(placement=None), end(EndKind.LAUNCH_GAVE_UP, reason="ICE"))
    assert given_up.job.failure_reason == "no capacity could be launched: ICE"
    assert settle(running(retries=2), end(EndKind.NODE_LOST)).job.failure_reason == (
        "the node was lost"
    )


def test_a_control_plane_step_that_kept_failing_is_retried_but_a_job_error_is_final() -> None:
    crashed = end(EndKind.STEP_FAILED, reason="ProvisionedThroughputExceededException", cause="x")
    assert settle(running(), crashed).requeue == RETRY
    no_retries = running(spec=SPEC.model_copy(update={"max_retries": 0}))
    assert settle(no_retries, crashed).job.failure_reason == (
        "ProvisionedThroughputExceededException: x"
    )
    job_error = settle(running(), end(EndKind.STEP_FAILED, reason="NoFeasibleOffering"))
    assert job_error.requeue is None and job_error.job.failure_reason == "NoFeasibleOffering"
    nothing = settle(running(), end(EndKind.NO_RESULT))
    assert nothing.job.failure_reason == "the workflow ended without a result"


def test_drains_that_end_the_job_win_over_the_runs_own_end() -> None:
    # Released for idle GPUs: cancelled, whatever exit code the checkpoint-and-stop left.
    idle = settle(running(drain_reason=IDLE), end(exit_code=143))
    assert idle.requeue is None and idle.job.status is JobStatus.CANCELLED
    over = running(drain_reason=BUDGET, failure_reason="stopped: the cost reached $5.00")
    stopped = settle(over, end(EndKind.NODE_LOST))
    assert stopped.job.status is JobStatus.FAILED
    assert stopped.job.failure_reason == "stopped: the cost reached $5.00"


def test_a_memory_leak_drain_is_a_retry_while_retries_last() -> None:
    job = running(drain_reason=MEMORY_LEAK, spec=SPEC.model_copy(update={"max_retries": 1}))
    assert settle(job, end(exit_code=0)).requeue == RETRY
    assert settle(job.model_copy(update={"retries": 1}), end(exit_code=0)).requeue is None


def test_an_abandoned_run_ends_failed_whatever_its_drain() -> None:
    job = running(drain_reason=PREEMPTED)
    abandoned = settle(job, end(EndKind.ABANDONED, reason="WorkflowAborted", cause="by hand"))
    assert abandoned.requeue is None and abandoned.job.status is JobStatus.FAILED
    assert abandoned.job.failure_reason == "WorkflowAborted: by hand"


def test_the_commands_of_an_end_and_of_a_requeue() -> None:
    ended = settle(running(), end(exit_code=0))
    assert [type(c) for c in ended.commands] == [
        Terminate,
        ReleaseShare,
        Record,
        PublishStatusChange,
    ]
    requeued = settle(running(), end(exit_code=1))
    # Its team is charged the run's GPU-hours with the release: 1 GPU for 60 s.
    assert requeued.commands[:2] == (Terminate(), ReleaseShare("t", 60 / 3600, LAUNCHED + 60))
    record = requeued.commands[2]
    assert isinstance(record, Record) and record.status is JobStatus.RUNNING
    assert record.changes.drain_reason == RETRY
    assert requeued.commands[3] == Requeue(RETRY)


def test_the_run_is_paid_until_its_release_and_kept_across_requeues() -> None:
    ran = 1800.0
    cost = run_cost_usd(PLACEMENT, LAUNCHED + ran)
    ended = settle(running(prior_cost_usd=0.5, prior_held_seconds=60), end(exit_code=0, ran=ran))
    assert ended.run_cost_usd == pytest.approx(cost) and ended.run_held_seconds == ran
    assert ended.job.cost_usd == round(0.5 + cost, 6)
    assert ended.job.released_at == LAUNCHED + ran
    requeued = settle(running(prior_cost_usd=0.5, prior_held_seconds=60), end(ran=ran, exit_code=1))
    assert requeued.job.placement is None and requeued.job.released_at is None
    assert requeued.job.prior_cost_usd == pytest.approx(0.5 + cost)
    assert requeued.job.prior_held_seconds == 60 + ran
    # A release already recorded (a cancel's) is when the cost stopped.
    cancelled = running(status=JobStatus.CANCELLED, released_at=LAUNCHED + 60)
    settled = settle(cancelled, end(EndKind.CANCELLED, ran=ran))
    assert settled.job.cost_usd == round(run_cost_usd(PLACEMENT, LAUNCHED + 60), 6)
    assert settled.job.status is JobStatus.CANCELLED


def test_requeue_changes_are_what_the_settlement_queued_the_job_with() -> None:
    settled = settle(running(interruptions=2), end(EndKind.INTERRUPTED))
    released = running(interruptions=2).with_changes(settled.commands[2].changes)  # type: ignore[union-attr]
    assert released.with_changes(requeue_changes(released, 0.0)).interruptions == 3


STAGED = parse_spec(
    "name: s\nteam: t\nimage: i\ncommand: [x]\nresources: {gpus: 1}\nstages:\n"
    "  - {name: prep}\n  - {name: train, reuse_previous: true}\n  - {name: eval}\n"
)


def test_a_stage_that_succeeds_moves_on_here_when_the_next_one_reuses_its_instances() -> None:
    g5 = load_bundled().instance_type("g5.xlarge")
    job = running(spec=STAGED)
    here = settle(job, end(exit_code=0, stage="prep"), instance_type=g5)
    assert here.requeue is None and here.commands[-1] == RunStageHere("train")
    # The stage's GPU-hour so far is its team's, though the share stays with the next stage.
    assert here.commands[-2] == ChargeUsage("t", 60 / 3600, LAUNCHED + 60)
    assert here.job.stage_index == 1 and here.job.placement is not None
    assert here.job.stage_records[0].status is JobStatus.SUCCEEDED
    # Without the catalog's word that it fits, or for a stage that does not reuse: the queue.
    assert settle(job, end(exit_code=0, stage="prep")).requeue == NEXT_STAGE
    following = here.job.model_copy(update={"placement": PLACEMENT})
    moved_on = settle(following, end(exit_code=0, stage="train"), instance_type=g5)
    assert moved_on.requeue == NEXT_STAGE and moved_on.job.stage_index == 2
    assert moved_on.job.retries == 0
    # Spot given up on by one stage is the stage's, as its counters are: the next may use it.
    given_up = following.model_copy(
        update={"on_demand_only": True, "interruptions": 11, "spot_held_seconds": 9e4}
    )
    moved_on = settle(given_up, end(exit_code=0, stage="train"), instance_type=g5)
    assert not moved_on.job.on_demand_only and moved_on.job.interruptions == 0
    assert moved_on.job.spot_held_seconds == 0.0
    failed = settle(following.model_copy(update={"retries": 3}), end(exit_code=1, stage="train"))
    assert failed.job.failure_reason == "stage 'train': exit code 1"
