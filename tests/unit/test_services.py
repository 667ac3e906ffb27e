"""Intake and lifecycle against the in-memory adapters: every step, repeated and reordered."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryObjects,
    ManualClock,
    RecordingAlarms,
    RecordingNotifier,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.domain.job import IllegalTransition, JobStatus
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.domain.planning import LaunchPlan
from gpufleet.services.factory import build_lifecycle
from gpufleet.services.intake import IntakeService, is_error_report
from gpufleet.services.lifecycle import LifecycleService, NodeReport, control_key, run_manifest_key
from gpufleet.topology import DETAIL_JOB_REJECTED
from tests.helpers import SPEC_YAML, local_ports, make_settings

SETTINGS = make_settings(max_launch_attempts=4, retry_wait_seconds=5)


def submit(ports: Any, key: str = "jobs/a.yaml", body: bytes = SPEC_YAML) -> Any:
    cast(InMemoryObjects, ports.objects).objects[key] = body
    return IntakeService(ports).submit_object(key, f"s3://bucket/{key}#etag", f"s3://bucket/{key}")


def test_a_valid_upload_becomes_a_submitted_job_and_starts_its_lifecycle() -> None:
    ports = local_ports()
    outcome = submit(ports)
    assert outcome.accepted
    job = ports.jobs.get(outcome.job_id)
    assert job.status is JobStatus.SUBMITTED
    assert cast(RecordingWorkflow, ports.workflow).started == [outcome.job_id]


def test_a_redelivery_creates_no_second_job_but_still_ensures_the_start() -> None:
    ports = local_ports()
    first, second = submit(ports), submit(ports)
    assert first.job_id == second.job_id
    assert len(ports.jobs.list_jobs()) == 1
    assert cast(RecordingWorkflow, ports.workflow).started == [first.job_id]


def test_a_bad_spec_writes_an_error_report_emits_rejected_and_changes_nothing_else() -> None:
    ports = local_ports()
    outcome = submit(ports, "jobs/bad.yaml", b"name: Bad Name\nteam: t\nimage: i\ncommand: x\n")
    assert not outcome.accepted
    objects = cast(InMemoryObjects, ports.objects).objects
    assert "jobs/bad.yaml.error.json" in objects
    assert b'"field": "name"' in objects["jobs/bad.yaml.error.json"]
    rejected = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_REJECTED)
    assert rejected[0]["source"] == "s3://bucket/jobs/bad.yaml"
    assert ports.jobs.list_jobs() == []
    assert cast(RecordingWorkflow, ports.workflow).started == []


def test_an_oversized_upload_is_rejected_without_being_parsed() -> None:
    ports = local_ports()
    outcome = submit(ports, "jobs/huge.yaml", b"x" * (300 * 1024))
    assert not outcome.accepted
    assert "limit" in outcome.error["message"]


def test_error_reports_are_recognised_so_they_never_loop_back_into_intake() -> None:
    assert is_error_report("jobs/a.yaml.error.json")
    assert not is_error_report("jobs/a.json")


def test_an_event_submission_takes_the_same_path() -> None:
    ports = local_ports()
    outcome = IntakeService(ports).submit_document(
        {"name": "a", "team": "b", "image": "i", "command": ["x"]}, "event:1", "event:1"
    )
    assert outcome.accepted
    bad = IntakeService(ports).submit_document("not a mapping", "event:2", "event:2")
    assert not bad.accepted and bad.error["error"] == "InvalidJobSpec"


# -- lifecycle -------------------------------------------------------------------------------


def started(job_id: str, instance_id: str) -> NodeReport:
    return NodeReport(job_id=job_id, instance_id=instance_id, phase="started")


def finished(job_id: str, instance_id: str, exit_code: int = 0) -> NodeReport:
    return NodeReport(job_id=job_id, instance_id=instance_id, phase="finished", exit_code=exit_code)


def lifecycle_with_job(fleet: FakeFleet | None = None) -> tuple[LifecycleService, Any, str]:
    ports = local_ports(fleet)
    job_id = submit(ports).job_id
    return build_lifecycle(ports, SETTINGS), ports, job_id


def run_to_launch(service: LifecycleService, job_id: str) -> tuple[LaunchPlan, Any]:
    prepared = service.prepare(job_id)
    plan = LaunchPlan.model_validate(prepared["plan"])
    return plan, service.launch(job_id, plan, step=0, attempt=0)


def test_the_happy_path_end_to_end_with_cost() -> None:
    service, ports, job_id = lifecycle_with_job()
    _, launched = run_to_launch(service, job_id)
    assert launched.launched
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING
    assert job.placement.capacity_type == "spot"
    manifest = cast(InMemoryObjects, ports.objects).objects[run_manifest_key(job_id)]
    assert b'"command": ["python", "train.py"]' in manifest
    instance = job.placement.instance_ids[0]

    service.await_node(job_id, "token-1")
    service.node_report(started(job_id, instance))
    cast(ManualClock, ports.clock).advance(1800)
    service.node_report(finished(job_id, instance))
    assert cast(RecordingWorkflow, ports.workflow).completed["token-1"]["exit_code"] == 0

    assert service.release(job_id, {"run": {"exit_code": 0}}) == {
        "terminated": [instance],
        "requeue": False,
        "reason": "",
    }
    summary = service.record_outcome(job_id, {"run": {"exit_code": 0}})
    assert summary["status"] == "SUCCEEDED"
    assert summary["cost_usd"] == pytest.approx(job.placement.hourly_usd / 2, rel=1e-6)
    assert cast(FakeFleet, ports.fleet).live == {}


def test_every_step_can_run_twice() -> None:
    service, ports, job_id = lifecycle_with_job()
    service.prepare(job_id)
    plan, _ = run_to_launch(service, job_id)
    again = service.launch(job_id, plan, step=0, attempt=1)
    assert again.launched
    assert len(cast(FakeFleet, ports.fleet).requests) == 1  # no second fleet
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    for _ in range(2):
        service.node_report(started(job_id, instance))
        service.node_report(finished(job_id, instance))
        service.release(job_id)
    first = service.record_outcome(job_id, {"run": {"exit_code": 0}})
    assert service.record_outcome(job_id, {"run": {"exit_code": 1}}) == first


def test_a_finish_that_overtakes_its_start_and_its_token_still_completes_the_task() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(finished(job_id, instance))
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    service.node_report(started(job_id, instance))  # late, harmless
    service.await_node(job_id, "late-token")
    assert cast(RecordingWorkflow, ports.workflow).completed["late-token"]["exit_code"] == 0


def test_heartbeats_reach_the_waiting_task_and_stop_once_it_completed() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    beat = NodeReport(job_id=job_id, instance_id=instance, phase="heartbeat")
    service.node_report(beat)  # before the token is parked: nothing to tell yet
    service.await_node(job_id, "token")
    service.node_report(beat)
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert workflow.heartbeats == ["token"]
    service.node_report(finished(job_id, instance))
    service.node_report(beat)  # a late heartbeat after the end is harmless
    assert workflow.heartbeats == ["token"]


def test_reports_from_instances_the_job_does_not_hold_are_ignored() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, job_id)
    service.node_report(finished(job_id, "i-someone-else"))
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING and job.run_result is None


def test_spot_capacity_errors_fall_back_to_on_demand() -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    service, ports, job_id = lifecycle_with_job(FakeFleet(no_spot))
    plan, first = run_to_launch(service, job_id)
    assert not first.launched and first.step == 1 and not first.give_up
    second = service.launch(job_id, plan, step=first.step, attempt=first.attempt)
    assert second.launched
    assert ports.jobs.get(job_id).placement.capacity_type == "on-demand"


def test_no_capacity_anywhere_waits_then_gives_up_and_fails_the_job() -> None:
    service, _, job_id = lifecycle_with_job(FakeFleet(lambda _r: ["InsufficientInstanceCapacity"]))
    plan, result = run_to_launch(service, job_id)
    moves = [result]
    while not (result.give_up or result.launched):
        result = service.launch(job_id, plan, step=result.step, attempt=result.attempt)
        moves.append(result)
    assert any(m.retry_later for m in moves)
    assert result.give_up and result.attempt == SETTINGS.max_launch_attempts
    service.release(job_id)
    summary = service.record_outcome(job_id, {"launch": result.model_dump()})
    assert summary["status"] == "FAILED"
    assert "no capacity" in summary["failure_reason"]
    assert summary["cost_usd"] is None


def test_a_terminal_job_cannot_be_revived() -> None:
    service, ports, job_id = lifecycle_with_job()
    service.prepare(job_id)
    service.record_outcome(job_id, {"error": {"Error": "Boom"}})
    with pytest.raises(IllegalTransition):
        ports.jobs.transition(job_id, JobStatus.RUNNING, 0.0)
    plan = LaunchPlan.model_validate(
        {
            "nodes": 1,
            "steps": [
                {
                    "capacity_type": "spot",
                    "overrides": [{"instance_type": "g5.xlarge", "hourly_usd": 1}],
                }
            ],
            "max_launch_attempts": 1,
            "retry_wait_seconds": 1,
            "run_timeout_seconds": 10,
            "heartbeat_timeout_seconds": 5,
            "expected_seconds": 60,
            "expected_source": "spec",
        }
    )
    assert service.launch(job_id, plan, 0, 0).give_up
    assert cast(FakeFleet, ports.fleet).requests == []


def test_offerings_without_capacity_are_skipped_by_later_launches_until_they_expire() -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    fleet = FakeFleet(no_spot)
    service, ports, first = lifecycle_with_job(fleet)
    plan, failed = run_to_launch(service, first)
    assert not failed.launched
    tried = {o.instance_type for o in fleet.requests[0].overrides}
    remembered = ports.capacity.unavailable(ports.clock.now())
    assert remembered == {f"spot:{t}:us-east-1" for t in tried}

    # A second job, a minute later: its spot launch avoids every remembered offering.
    second = submit(ports, "jobs/b.yaml").job_id
    cast(ManualClock, ports.clock).advance(60)
    service.prepare(second)
    service.launch(second, plan, step=0, attempt=0)
    assert not tried & {o.instance_type for o in fleet.requests[-1].overrides}

    # Once the memory expires, spot is tried again on the best offerings.
    third = submit(ports, "jobs/c.yaml").job_id
    cast(ManualClock, ports.clock).advance(SETTINGS.capacity_memory_seconds)
    service.prepare(third)
    service.launch(third, plan, step=0, attempt=0)
    assert fleet.requests[-1].capacity_type == "spot"
    assert tried == {o.instance_type for o in fleet.requests[-1].overrides}


def test_without_an_expected_duration_the_teams_similar_runs_set_it() -> None:
    service, ports, first = lifecycle_with_job()
    assert service.prepare(first)["plan"]["expected_source"] == "default"
    # Three finished runs of the same image and resources, of 20, 30 and 40 minutes.
    for index, minutes in enumerate((20, 30, 40)):
        job_id = submit(ports, f"jobs/past-{index}.yaml").job_id
        service.prepare(job_id)
        plan = LaunchPlan.model_validate(service.prepare(job_id)["plan"])
        service.launch(job_id, plan, 0, 0)
        cast(ManualClock, ports.clock).advance(minutes * 60)
        service.release(job_id)
        instance = ports.jobs.get(job_id).placement.instance_ids[0]
        service.node_report(finished(job_id, instance))
        service.record_outcome(job_id, {"run": {"exit_code": 0}})
    new = submit(ports, "jobs/new.yaml").job_id
    plan = service.prepare(new)["plan"]
    assert plan["expected_source"] == "history"
    assert plan["expected_seconds"] == 30 * 60


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
    first, second = submit(ports, "jobs/1.yaml").job_id, submit(ports, "jobs/2.yaml").job_id
    for job_id in (first, second):
        plan = LaunchPlan.model_validate(service.prepare(job_id)["plan"])
        assert service.launch(job_id, plan, 0, 0).launched
    placed = {job_id: ports.jobs.get(job_id).placement for job_id in (first, second)}
    assert placed[first].capacity_type == "reserved"
    assert placed[first].reservation_id == reservation.id and placed[first].hourly_usd == 0.0
    assert placed[second].capacity_type == "spot"  # the reservation was full

    service.node_report(finished(first, placed[first].instance_ids[0]))
    service.release(first)
    service.record_outcome(first, {"run": {"exit_code": 0}})
    third = submit(ports, "jobs/3.yaml").job_id
    plan = LaunchPlan.model_validate(service.prepare(third)["plan"])
    service.launch(third, plan, 0, 0)
    assert ports.jobs.get(third).placement.reservation_id == reservation.id


def test_a_spot_warning_drains_the_job_and_its_run_is_requeued_not_failed() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.await_node(job_id, "token")
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
    assert service.release(job_id, {"run": run})["requeue"] is True
    service.requeue(job_id)
    job = ports.jobs.get(job_id)
    assert (job.status, job.interruptions, job.retries) == (JobStatus.QUEUED, 1, 0)


def test_an_instance_that_vanishes_ends_the_run_and_a_failure_is_retried_then_final() -> None:
    service, ports, job_id = lifecycle_with_job()
    plan = LaunchPlan.model_validate(service.prepare(job_id)["plan"])
    for attempt in range(SPEC_MAX_RETRIES + 1):
        service.launch(job_id, plan, 0, attempt)
        instance = ports.jobs.get(job_id).placement.instance_ids[0]
        service.await_node(job_id, f"token-{attempt}")
        service.node_report(started(job_id, instance))
        assert service.instance_gone(instance, "terminated") == job_id
        run = cast(RecordingWorkflow, ports.workflow).completed[f"token-{attempt}"]
        assert run["exit_code"] is None and run["interrupted"] is True  # it was spot
        # Taken as a lost node, not a spot reclaim: each loss uses one of max_retries.
        released = service.release(job_id, {"run": {**run, "interrupted": False}})
        if attempt < SPEC_MAX_RETRIES:
            assert released["requeue"] is True
            service.requeue(job_id)
            assert ports.jobs.get(job_id).retries == attempt + 1
        else:
            assert released["requeue"] is False
    summary = service.record_outcome(job_id, {"run": {"exit_code": None, "reason": "lost"}})
    assert summary["status"] == "FAILED"


SPEC_MAX_RETRIES = 3


@pytest.mark.parametrize(("policy", "status"), [("flag", "SUCCEEDED"), ("release", "CANCELLED")])
def test_idle_gpus_flag_the_job_and_release_it_when_its_spec_says(policy: str, status: str) -> None:
    ports = local_ports()
    key = "jobs/idle.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML + f"on_idle: {policy}\n".encode()
    job_id = IntakeService(ports).submit_object(key, key, key).job_id
    service = build_lifecycle(ports, SETTINGS)
    _, launched = run_to_launch(service, job_id)
    assert launched.launched and job_id in cast(RecordingAlarms, ports.alarms).created
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.await_node(job_id, "token")
    service.node_report(started(job_id, instance))

    assert service.gpus_idle(job_id) == ["low-utilization"]
    control = cast(InMemoryObjects, ports.objects).objects[control_key(job_id)]
    assert (b"checkpoint" in control) is (policy == "release")
    service.node_report(finished(job_id, instance))
    run = cast(RecordingWorkflow, ports.workflow).completed["token"]
    assert service.release(job_id, {"run": run})["requeue"] is False
    assert job_id in cast(RecordingAlarms, ports.alarms).deleted
    summary = service.record_outcome(job_id, {"run": run})
    assert summary["status"] == status


def test_alarm_names_round_trip() -> None:
    from gpufleet.adapters.aws.alarms import alarm_name, parse_alarm_name

    name = alarm_name("j-0123456789abcdef0123", "idle")
    assert parse_alarm_name(name) == ("j-0123456789abcdef0123", "idle")
    assert parse_alarm_name("someone-elses-alarm") is None


def test_an_overheating_gpu_alerts_the_operators_and_moves_the_job_elsewhere() -> None:
    service, ports, job_id = lifecycle_with_job()
    run_to_launch(service, job_id)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.await_node(job_id, "token")
    service.node_report(started(job_id, instance))
    assert service.gpus_hot(job_id) == ["overheating"]
    [(subject, message)] = cast(RecordingNotifier, ports.notifier).sent
    assert "overheating" in subject and instance in message
    service.node_report(finished(job_id, instance))
    run = cast(RecordingWorkflow, ports.workflow).completed["token"]
    assert service.release(job_id, {"run": run})["requeue"] is True  # resumes elsewhere
    service.requeue(job_id)
    assert ports.jobs.get(job_id).status is JobStatus.QUEUED
