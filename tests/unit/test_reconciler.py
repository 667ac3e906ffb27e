"""The reconciler terminates what no live job holds, and nothing else."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryObjects,
    ManualClock,
    RecordingWorkflow,
    in_memory_ports,
)
from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind, WarmPool
from gpufleet.domain.history import requeue_budget
from gpufleet.domain.job import JobChanges, JobStatus
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.domain.reserved import BLOCK_TERMINATION_LEAD_SECONDS, drain_lead_seconds
from gpufleet.domain.settlement import RESERVATION_ENDING
from gpufleet.ports import Ports, WorkflowRun
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.reconciler import ReconcilerService
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import WorkflowState
from gpufleet.topology import RECONCILE_PERIOD_SECONDS
from tests.helpers import SPEC_YAML, local_ports, plan_of
from tests.unit.test_services import SETTINGS


def reconciler_for(ports: Ports, warm_pool: WarmPool | None = None) -> ReconcilerService:
    return ReconcilerService(
        ports,
        build_lifecycle(ports, SETTINGS),
        grace_seconds=300,
        boot_allowance_seconds=900,
        abandoned_after_seconds=900,
        warm_pool=warm_pool,
    )


def test_orphans_are_terminated_and_held_instances_are_kept() -> None:
    ports = local_ports()
    fleet = cast(FakeFleet, ports.fleet)
    clock = cast(ManualClock, ports.clock)
    lifecycle = build_lifecycle(ports, SETTINGS)
    intake = build_intake(ports, SETTINGS, lifecycle)
    jobs = []
    for name in ("running", "ended", "stuck"):
        key = f"jobs/vision/{name}.yaml"
        cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, f"token-{name}") is None
        jobs.append(job_id)
    running, ended, stuck = jobs
    instance = {j: ports.jobs.get(j).placement.instance_ids[0] for j in jobs}  # type: ignore[union-attr]
    lifecycle.node_report(
        NodeReport(job_id=running, instance_id=instance[running], phase="started")
    )
    # Ended with its instance left behind (its Release kept failing: ReleaseFailed).
    ports.jobs.transition(ended, JobStatus.FAILED, clock.now(), JobChanges(failure_reason="Boom"))
    # A second fleet for the running job: a launch crashed after CreateFleet, and the retry that
    # recorded the job's placement did not see it (EC2 lists new instances late).
    leftover = "i-" + "f" * 17
    fleet.live[leftover] = fleet.owners[leftover] = running
    for instance_id in fleet.live:
        fleet.launched_at[instance_id] = clock.now()

    reconciler = reconciler_for(ports)
    assert reconciler.run().terminated == {}  # everything is younger than the grace period

    clock.advance(600)
    result = reconciler.run()
    assert set(result.terminated) == {instance[ended], leftover}
    assert instance[running] in fleet.live and instance[stuck] in fleet.live

    clock.advance(600)  # the stuck job's node never reported in
    assert set(reconciler.run().terminated) == {instance[stuck]}
    assert set(fleet.live) == {instance[running]}


def test_the_warm_pool_is_kept_full_while_in_demand_and_released_after_its_ttl() -> None:
    clock = ManualClock()
    pool = WarmPool(instance_type="g5.xlarge", count=2, ttl_minutes=30)
    fleet = FakeFleet(warm_pool=pool, clock=clock)
    ports = in_memory_ports(fleet=fleet, clock=clock)
    reconciler = reconciler_for(ports, warm_pool=pool)
    first = reconciler.run()
    assert len(first.warm_launched) == 2  # a new pool starts in demand
    assert first.terminated == {}  # idle warm instances are nobody's orphans
    assert reconciler.run().warm_launched == []  # already full

    clock.advance(600)
    taken = fleet.launch(
        LaunchRequest(
            job_id="j-00000000000000000001",
            attempt=0,
            capacity_type=CapacityType.SPOT,
            nodes=1,
            overrides=[LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)],
        )
    ).instance_ids
    assert taken[0] in first.warm_launched
    refill = reconciler.run()
    assert len(refill.warm_launched) == 1  # the claim was demand: topped up again

    # Nobody asks for the type for a TTL: what waited that long is released, nothing replaces it.
    clock.advance(30 * 60 - 60)
    assert reconciler.run().warm_released == []  # still in demand
    clock.advance(60)
    released = reconciler.run()
    idle = sorted({*first.warm_launched, *refill.warm_launched} - set(taken))
    assert released.warm_released == idle and released.warm_launched == []
    assert [i for i in fleet.managed_instances() if i.warm] == []
    assert reconciler.run().warm_launched == []  # out of demand: stays empty


def launched_job(ports: Ports, name: str = "a") -> tuple[str, str]:
    """A job launched and started on its node, with its instance: (job, instance)."""
    lifecycle = build_lifecycle(ports, SETTINGS)
    key = f"jobs/vision/{name}.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
    job_id = build_intake(ports, SETTINGS, lifecycle).submit_object(key, key, key).job_id
    assert job_id is not None
    assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, f"token-{name}") is None
    instance = ports.jobs.get(job_id).placement.instance_ids[0]  # type: ignore[union-attr]
    cast(FakeFleet, ports.fleet).launched_at[instance] = ports.clock.now()
    lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
    return job_id, instance


def test_a_live_job_whose_workflow_ended_long_ago_is_ended_and_its_instance_released() -> None:
    """The second line behind the backstop's event (Step Functions sends it best effort)."""
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    job_id, instance = launched_job(ports)
    workflow = cast(RecordingWorkflow, ports.workflow)
    clock.advance(100)
    workflow.ended[job_id] = WorkflowRun(
        "FAILED", clock.now(), "ReleaseFailed", "Release kept failing"
    )
    reconciler = reconciler_for(ports)
    clock.advance(600)
    assert reconciler.run().jobs_ended == []  # its event may still come
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    clock.advance(300)
    assert reconciler.run().jobs_ended == [job_id]
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason == "ReleaseFailed: Release kept failing"
    assert job.cost_usd is not None and job.cost_usd > 0
    assert instance not in cast(FakeFleet, ports.fleet).live


def test_a_job_whose_workflow_never_started_is_ended_once_it_is_old_enough() -> None:
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    cast(InMemoryObjects, ports.objects).objects["jobs/vision/a.yaml"] = SPEC_YAML
    lifecycle = build_lifecycle(ports, SETTINGS)
    job_id = (
        build_intake(ports, SETTINGS, lifecycle)
        .submit_object("jobs/vision/a.yaml", "k", "k")
        .job_id
    )
    assert job_id is not None
    cast(RecordingWorkflow, ports.workflow).started.clear()  # intake crashed before the start
    reconciler = reconciler_for(ports)
    clock.advance(600)
    assert reconciler.run().jobs_ended == []
    clock.advance(600)
    assert reconciler.run().jobs_ended == [job_id]
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason == "WorkflowLost: the job's workflow never started"


def test_an_instance_that_went_away_without_its_event_ends_the_run() -> None:
    """Its "EC2 Instance State-change Notification" ended in a dead-letter queue: the waiting
    task hears of it from the reconciler instead, and Release decides as usual."""
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    job_id, instance = launched_job(ports)
    kept_id, kept = launched_job(ports, "kept")
    cast(FakeFleet, ports.fleet).live.pop(instance)  # spot took it back; nobody heard
    reconciler = reconciler_for(ports)
    assert reconciler.run().runs_ended == {}  # too young to be sure EC2 lists it
    clock.advance(600)
    assert reconciler.run().runs_ended == {job_id: instance}
    result = cast(RecordingWorkflow, ports.workflow).completed["token-a"]
    assert result["reason"] == f"instance {instance} is not running" and result["interrupted"]
    assert "token-kept" not in cast(RecordingWorkflow, ports.workflow).completed
    assert kept in cast(FakeFleet, ports.fleet).live and kept_id != job_id


def test_a_pass_that_died_after_recording_a_runs_end_is_made_good_by_the_next() -> None:
    """The chaos sweep crashed the reconciler right after it wrote the run's end: the waiting
    task was never told, and no later pass told it (the end was on record)."""
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    job_id, instance = launched_job(ports)
    cast(FakeFleet, ports.fleet).live.pop(instance)
    clock.advance(600)

    class DiesAfterTheWrite(RecordingWorkflow):
        def complete_task(self, token: str, output: Mapping[str, Any]) -> bool:
            raise TimeoutError("the Lambda timed out")

    workflow = cast(RecordingWorkflow, ports.workflow)
    ports.workflow = DiesAfterTheWrite()
    with pytest.raises(TimeoutError):
        reconciler_for(ports).run()
    assert ports.jobs.get(job_id).run_result is not None  # written; the task not told
    ports.workflow = workflow
    assert reconciler_for(ports).run().runs_ended == {job_id: instance}
    assert workflow.completed["token-a"]["reason"] == f"instance {instance} is not running"


def test_a_run_whose_node_reported_its_end_keeps_that_end_when_its_instance_goes() -> None:
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    job_id, instance = launched_job(ports)
    finished = NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
    build_lifecycle(ports, SETTINGS).node_report(finished)
    cast(FakeFleet, ports.fleet).live.pop(instance)  # gone before Release recorded it
    clock.advance(600)
    reconciler_for(ports).run()
    run_result = ports.jobs.get(job_id).run_result
    assert run_result is not None and run_result["exit_code"] == 0  # not "not running"


def test_a_requeue_past_its_budget_continues_the_job_in_a_new_execution_the_backstop_follows() -> (
    None
):
    """docs/aws-fidelity.md F5: an execution's history is bounded, so past its budget of
    requeues Requeue starts `<job_id>-<n>` from the state it rebuilt and the current one ends;
    the reconciler and WorkflowEnded still find the job in the continued execution."""
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    job_id, instance = launched_job(ports)
    lifecycle = build_lifecycle(ports, SETTINGS)
    workflow = cast(RecordingWorkflow, ports.workflow)
    lifecycle.node_report(
        NodeReport(
            job_id=job_id, instance_id=instance, phase="finished", exit_code=0, reason="preempted"
        )
    )
    assert lifecycle.release(
        job_id, WorkflowState.model_validate({"run": {"exit_code": 0, "interrupted": True}})
    )["requeue"]
    budget = requeue_budget(plan_of(ports, job_id).max_launch_attempts)
    # Within the budget the job goes back to the queue in this execution, counted.
    in_place = lifecycle.requeue_input(job_id, 1, cycles=budget - 1, execution=job_id)
    assert (in_place["continued"], in_place["cycles"]) == (False, budget)
    assert workflow.started == [job_id]
    # Past it, the next execution starts from the same state, its count at 0.
    past = lifecycle.requeue_input(job_id, 1, cycles=budget, execution=job_id)
    successor = f"{job_id}-1"
    assert past["continued"] is True and workflow.started == [job_id, successor]
    assert workflow.inputs[successor] == {k: v for k, v in past.items() if k != "continued"}
    assert workflow.inputs[successor]["cycles"] == 0
    assert workflow.inputs[successor]["plan"] == in_place["plan"]
    # A retried Requeue starts nothing more; the next continuation counts on from the name.
    lifecycle.requeue_input(job_id, 1, cycles=budget, execution=job_id)
    assert workflow.started == [job_id, successor]
    assert lifecycle.requeue_input(job_id, 1, cycles=budget, execution=successor)["continued"]
    assert workflow.started == [job_id, successor, f"{job_id}-2"]
    # The first executions succeeded (ContinuedAsNew): the job's workflow runs on in the last.
    workflow.ended[job_id] = workflow.ended[successor] = WorkflowRun("SUCCEEDED", clock.now())
    reconciler = reconciler_for(ports)
    clock.advance(1_000)
    assert ports.workflow.running_jobs() == {job_id}
    assert reconciler.run().jobs_ended == []
    # When the last one fails, the job is found from it and ended.
    workflow.ended[f"{job_id}-2"] = WorkflowRun("FAILED", clock.now(), "RequeueFailed", "boom")
    assert ports.workflow.run_of(job_id) == workflow.ended[f"{job_id}-2"]
    clock.advance(1_000)
    assert reconciler.run().jobs_ended == [job_id]
    assert ports.jobs.get(job_id).failure_reason == "RequeueFailed: boom"


def _block(now: float, ends_in: float) -> Reservation:
    """A Capacity Block of two g5.xlarge, begun an hour ago, that ends `ends_in` from `now`."""
    return Reservation(
        id="cr-0fedcba9876543210",
        kind=ReservationKind.CAPACITY_BLOCK,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        count=2,
        start=datetime.fromtimestamp(now - 3600, UTC),
        end=datetime.fromtimestamp(now + ends_in, UTC),
        hourly_usd=0.8,
    )


def test_runs_on_a_capacity_block_checkpoint_and_requeue_before_the_block_ends() -> None:
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    now = clock.now()
    lead = drain_lead_seconds(
        RECONCILE_PERIOD_SECONDS, SETTINGS.config.queue.preemption_grace_seconds
    )
    # Two hours before its runs must stop: a run expected to last an hour (the default) fits.
    block = _block(now, ends_in=2 * 3600 + BLOCK_TERMINATION_LEAD_SECONDS + lead)
    settings = SETTINGS.model_copy(update={"config": FleetConfig(reservations=[block])})
    lifecycle = build_lifecycle(ports, settings)
    intake = build_intake(ports, settings, lifecycle)
    reconciler = ReconcilerService(
        ports,
        lifecycle,
        grace_seconds=300,
        boot_allowance_seconds=900,
        abandoned_after_seconds=900,
    )

    def submitted(name: str) -> str:
        key = f"jobs/vision/{name}.yaml"
        cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        return job_id

    job_id = submitted("on-block")
    assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, "token") is None
    placement = ports.jobs.get(job_id).placement
    assert placement is not None and placement.reservation_id == block.id
    assert placement.hourly_usd == 0.8  # the block's price, from the config
    instance = placement.instance_ids[0]
    lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
    assert reconciler.run().reservation_drains == []

    clock.advance(3600 + 1)  # less than an hour left: a new job's plan skips the block
    later = submitted("later")
    assert plan_of(ports, later).steps[0].capacity_type is CapacityType.SPOT
    clock.advance(3600)  # the drain is due
    assert reconciler.run().reservation_drains == [job_id]
    assert reconciler.run().reservation_drains == []  # asked once
    job = ports.jobs.get(job_id)
    assert job.drain_reason == RESERVATION_ENDING
    control = cast(InMemoryObjects, ports.objects).objects[f"runs/{job_id}/control.json"]
    assert json.loads(control)["action"] == "checkpoint"
    # It checkpoints and stops: back to the queue, no retry used.
    lifecycle.node_report(
        NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
    )
    released = lifecycle.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    assert released["requeue"] is True
    requeued = ports.jobs.get(job_id)
    assert (requeued.retries, requeued.preemptions, requeued.interruptions) == (0, 0, 0)


def test_ec2s_warning_of_a_blocks_end_drains_its_runs_once_with_the_reconciler() -> None:
    ports = local_ports()
    now = ports.clock.now()
    # By the config, hours before its runs must stop: only EC2's warning says it ends now.
    block = _block(now, ends_in=6 * 3600)
    settings = SETTINGS.model_copy(update={"config": FleetConfig(reservations=[block])})
    lifecycle = build_lifecycle(ports, settings)
    key = "jobs/vision/on-block.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
    job_id = build_intake(ports, settings, lifecycle).submit_object(key, key, key).job_id
    assert job_id is not None
    assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, "token") is None
    placement = ports.jobs.get(job_id).placement
    assert placement is not None and placement.reservation_id == block.id
    lifecycle.node_report(
        NodeReport(job_id=job_id, instance_id=placement.instance_ids[0], phase="started")
    )

    ends = now + 40 * 60  # what EC2's warning says of the block's end
    assert lifecycle.block_warned("cr-0123456789abcdef0", ends) == []  # another block's warning
    assert lifecycle.block_warned(block.id, ends) == [job_id]
    assert ports.jobs.get(job_id).drain_reason == RESERVATION_ENDING
    # The warning delivered again, and the reconciler's drain when it comes: asked once.
    assert lifecycle.block_warned(block.id, ends) == []
    cast(ManualClock, ports.clock).advance(6 * 3600 - BLOCK_TERMINATION_LEAD_SECONDS)
    reconciler = ReconcilerService(
        ports, lifecycle, grace_seconds=300, boot_allowance_seconds=900, abandoned_after_seconds=900
    )
    assert reconciler.run().reservation_drains == []


def test_a_block_ec2_warned_of_takes_no_run_again_whatever_the_config_says() -> None:
    ports = local_ports()
    clock = cast(ManualClock, ports.clock)
    now = clock.now()
    # By the config, a block for six hours more, with room for two runs.
    block = _block(now, ends_in=6 * 3600)
    settings = SETTINGS.model_copy(update={"config": FleetConfig(reservations=[block])})
    lifecycle = build_lifecycle(ports, settings)
    intake = build_intake(ports, settings, lifecycle)
    objects = cast(InMemoryObjects, ports.objects).objects

    def launched_on_block(name: str) -> tuple[str, str]:
        key = f"jobs/vision/{name}.yaml"
        objects[key] = SPEC_YAML
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, "token") is None
        placement = ports.jobs.get(job_id).placement
        assert placement is not None and placement.reservation_id == block.id
        instance = placement.instance_ids[0]
        lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
        return job_id, instance

    drained, instance = launched_on_block("drained")
    assert lifecycle.block_warned(block.id, now + 40 * 60) == [drained]
    lifecycle.node_report(
        NodeReport(job_id=drained, instance_id=instance, phase="finished", exit_code=0)
    )
    released = lifecycle.release(drained, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    assert released["requeue"] is True

    # Its relaunch, an hour later by the clock and still hours before the config's end: the
    # plan made at its admission still names the block (only Launch reads the memory), whose
    # launch finds no offering and goes on to the next capacity type; that one launches.
    clock.advance(3600)
    plan = lifecycle.requeue(drained)
    assert plan.steps[0].capacity_type is CapacityType.RESERVED
    fleet = cast(FakeFleet, ports.fleet)
    launches = len(fleet.requests)
    moved = lifecycle.launch(drained, plan, 0, 1, "token")
    assert moved is not None and not moved.give_up and moved.step == 1
    assert len(fleet.requests) == launches  # no CreateFleet into the warned block
    assert lifecycle.launch(drained, plan, moved.step, moved.attempt, "token") is None
    relaunched = ports.jobs.get(drained).placement
    assert relaunched is not None and relaunched.reservation_id is None
    # Its other instance is free, yet no new job goes there either.
    other = "jobs/vision/later.yaml"
    objects[other] = SPEC_YAML
    later = intake.submit_object(other, other, other).job_id
    assert later is not None
    assert lifecycle.launch(later, plan_of(ports, later), 0, 0, "token") is not None
