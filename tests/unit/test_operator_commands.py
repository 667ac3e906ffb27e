"""Operator commands (`gpufleet resize`, `cancel`, `book`) are judged as submissions are: what
cannot be carried out is refused, in words, before anything changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from pydantic import ValidationError

from gpufleet.adapters.local.memory import (
    InMemoryObjects,
    ManualClock,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.cli import main
from gpufleet.domain.job import Job, JobNotFound, JobStatus
from gpufleet.domain.queueing import Booking, BookingRefused, QueuePolicy, TeamQuota
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.spec import Resources
from gpufleet.ports import Ports
from gpufleet.services.bookings import book
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import JobAlreadyEnded
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import WorkflowState
from tests.helpers import enqueue, local_ports, make_settings, plan_of

SETTINGS = make_settings()
SPEC = """name: {name}
team: vision
image: img:1
command: [python, train.py]
resources: {resources}
checkpoint: s3://ckpt/vision/{name}/
"""
ELASTIC = "{gpus: 1, nodes: 2, elastic: {min_nodes: 1, max_nodes: 4}}"


@dataclass
class Fleet:
    ports: Ports
    lifecycle: LifecycleService

    def submit(self, name: str, resources: str = "{gpus: 1}", extra: str = "") -> str:
        key = f"jobs/vision/{name}.yaml"
        body = (SPEC.format(name=name, resources=resources) + extra).encode()
        cast(InMemoryObjects, self.ports.objects).objects[key] = body
        job_id = build_intake(self.ports, SETTINGS, self.lifecycle).submit_object(key, key, key)
        assert job_id.job_id is not None
        return job_id.job_id

    def waiting(self, name: str, **spec: str) -> str:
        job_id = self.submit(name, **spec)
        enqueue(self.lifecycle, self.ports, job_id, f"enqueue-{name}", plan_of(self.ports, job_id))
        return job_id

    def running(self, name: str, **spec: str) -> str:
        job_id = self.submit(name, **spec)
        plan = plan_of(self.ports, job_id)
        assert self.lifecycle.launch(job_id, plan, 0, 0, task_token=f"run-{name}") is None
        placement = self.ports.jobs.get(job_id).placement
        assert placement is not None
        for instance in placement.instance_ids:
            self.lifecycle.node_report(
                NodeReport(job_id=job_id, instance_id=instance, phase="started")
            )
        assert self.ports.jobs.get(job_id).status is JobStatus.RUNNING
        return job_id

    def ended(self, name: str) -> str:
        job_id = self.running(name)
        placement = self.ports.jobs.get(job_id).placement
        assert placement is not None
        for instance in placement.instance_ids:
            self.lifecycle.node_report(
                NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
            )
        self.lifecycle.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))
        assert self.ports.jobs.get(job_id).status is JobStatus.SUCCEEDED
        return job_id

    def snapshot(self) -> dict[str, Any]:
        """Everything an operator's command could change."""
        return {
            "jobs": {job.job_id: job for job in self.ports.jobs.list_jobs()},
            "waiting": self.ports.queue.waiting(),
            "state": self.ports.queue.state(),
            "objects": dict(cast(InMemoryObjects, self.ports.objects).objects),
            "completed": dict(cast(RecordingWorkflow, self.ports.workflow).completed),
            "events": list(cast(RecordingPublisher, self.ports.events).events),
        }


@pytest.fixture
def fleet() -> Fleet:
    ports = local_ports()
    return Fleet(ports, build_lifecycle(ports, SETTINGS))


def refused(fleet: Fleet, command: Callable[[], object], error: type[Exception]) -> str:
    """The refusal `command` raises; it must change nothing."""
    before = fleet.snapshot()
    with pytest.raises(error) as raised:
        command()
    assert fleet.snapshot() == before
    return str(raised.value)


def plan_says(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """What `gpufleet plan` answers for a shape it refuses."""
    capsys.readouterr()
    assert main(["plan", *flags]) == 2
    return capsys.readouterr().err.removeprefix("gpufleet: ").strip()


# -- resize ------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["waiting", "running"])
def test_a_shape_nothing_can_hold_is_refused_with_the_plans_message(
    fleet: Fleet, state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = getattr(fleet, state)("big")
    message = refused(
        fleet,
        lambda: fleet.lifecycle.resize(job_id, {"gpus": 16, "gpu_memory_gib": 200}),
        NoFeasibleOffering,
    )
    assert message == plan_says(capsys, "--gpus", "16", "--gpu-memory-gib", "200")
    assert "16 GPUs with >= 200 GiB" in message


@pytest.mark.parametrize(
    ("shape", "problem"),
    [
        ({"gpus": 17}, "less than or equal to 16"),
        ({"nodes": 65}, "less than or equal to 64"),
        ({"nodes": 5}, "within elastic.min_nodes and elastic.max_nodes"),
        ({"gpus": 0}, "GPUs on every node"),
        ({"elastic": None}, "scale_on scales elastic jobs"),  # its spec's rule, not the shape's
    ],
)
def test_a_resize_keeps_every_cap_of_the_spec(
    fleet: Fleet, shape: dict[str, Any], problem: str
) -> None:
    scale_on = "scale_on: {metric: samples_per_second, below: 1000}\n"
    job_id = fleet.running("elastic", resources=ELASTIC, extra=scale_on)
    message = refused(fleet, lambda: fleet.lifecycle.resize(job_id, shape), ValidationError)
    assert problem in message


def test_a_resize_to_the_shape_the_job_has_changes_nothing(fleet: Fleet) -> None:
    job_id = fleet.running("same")
    before = fleet.snapshot()
    assert fleet.lifecycle.resize(job_id, {"gpus": 1})["status"] == "RUNNING"
    assert fleet.snapshot() == before  # no checkpoint and requeue for nothing


def test_a_feasible_resize_of_a_running_job_still_checkpoints_it(fleet: Fleet) -> None:
    job_id = fleet.running("grow")
    fleet.lifecycle.resize(job_id, {"gpus": 4})
    job = fleet.ports.jobs.get(job_id)
    assert job.resources_override is not None and job.resources_override.gpus == 4
    assert job.drain_reason == "resized"


def test_only_a_live_job_can_be_resized(fleet: Fleet) -> None:
    ended = fleet.ended("done")
    assert "already ended: SUCCEEDED" in refused(
        fleet, lambda: fleet.lifecycle.resize(ended, Resources(gpus=2)), JobAlreadyEnded
    )
    for unknown in ("j-" + "0" * 20, "", "../../x"):
        assert "does not exist" in refused(
            fleet, lambda unknown=unknown: fleet.lifecycle.resize(unknown, {"gpus": 2}), JobNotFound
        )


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_of_an_unknown_or_ended_job_is_refused_and_changes_nothing(fleet: Fleet) -> None:
    ended = fleet.ended("done")
    assert "already ended: SUCCEEDED" in refused(
        fleet, lambda: fleet.lifecycle.cancel(ended), JobAlreadyEnded
    )
    for unknown in ("j-" + "f" * 20, "", "x" * 5000):
        refused(fleet, lambda unknown=unknown: fleet.lifecycle.cancel(unknown), JobNotFound)


def test_a_job_that_ends_while_it_is_cancelled_is_refused_as_ended(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = fleet.running("racing")
    seen_running = fleet.ports.jobs.get(job_id)
    fleet.lifecycle.node_report(
        NodeReport(
            job_id=job_id,
            instance_id=seen_running.placement.instance_ids[0],  # type: ignore[union-attr]
            phase="finished",
            exit_code=0,
        )
    )
    fleet.lifecycle.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 0}}))
    store = fleet.ports.jobs
    read = store.get

    def read_before_the_end(wanted: str) -> Job:
        return seen_running if wanted == job_id else read(wanted)

    # The cancel read the job while it ran; it ended before the cancel's write.
    monkeypatch.setattr(store, "get", read_before_the_end)
    refused(fleet, lambda: fleet.lifecycle.cancel(job_id), JobAlreadyEnded)
    monkeypatch.undo()
    assert store.get(job_id).status is JobStatus.SUCCEEDED


# -- book --------------------------------------------------------------------------------------

HOUR = 3600.0
NOW = ManualClock().now()  # the in-memory fleet's clock
POLICY = QueuePolicy(
    max_gpus=20,
    max_instances=8,
    reserve_share=0.2,  # 4 GPUs for urgent work: 16 can be booked
    teams={"vision": TeamQuota(gpus=8), "nlp": TeamQuota(gpus=8)},
)


@pytest.fixture
def bookings(fleet: Fleet) -> Fleet:
    assert fleet.ports.clock.now() == NOW
    fleet.ports.queue.book(
        Booking("b-existing", "nlp", 10, NOW + 2 * HOUR, NOW + 4 * HOUR), lambda booked: None
    )
    return fleet


@pytest.mark.parametrize(
    ("team", "gpus", "start", "end", "problem"),
    [
        ("vision", 0, NOW + HOUR, NOW + 2 * HOUR, "at least 1 GPU"),
        ("vision", 2, NOW + 2 * HOUR, NOW + HOUR, "must end after it starts"),
        ("vision", 2, NOW + HOUR, NOW + HOUR, "must end after it starts"),
        ("vision", 2, NOW - 2 * HOUR, NOW - HOUR, "ended already"),
        ("speech", 2, NOW + HOUR, NOW + 2 * HOUR, "team 'speech' is not in the config"),
        ("vision", 17, NOW + HOUR, NOW + 2 * HOUR, "the fleet holds 16 GPUs outside the reserve"),
        # 10 of the 16 are booked from NOW + 2h: 7 more do not fit then, though they do before.
        ("vision", 7, NOW + HOUR, NOW + 3 * HOUR, "10 of the 16 GPUs outside the reserve are"),
    ],
)
def test_a_booking_the_fleet_could_never_honour_is_refused(
    bookings: Fleet, team: str, gpus: int, start: float, end: float, problem: str
) -> None:
    message = refused(
        bookings,
        lambda: book(bookings.ports, POLICY, team, gpus, start, end),
        BookingRefused,
    )
    assert problem in message


def test_a_booking_that_fits_beside_the_others_is_made(bookings: Fleet) -> None:
    made = [
        book(bookings.ports, POLICY, "vision", 6, NOW + HOUR, NOW + 3 * HOUR),  # 10 + 6 = 16
        book(bookings.ports, POLICY, "vision", 16, NOW + 4 * HOUR, NOW + 5 * HOUR),  # after it
        book(bookings.ports, POLICY, "vision", 2, NOW - HOUR, NOW + HOUR),  # begun: holds now
    ]
    assert set(bookings.ports.queue.bookings()) >= set(made)
