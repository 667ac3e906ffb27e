"""Intake and lifecycle against the in-memory adapters: every step, repeated and reordered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryCapacityMemory,
    InMemoryObjects,
    ManualClock,
    RecordingNotifier,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.domain.cost import storage_usd_per_hour
from gpufleet.domain.job import DroppedReport, IllegalTransition, JobChanges, JobStatus
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.queueing import Booking, QueuePolicy, TeamQuota
from gpufleet.domain.scaling import AlarmKind
from gpufleet.services.factory import build_actions, build_dispatcher, build_lifecycle
from gpufleet.services.launch_steps import LaunchStepResult
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import control_key, queued_job, run_manifest_key
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from gpufleet.topology import DETAIL_CAPACITY_FREED, DETAIL_JOB_REJECTED, DETAIL_JOB_STATUS_CHANGED
from tests.helpers import SPEC_YAML, intake_for, local_ports, make_settings, plan_of, sent_as

SETTINGS = make_settings(max_launch_attempts=4, retry_wait_seconds=5)


def submit(ports: Any, key: str = "jobs/vision/a.yaml", body: bytes = SPEC_YAML) -> Any:
    cast(InMemoryObjects, ports.objects).objects[key] = body
    return intake_for(ports, SETTINGS).submit_object(
        key, f"s3://bucket/{key}#etag", f"s3://bucket/{key}"
    )


def test_a_valid_upload_is_stored_queued_and_its_lifecycle_starts_with_its_plan() -> None:
    ports = local_ports()
    outcome = submit(ports)
    assert outcome.accepted
    job = ports.jobs.get(outcome.job_id)
    assert job.status is JobStatus.QUEUED
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.started == [outcome.job_id]
    state = workflow.inputs[outcome.job_id]
    assert set(state) == {"job_id", "plan", "launch", "queued", "cycles"}
    assert state["job_id"] == outcome.job_id
    assert state["launch"] == LaunchStepResult(step=0, attempt=0).model_dump()
    plan = plan_of(ports, outcome.job_id)
    assert plan.steps[0].capacity_type is CapacityType.SPOT and plan.steps[0].overrides
    assert plan.max_launch_attempts == SETTINGS.max_launch_attempts
    [changed] = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_STATUS_CHANGED)
    assert changed["job_id"] == outcome.job_id and changed["status"] == "QUEUED"


def test_a_spec_nothing_in_the_catalog_can_run_is_stored_failed_and_starts_nothing() -> None:
    ports = local_ports()
    body = SPEC_YAML.replace(b"gpu_memory_gib: 16", b"gpu_memory_gib: 1000")
    outcome = submit(ports, "jobs/vision/huge-gpus.yaml", body)
    assert outcome.accepted  # a valid spec: the job exists, so its submitter can see why
    job = ports.jobs.get(outcome.job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None and "1000 GiB" in job.failure_reason
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.started == [] and workflow.inputs == {}
    [changed] = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_STATUS_CHANGED)
    assert changed["status"] == "FAILED" and changed["reason"] == job.failure_reason


def test_a_redelivery_creates_no_second_job_but_still_ensures_the_start() -> None:
    ports = local_ports()
    first, second = submit(ports), submit(ports)
    assert first.job_id == second.job_id
    assert len(ports.jobs.list_jobs()) == 1
    assert cast(RecordingWorkflow, ports.workflow).started == [first.job_id]
    assert len(cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_STATUS_CHANGED)) == 1


@dataclass
class CrashingOnce(RecordingWorkflow):
    """A workflow whose first start fails, as if intake died after storing the job."""

    crashed: bool = False

    def start(self, job_id: str, state: Mapping[str, Any]) -> None:
        if not self.crashed:
            self.crashed = True
            raise RuntimeError("intake died here")
        super().start(job_id, state)


def test_a_redelivery_starts_the_lifecycle_a_crashed_first_delivery_did_not() -> None:
    workflow = CrashingOnce()
    ports = replace(local_ports(), workflow=workflow)
    with pytest.raises(RuntimeError):
        submit(ports)
    [stored] = ports.jobs.list_jobs()
    assert stored.status is JobStatus.QUEUED and workflow.started == []
    again = submit(ports)
    assert again.job_id == stored.job_id and workflow.started == [stored.job_id]
    assert plan_of(ports, stored.job_id).steps  # started with a plan, made again


def test_a_bad_spec_writes_an_error_report_emits_rejected_and_changes_nothing_else() -> None:
    ports = local_ports()
    outcome = submit(
        ports, "jobs/vision/bad.yaml", b"name: Bad Name\nteam: t\nimage: i\ncommand: x\n"
    )
    assert not outcome.accepted
    objects = cast(InMemoryObjects, ports.objects).objects
    assert "jobs/vision/bad.yaml.error.json" in objects
    assert b'"field": "name"' in objects["jobs/vision/bad.yaml.error.json"]
    rejected = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_REJECTED)
    assert rejected[0]["source"] == "s3://bucket/jobs/vision/bad.yaml"
    assert ports.jobs.list_jobs() == []
    assert cast(RecordingWorkflow, ports.workflow).started == []


def test_an_oversized_upload_is_rejected_without_being_parsed() -> None:
    ports = local_ports()
    outcome = submit(ports, "jobs/vision/huge.yaml", b"x" * (300 * 1024))
    assert not outcome.accepted
    assert "limit" in outcome.error["message"]


def test_error_reports_are_recognised_so_they_never_loop_back_into_intake() -> None:
    ports = local_ports()
    intake = intake_for(ports, SETTINGS)
    objects = cast(InMemoryObjects, ports.objects).objects
    objects["jobs/vision/a.yaml"] = b"name: [unclosed"
    assert intake.submit_object("jobs/vision/a.yaml", "a#1", "s3://bucket/jobs/vision/a.yaml").error
    # The report's own notification comes back to intake: it is recognised, not refused.
    report = "jobs/vision/a.yaml.error.json"
    outcome = intake.submit_object(report, "r#1", f"s3://bucket/{report}")
    assert outcome.ignored == "intake's own error report"
    assert report + ".error.json" not in objects


def test_an_event_submission_takes_the_same_path() -> None:
    ports = local_ports()
    intake = intake_for(ports, SETTINGS)
    outcome = intake.submit_document(
        {"name": "a", "team": "b", "image": "i", "command": ["x"]},
        "event:1",
        "event:1",
        sent_as("b"),
    )
    assert outcome.accepted
    assert ports.jobs.get(outcome.job_id).status is JobStatus.QUEUED
    assert cast(RecordingWorkflow, ports.workflow).started == [outcome.job_id]
    bad = intake.submit_document("not a mapping", "event:2", "event:2", sent_as("b"))
    assert not bad.accepted and bad.error["error"] == "InvalidJobSpec"


# -- lifecycle -------------------------------------------------------------------------------


def started(job_id: str, instance_id: str) -> NodeReport:
    return NodeReport(job_id=job_id, instance_id=instance_id, phase="started")


def finished(job_id: str, instance_id: str, exit_code: int = 0) -> NodeReport:
    return NodeReport(job_id=job_id, instance_id=instance_id, phase="finished", exit_code=exit_code)


def lifecycle_with_job(
    fleet: FakeFleet | None = None, body: bytes = SPEC_YAML
) -> tuple[LifecycleService, Any, str]:
    ports = local_ports(fleet)
    job_id = submit(ports, body=body).job_id
    return build_lifecycle(ports, SETTINGS), ports, job_id


def run_to_launch(
    service: LifecycleService, ports: Any, job_id: str, token: str = "token"
) -> tuple[LaunchPlan, LaunchStepResult | None]:
    """The first Launch of the plan intake made (None: launched, `token` parked on the job)."""
    plan = plan_of(ports, job_id)
    return plan, service.launch(job_id, plan, step=0, attempt=0, task_token=token)


def test_the_happy_path_end_to_end_with_cost() -> None:
    service, ports, job_id = lifecycle_with_job()
    _, launched = run_to_launch(service, ports, job_id, "token-1")
    assert launched is None
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING
    assert job.placement.capacity_type == "spot"
    assert job.task_token == "token-1" and job.attempts == 1  # parked with the placement
    manifest = cast(InMemoryObjects, ports.objects).objects[run_manifest_key(job_id)]
    assert b'"command": ["python", "train.py"]' in manifest
    instance = job.placement.instance_ids[0]
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert "token-1" not in workflow.completed  # the run, not the launch, completes it

    service.node_report(started(job_id, instance))
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    cast(ManualClock, ports.clock).advance(1800)
    service.node_report(finished(job_id, instance))
    assert workflow.completed["token-1"]["exit_code"] == 0

    released = service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    assert (released["terminated"], released["requeue"], released["reason"]) == (
        [instance],
        False,
        "",
    )
    summary = released["outcome"]
    assert summary["status"] == "SUCCEEDED"
    # Half an hour of the instance and of its disk.
    placement = job.placement
    disk_hourly = storage_usd_per_hour(
        1, placement.storage_gib, placement.storage_usd_per_gib_month
    )
    expected = (placement.hourly_usd + disk_hourly) / 2
    assert summary["cost_usd"] == pytest.approx(expected, rel=1e-5)
    assert summary == ports.jobs.get(job_id).summary()
    assert ports.jobs.get(job_id).released_at == cast(ManualClock, ports.clock).now()
    assert cast(FakeFleet, ports.fleet).live == {}


def test_every_step_can_run_twice() -> None:
    service, ports, job_id = lifecycle_with_job()
    plan, _ = run_to_launch(service, ports, job_id, "token-1")
    # Step Functions retries the Launch: the retry launches nothing and parks its own token.
    assert service.launch(job_id, plan, step=0, attempt=1, task_token="token-2") is None
    assert len(cast(FakeFleet, ports.fleet).requests) == 1  # no second fleet
    job = ports.jobs.get(job_id)
    assert job.task_token == "token-2" and job.attempts == 1
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.completed == {}  # the node has not finished: the retry waits for it
    instance = job.placement.instance_ids[0]
    for _ in range(2):
        service.node_report(started(job_id, instance))
        service.node_report(finished(job_id, instance))
    assert set(workflow.completed) == {"token-2"}
    outcomes = [
        service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))["outcome"]
        for _ in range(2)
    ]
    assert outcomes[0] == outcomes[1] and outcomes[0]["status"] == "SUCCEEDED"
    # A later, different report of the end changes nothing: the job has ended.
    assert (
        service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 1}}))["outcome"]
        == outcomes[0]
    )


def test_a_node_report_delivered_again_after_the_job_ended_is_ignored() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))
    service.node_report(finished(job_id, instance))
    summary = service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))[
        "outcome"
    ]
    for late in (started(job_id, instance), finished(job_id, instance, exit_code=1)):
        service.node_report(late)  # EventBridge delivers at least once, in any order
    assert ports.jobs.get(job_id).summary() == summary


def test_a_finish_that_overtakes_its_start_and_a_retried_launch_still_get_the_result() -> None:
    service, ports, job_id = lifecycle_with_job()
    plan, _ = run_to_launch(service, ports, job_id, "token-1")
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(finished(job_id, instance))
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.completed["token-1"]["exit_code"] == 0
    service.node_report(started(job_id, instance))  # late, harmless
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    # A Launch retried after the node already finished: its token completes at once.
    assert service.launch(job_id, plan, step=0, attempt=1, task_token="late-token") is None
    assert workflow.completed["late-token"] == workflow.completed["token-1"]
    assert len(cast(FakeFleet, ports.fleet).requests) == 1


def test_heartbeats_reach_the_waiting_task_and_stop_once_it_completed() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id, "token")
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    beat = NodeReport(job_id=job_id, instance_id=instance, phase="heartbeat")
    service.node_report(beat)  # the launch parked the token: the task hears it at once
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.heartbeats == ["token"]
    service.node_report(finished(job_id, instance))
    service.node_report(beat)  # a late heartbeat after the end is harmless
    assert workflow.heartbeats == ["token"]


def test_reports_from_instances_the_job_does_not_hold_are_dropped() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id)
    forged = [
        finished(job_id, "i-someone-else"),
        started(job_id, "i-someone-else"),
        NodeReport(job_id=job_id, instance_id="i-someone-else", phase="heartbeat"),
    ]
    for report in forged:
        assert service.node_report(report) is DroppedReport.UNKNOWN_INSTANCE
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING and job.run_result is None
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.completed == {} and workflow.heartbeats == []


def test_a_report_for_a_job_that_does_not_exist_is_dropped_not_raised() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id)
    before = ports.jobs.get(job_id)
    nobody = "j-" + "0" * 20
    for phase in ("started", "heartbeat", "finished"):
        report = NodeReport(job_id=nobody, instance_id="i-0abc", phase=phase)
        assert service.node_report(report) is DroppedReport.UNKNOWN_JOB
        staged = NodeReport(job_id=nobody, instance_id="i-0abc", phase=phase, stage="prep")
        assert service.node_report(staged) is DroppedReport.UNKNOWN_JOB
    assert ports.jobs.get(job_id) == before
    assert cast(RecordingWorkflow, ports.workflow).completed == {}


@pytest.mark.parametrize("exit_code", [-1, 256, 10**40, True, 1.5, "0"])
def test_an_exit_code_no_process_can_have_is_refused(exit_code: object) -> None:
    # 0-255, as Linux and docker report them (128 + n for a death by signal n).
    with pytest.raises(ValidationError):
        NodeReport.model_validate(
            {
                "job_id": "j-" + "0" * 20,
                "instance_id": "i-0",
                "phase": "finished",
                "exit_code": exit_code,
            }
        )
    for valid in (0, 137, 255):
        report = {"job_id": "j-" + "0" * 20, "instance_id": "i-0", "phase": "finished"}
        assert NodeReport.model_validate({**report, "exit_code": valid}).exit_code == valid


def test_spot_capacity_errors_fall_back_to_on_demand() -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    service, ports, job_id = lifecycle_with_job(FakeFleet(no_spot))
    plan, first = run_to_launch(service, ports, job_id, "token-1")
    assert first is not None
    assert not first.launched and first.step == 1 and not first.give_up
    assert first.category == "capacity" and "InsufficientInstanceCapacity" in first.error
    # No capacity: the launch hands its own token back with what to do next.
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.completed["token-1"] == {"launch": first.model_dump()}
    assert ports.jobs.get(job_id).status is JobStatus.LAUNCHING  # admitted, holds its share
    second = service.launch(job_id, plan, step=first.step, attempt=first.attempt, task_token="t-2")
    assert second is None and "t-2" not in workflow.completed
    job = ports.jobs.get(job_id)
    assert job.placement.capacity_type == "on-demand" and job.ondemand_fallback
    assert job.task_token == "t-2"


def test_no_capacity_anywhere_waits_then_gives_up_and_fails_the_job() -> None:
    service, ports, job_id = lifecycle_with_job(
        FakeFleet(lambda _r: ["InsufficientInstanceCapacity"])
    )
    plan, result = run_to_launch(service, ports, job_id, "launch-0")
    assert result is not None
    moves = [result]
    while not result.give_up:
        token = f"launch-{len(moves)}"
        result = service.launch(
            job_id, plan, result.step, result.attempt, task_token=token, tries=result.tries
        )
        assert result is not None
        assert cast(RecordingWorkflow, ports.workflow).completed[token]["launch"]["give_up"] is (
            result.give_up
        )
        moves.append(result)
    assert any(m.retry_later for m in moves)
    assert result.give_up and result.tries == SETTINGS.max_launch_attempts
    summary = service.release(
        job_id, WorkflowState.model_validate({"launch": result.model_dump()})
    )["outcome"]
    assert summary["status"] == "FAILED"
    assert "no capacity" in summary["failure_reason"]
    assert summary["cost_usd"] is None


def test_a_terminal_job_cannot_be_revived() -> None:
    service, ports, job_id = lifecycle_with_job()
    assert (
        service.release(
            job_id, WorkflowState.model_validate({"error": {"Error": "NoFeasibleOffering"}})
        )["outcome"]["status"]
        == "FAILED"
    )
    with pytest.raises(IllegalTransition):
        ports.jobs.transition(job_id, JobStatus.RUNNING, 0.0)
    gave_up = service.launch(job_id, plan_of(ports, job_id), 0, 0, task_token="token")
    assert gave_up is not None and gave_up.give_up
    assert cast(RecordingWorkflow, ports.workflow).completed["token"]["launch"]["give_up"]
    assert cast(FakeFleet, ports.fleet).requests == []


def test_offerings_without_capacity_are_skipped_by_later_launches_until_they_expire() -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    fleet = FakeFleet(no_spot)
    service, ports, first = lifecycle_with_job(fleet)
    plan, failed = run_to_launch(service, ports, first)
    assert failed is not None and not failed.launched
    tried = {o.instance_type for o in fleet.requests[0].overrides}
    remembered = ports.capacity.unavailable(ports.clock.now())
    assert remembered == {
        f"spot:{o.instance_type}:{o.zone or 'us-east-1'}" for o in fleet.requests[0].overrides
    }

    # A second job, a minute later: its spot launch avoids every remembered offering.
    second = submit(ports, "jobs/vision/b.yaml").job_id
    cast(ManualClock, ports.clock).advance(60)
    service.launch(second, plan, step=0, attempt=0, task_token="second")
    assert not tried & {o.instance_type for o in fleet.requests[-1].overrides}

    # Once the memory expires, spot is tried again on the best offerings.
    third = submit(ports, "jobs/vision/c.yaml").job_id
    cast(ManualClock, ports.clock).advance(SETTINGS.capacity_memory_seconds)
    service.launch(third, plan, step=0, attempt=0, task_token="third")
    assert fleet.requests[-1].capacity_type == "spot"
    assert tried == {o.instance_type for o in fleet.requests[-1].overrides}


def test_without_an_expected_duration_the_teams_similar_runs_set_it() -> None:
    service, ports, first = lifecycle_with_job()
    assert plan_of(ports, first).expected_source == "default"
    # Three finished runs of the same image and resources, of 20, 30 and 40 minutes.
    for index, minutes in enumerate((20, 30, 40)):
        job_id = submit(ports, f"jobs/vision/past-{index}.yaml").job_id
        assert service.launch(job_id, plan_of(ports, job_id), 0, 0, task_token=job_id) is None
        cast(ManualClock, ports.clock).advance(minutes * 60)
        instance = ports.jobs.get(job_id).placement.instance_ids[0]
        service.node_report(finished(job_id, instance))
        service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    new = submit(ports, "jobs/vision/new.yaml").job_id
    plan = plan_of(ports, new)
    assert plan.expected_source == "history"
    assert plan.expected_seconds == 30 * 60


def test_a_reservation_takes_jobs_until_it_is_full_and_again_once_released() -> None:
    reservation = Reservation(
        id="cr-0123456789abcdef0",
        kind=ReservationKind.ODCR,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        count=1,
    )
    ports = local_ports()
    settings = SETTINGS.model_copy(update={"config": FleetConfig(reservations=[reservation])})
    service = build_lifecycle(ports, settings)
    intake = intake_for(ports, settings)

    def submit_here(key: str) -> str:
        cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        return job_id

    first, second = submit_here("jobs/vision/1.yaml"), submit_here("jobs/vision/2.yaml")
    # Both were planned while the reservation was free: both plans start with it.
    plans = {job_id: plan_of(ports, job_id) for job_id in (first, second)}
    assert {p.steps[0].capacity_type for p in plans.values()} == {CapacityType.RESERVED}
    assert service.launch(first, plans[first], 0, 0, task_token=first) is None
    # By the second's launch the first holds it: the reserved step is skipped without a
    # CreateFleet call, and the next step (spot) launches.
    requests = len(cast(FakeFleet, ports.fleet).requests)
    skipped = service.launch(second, plans[second], 0, 0, task_token=second)
    assert skipped is not None and skipped.step == 1 and not skipped.give_up
    assert len(cast(FakeFleet, ports.fleet).requests) == requests
    assert service.launch(second, plans[second], 1, 1, task_token=f"{second}-2") is None
    placed = {job_id: ports.jobs.get(job_id).placement for job_id in (first, second)}
    assert placed[first].capacity_type == "reserved"
    assert placed[first].reservation_id == reservation.id
    # Costed at the on-demand price AWS bills an ODCR at (the catalog's, g5.xlarge us-east-1).
    assert placed[first].hourly_usd == 1.006
    assert placed[second].capacity_type == "spot"  # the reservation was full

    service.node_report(finished(first, placed[first].instance_ids[0]))
    service.release(first, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    third = submit_here("jobs/vision/3.yaml")
    service.launch(third, plan_of(ports, third), 0, 0, task_token=third)
    assert ports.jobs.get(third).placement.reservation_id == reservation.id


def test_the_first_launch_after_an_admission_notes_the_wait_once() -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    service, ports, job_id = lifecycle_with_job(FakeFleet(no_spot))
    clock = cast(ManualClock, ports.clock)
    ports.jobs.update(job_id, clock.now(), JobChanges(preempted_for="j-" + "1" * 20))
    queued_at = clock.now()
    clock.advance(90)
    admission = {"admitted": True, "queued_at": queued_at, "admitted_at": clock.now()}
    plan = plan_of(ports, job_id)
    # Admitted, but no spot capacity: the job still leaves the queue, and the wait is noted.
    failed = service.launch(
        job_id, plan, 0, 0, task_token="t-1", admission=Admission.model_validate(admission)
    )
    assert failed is not None and failed.step == 1
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING
    assert (job.waited_seconds, job.first_admitted_at) == (90.0, admission["admitted_at"])
    assert job.preempted_for is None
    # The next step of the same admission launches; the Choice hands the admission on again.
    clock.advance(30)
    assert (
        service.launch(
            job_id, plan, 1, 1, task_token="t-2", admission=Admission.model_validate(admission)
        )
        is None
    )
    job = ports.jobs.get(job_id)
    assert (job.waited_seconds, job.first_admitted_at) == (90.0, admission["admitted_at"])

    # Requeued and admitted again: the waits add up; the first admission stays the first.
    service.node_report(finished(job_id, job.placement.instance_ids[0], exit_code=1))
    assert (
        service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 1}}))["requeue"]
        is True
    )
    service.requeue(job_id)
    requeued_at = clock.now()
    clock.advance(45)
    again = {"admitted": True, "queued_at": requeued_at, "admitted_at": clock.now()}
    service.launch(job_id, plan, 1, 2, task_token="t-3", admission=Admission.model_validate(again))
    job = ports.jobs.get(job_id)
    assert (job.waited_seconds, job.first_admitted_at) == (135.0, admission["admitted_at"])


def test_an_admission_without_times_launches_without_noting_a_wait() -> None:
    service, ports, job_id = lifecycle_with_job()
    # What a dispatcher sends when it tells an admission again after a crash.
    run = service.launch(
        job_id, plan_of(ports, job_id), 0, 0, "t", admission=Admission(admitted=True)
    )
    assert run is None
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING
    assert (job.waited_seconds, job.first_admitted_at) == (0.0, None)


def test_a_spot_warning_drains_the_job_and_its_run_is_requeued_not_failed() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id, "token")
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))
    assert service.instance_interrupted(instance) == job_id
    assert b"checkpoint" in cast(InMemoryObjects, ports.objects).objects[control_key(job_id)]
    assert service.instance_interrupted("i-not-ours") is None
    # An instance of the job it no longer runs on (a leftover) does not drain it.
    leftover = (
        cast(FakeFleet, ports.fleet)
        .launch(
            LaunchRequest(
                job_id=job_id,
                attempt=7,
                capacity_type=CapacityType.SPOT,
                nodes=1,
                overrides=[LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)],
            )
        )
        .instance_ids[0]
    )
    assert service.instance_interrupted(leftover) is None
    service.node_report(finished(job_id, instance))
    run = cast(RecordingWorkflow, ports.workflow).completed["token"]
    released = service.release(job_id, WorkflowState.model_validate({"run": run}))
    assert released["requeue"] is True
    assert "outcome" not in released  # the job has not ended
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    service.requeue(job_id)
    job = ports.jobs.get(job_id)
    assert (job.status, job.interruptions, job.retries) == (JobStatus.QUEUED, 1, 0)


def test_the_next_run_starts_from_the_requeued_plan_and_counts_launches_on() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.instance_interrupted(instance)
    service.node_report(finished(job_id, instance))
    service.release(
        job_id, WorkflowState.model_validate({"run": {"exit_code": 0, "interrupted": True}})
    )
    state = service.requeue_input(job_id, attempt=1)
    assert state["job_id"] == job_id
    assert state["queued"]["preemptions"] == 0 and state["queued"]["job_id"] == job_id
    assert state["launch"] == LaunchStepResult(step=0, attempt=1).model_dump()
    assert LaunchPlan.model_validate(state["plan"]) == plan_of(ports, job_id)  # same shape


def test_an_instance_that_vanishes_ends_the_run_and_a_failure_is_retried_then_final() -> None:
    service, ports, job_id = lifecycle_with_job()
    plan = plan_of(ports, job_id)
    for attempt in range(SPEC_MAX_RETRIES + 1):
        assert service.launch(job_id, plan, 0, attempt, task_token=f"token-{attempt}") is None
        instance = ports.jobs.get(job_id).placement.instance_ids[0]
        service.node_report(started(job_id, instance))
        assert service.instance_gone(instance, "terminated") == job_id
        run = cast(RecordingWorkflow, ports.workflow).completed[f"token-{attempt}"]
        assert run["exit_code"] is None and run["interrupted"] is True  # it was spot
        # Taken as a lost node, not a spot reclaim: each loss uses one of max_retries.
        released = service.release(
            job_id, WorkflowState.model_validate({"run": {**run, "interrupted": False}})
        )
        if attempt < SPEC_MAX_RETRIES:
            assert released["requeue"] is True
            service.requeue(job_id)
            assert ports.jobs.get(job_id).retries == attempt + 1
        else:
            assert released["requeue"] is False
    assert released["outcome"]["status"] == "FAILED"
    assert "terminated" in released["outcome"]["failure_reason"]


SPEC_MAX_RETRIES = 3


@pytest.mark.parametrize(("policy", "status"), [("flag", "SUCCEEDED"), ("release", "CANCELLED")])
def test_idle_gpus_flag_the_job_and_release_it_when_its_spec_says(policy: str, status: str) -> None:
    ports = local_ports()
    key = "jobs/vision/idle.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML + f"on_idle: {policy}\n".encode()
    job_id = intake_for(ports, SETTINGS).submit_object(key, key, key).job_id
    service = build_lifecycle(ports, SETTINGS)
    _, launched = run_to_launch(service, ports, job_id, "token")
    assert launched is None
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))

    actions = build_actions(ports, SETTINGS, service)
    assert actions.on_alarm(job_id, AlarmKind.IDLE) == ["low-utilization"]
    control = cast(InMemoryObjects, ports.objects).objects[control_key(job_id)]
    assert (b"checkpoint" in control) is (policy == "release")
    service.node_report(finished(job_id, instance))
    run = cast(RecordingWorkflow, ports.workflow).completed["token"]
    released = service.release(job_id, WorkflowState.model_validate({"run": run}))
    assert released["requeue"] is False
    assert released["outcome"]["status"] == status


def test_an_overheating_gpu_alerts_the_operators_and_moves_the_job_elsewhere() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, ports, job_id, "token")
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))
    actions = build_actions(ports, SETTINGS, service)
    assert actions.on_alarm(job_id, AlarmKind.HOT) == ["overheating"]
    [(subject, message)] = cast(RecordingNotifier, ports.notifier).sent
    assert "overheating" in subject and instance in message
    service.node_report(finished(job_id, instance))
    run = cast(RecordingWorkflow, ports.workflow).completed["token"]
    assert (
        service.release(job_id, WorkflowState.model_validate({"run": run}))["requeue"] is True
    )  # resumes elsewhere
    service.requeue(job_id)
    assert ports.jobs.get(job_id).status is JobStatus.QUEUED


class CountingCapacity(InMemoryCapacityMemory):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def unavailable(self, now: float) -> frozenset[str]:
        self.reads += 1
        return super().unavailable(now)


def admitted_job(body: bytes = SPEC_YAML) -> tuple[LifecycleService, Any, str, dict[str, Any]]:
    """A job admitted as it arrived, as the Enqueue task admits one: (service, ports, job,
    what the admission told its workflow)."""
    ports = replace(local_ports(), capacity=CountingCapacity())
    job_id = submit(ports, body=body).job_id
    service = build_lifecycle(ports, SETTINGS)
    dispatcher = build_dispatcher(ports, SETTINGS, service)
    dispatcher.enqueue(queued_job(ports.jobs.get(job_id)), "enqueue", plan_of(ports, job_id))
    admission = cast(RecordingWorkflow, ports.workflow).completed["enqueue"]
    assert admission["admitted"] is True
    return service, ports, job_id, admission


def test_a_fresh_admission_tells_the_launch_whether_to_read_the_capacity_memory() -> None:
    service, ports, job_id, admission = admitted_job()
    capacity = cast(CountingCapacity, ports.capacity)
    plan = plan_of(ports, job_id)
    assert admission["shortages_until"] == 0.0
    assert service.launch(job_id, plan, 0, 0, "run", Admission.model_validate(admission)) is None
    assert capacity.reads == 0  # the admission said no shortage is remembered
    # Told of a shortage that is still remembered, a launch reads the memory.
    service, ports, job_id, admission = admitted_job()
    capacity = cast(CountingCapacity, ports.capacity)
    told = {**admission, "shortages_until": ports.clock.now() + 60}
    assert (
        service.launch(job_id, plan_of(ports, job_id), 0, 0, "run", Admission.model_validate(told))
        is None
    )
    assert capacity.reads == 1
    # So does a launch long after its admission, and every later try.
    service, ports, job_id, admission = admitted_job()
    capacity = cast(CountingCapacity, ports.capacity)
    cast(ManualClock, ports.clock).advance(600)
    assert (
        service.launch(
            job_id, plan_of(ports, job_id), 0, 0, "run", Admission.model_validate(admission)
        )
        is None
    )
    assert capacity.reads == 1


def run_to_finish(
    service: LifecycleService, ports: Any, job_id: str, admission: dict[str, Any]
) -> dict[str, Any]:
    assert (
        service.launch(
            job_id, plan_of(ports, job_id), 0, 0, "run", Admission.model_validate(admission)
        )
        is None
    )
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))
    cast(ManualClock, ports.clock).advance(600)
    service.node_report(finished(job_id, instance))
    return cast(RecordingWorkflow, ports.workflow).completed["run"]


@pytest.mark.parametrize("changed_meanwhile", [False, True])
def test_release_settles_from_the_job_its_node_finish_handed_over_or_from_the_record(
    changed_meanwhile: bool,
) -> None:
    service, ports, job_id, admission = admitted_job()
    run = run_to_finish(service, ports, job_id, admission)
    assert run["job"]["job_id"] == job_id and run["exit_code"] == 0
    if changed_meanwhile:  # e.g. an alarm flagged it after the finish: the view is stale
        ports.jobs.update(job_id, ports.clock.now(), JobChanges(flags=["idle"]))
    released = service.release(job_id, WorkflowState.model_validate({"run": run}))
    job = ports.jobs.get(job_id)
    assert released["outcome"]["status"] == "SUCCEEDED" == job.status.value
    assert job.cost_usd is not None and job.cost_usd > 0 and job.released_at is not None
    assert released["outcome"]["cost_usd"] == job.cost_usd
    assert ports.queue.state().running == []  # its share is back
    assert ports.fleet.live == {}
    freed = cast(RecordingPublisher, ports.events).of_type(DETAIL_CAPACITY_FREED)
    # Nothing waits: no pass is woken (the record's path tells one regardless).
    assert len(freed) == int(changed_meanwhile)


def test_a_large_job_is_not_handed_to_the_workflow_and_release_reads_its_record() -> None:
    # A spec near its 256 KiB limit would take the workflow's state past what Step Functions
    # allows (the execution would fail with no Catch to release the instances).
    env = "".join(f"  VAR_{i}: {'x' * 8000}\n" for i in range(20))
    service, ports, job_id, admission = admitted_job(SPEC_YAML + f"env:\n{env}".encode())
    run = run_to_finish(service, ports, job_id, admission)
    assert "job" not in run and run["exit_code"] == 0
    released = service.release(job_id, WorkflowState.model_validate({"run": run}))
    assert released["outcome"]["status"] == "SUCCEEDED" == ports.jobs.get(job_id).status.value
    assert ports.queue.state().running == []


def test_a_job_no_cap_of_the_fleet_can_ever_hold_is_refused_at_intake_with_the_numbers() -> None:
    queue = QueuePolicy(
        max_gpus=32,
        max_instances=16,
        teams={"vision": TeamQuota(gpus=8, borrow=8), "nlp": TeamQuota(gpus=16)},
    )
    settings = make_settings(config=FleetConfig(queue=queue))
    ports = local_ports()

    def verdict(name: str, gpus: int, nodes: int) -> tuple[JobStatus, str | None]:
        body = SPEC_YAML.replace(b"name: resnet", f"name: {name}".encode()).replace(
            b"resources: {gpus: 1, gpu_memory_gib: 16}",
            f"resources: {{gpus: {gpus}, gpu_memory_gib: 16, nodes: {nodes}}}".encode(),
        )
        key = f"jobs/vision/{name}.yaml"
        cast(InMemoryObjects, ports.objects).objects[key] = body
        outcome = intake_for(ports, settings).submit_object(key, f"s3://b/{key}#1", key)
        job = ports.jobs.get(outcome.job_id)
        return job.status, job.failure_reason

    assert verdict("whole", 8, 8) == (
        JobStatus.FAILED,
        "asks for 64 GPUs; the fleet's cap is 32",
    )
    # 16 GPUs: vision's quota of 8 and 8 borrowed from nlp's idle quota. Never refused.
    assert verdict("borrows", 8, 2) == (JobStatus.QUEUED, None)
    assert verdict("over", 8, 3) == (
        JobStatus.FAILED,
        "asks for 24 GPUs; team vision may hold 16 (its quota 8 + 8 borrowed)",
    )
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert len(workflow.started) == 1  # only the job that can run has a lifecycle
    refused = [
        e
        for e in cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_STATUS_CHANGED)
        if e["status"] == "FAILED"
    ]
    assert [e["name"] for e in refused] == ["whole", "over"]
    # Once vision has 8 GPUs booked (from tomorrow), the same shape can run then.
    clock = cast(ManualClock, ports.clock)
    ports.queue.book(
        Booking("b-1", "vision", 8, clock.now() + 86400, clock.now() + 90000), lambda booked: None
    )
    assert verdict("booked", 8, 3) == (JobStatus.QUEUED, None)
    # A later stage no cap can hold is refused before the first runs.
    staged = SPEC_YAML + b"stages:\n  - {name: prep}\n  - {name: train, resources: {nodes: 17}}\n"
    key = "jobs/vision/staged.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = staged.replace(b"resnet", b"staged")
    job = ports.jobs.get(intake_for(ports, settings).submit_object(key, key, key).job_id)
    assert (job.status, job.failure_reason) == (
        JobStatus.FAILED,
        "stage 'train': asks for 17 instances; the fleet's cap is 16",
    )
