"""Dependencies between jobs, run (docs/arrays.md): intake stores a submission's jobs with their
dependencies as job ids, and the dispatcher hands the policy a job only once they are met,
cancelling it, never admitted, when one ended as it may not."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from moto.events.models import EventPattern
from pydantic import TypeAdapter

from gpufleet.adapters.local.memory import RecordingPublisher, RecordingWorkflow
from gpufleet.domain.arrays import child_job_id, element_of
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import TERMINAL_STATUSES, JobChanges, JobStatus, job_id_for_delivery
from gpufleet.domain.queueing import QueuedJob, QueuePolicy, TeamQuota
from gpufleet.domain.spec import (
    ELEMENT_WITHOUT_ARRAY,
    Dependency,
    DependencyMode,
    SpecError,
    spec_from_mapping,
)
from gpufleet.ports import Ports
from gpufleet.services.backstop import BackstopService
from gpufleet.services.factory import build_dispatcher, build_intake, build_lifecycle
from gpufleet.services.intake import IntakeOutcome, describe
from gpufleet.services.queue_listing import queue_listing
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    DETAIL_JOB_STATUS_CHANGED,
    HOLDS_ASKED,
    JOB_ENDED_STATUSES,
    RULES,
)
from tests.helpers import local_ports, make_settings, plan_of, sent_as

POLICY = QueuePolicy(
    max_gpus=8, max_instances=8, reserve_share=0.0, teams={"vision": TeamQuota(gpus=8)}
)
SETTINGS = make_settings(config=FleetConfig(queue=POLICY))
# The queue's view of a job, as the workflow's state carries it to Enqueue.
QUEUED = TypeAdapter(QueuedJob)


def job(name: str, gpus: int = 4, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "vision",
        "image": "img:1",
        "command": ["python"],
        "resources": {"gpus": gpus},
        **fields,
    }


class World:
    def __init__(self) -> None:
        self.ports: Ports = local_ports()
        self.lifecycle = build_lifecycle(self.ports, SETTINGS)
        self.dispatcher = build_dispatcher(self.ports, SETTINGS, self.lifecycle)
        self.intake = build_intake(self.ports, SETTINGS, self.lifecycle)
        self.tokens: dict[str, str] = {}

    @property
    def workflow(self) -> RecordingWorkflow:
        return cast(RecordingWorkflow, self.ports.workflow)

    @property
    def events(self) -> RecordingPublisher:
        return cast(RecordingPublisher, self.ports.events)

    def submit(self, document: object, delivery: str = "delivery-1") -> IntakeOutcome:
        return self.intake.submit_document(
            document, delivery, f"event:{delivery}", sent_as("vision")
        )

    def submitted(self, document: object, delivery: str = "delivery-1") -> dict[str, str]:
        """Each job's id by name, the submission accepted."""
        outcome = self.submit(document, delivery)
        assert outcome.accepted, outcome.error
        return {self.ports.jobs.get(job_id).name: job_id for job_id in outcome.job_ids}

    def enqueue(self, job_id: str) -> bool:
        """The workflow's Enqueue task, from the state intake started the workflow with."""
        state = self.workflow.inputs[job_id]
        self.tokens[job_id] = token = f"enqueue-{job_id}"
        return self.dispatcher.enqueue(
            QUEUED.validate_python(state["queued"]), token, plan_of(self.ports, job_id)
        )

    def told(self, job_id: str) -> dict[str, Any] | None:
        """What the job's parked Enqueue task was told (None: nothing yet)."""
        return self.workflow.completed.get(self.tokens[job_id])

    def held(self) -> dict[str, str]:
        """Each job held out of the streams, by the dependency it is held on."""
        return {
            e.job.job_id: e.held_on.job for e in self.ports.queue.waiting() if e.held_on is not None
        }

    def end(self, job_id: str, status: JobStatus) -> None:
        """The job's run ends `status` and its share goes back (as Release writes them)."""
        for step in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            self.ports.jobs.transition(job_id, step, 0.0)
        self.ports.jobs.transition(job_id, status, 0.0, JobChanges(cost_usd=1.0))
        assert self.ports.queue.release(job_id)


def test_intake_stores_each_job_with_its_dependencies_as_ids_derived_from_the_delivery() -> None:
    world = World()
    submission = {"jobs": [job("eval", depends_on=[{"job": "train", "on": "any"}]), job("train")]}
    outcome = world.submit(submission)
    train, evaluation = (world.ports.jobs.get(job_id) for job_id in outcome.job_ids)
    # Each after those it depends on; its id derived from the delivery and its name.
    assert (train.name, evaluation.name) == ("train", "eval")
    assert train.job_id == job_id_for_delivery("delivery-1#train")
    assert evaluation.spec.depends_on == [Dependency(job=train.job_id, on="any")]
    assert describe(outcome) == {
        "accepted": True,
        "job_id": train.job_id,
        "job_ids": [train.job_id, evaluation.job_id],
    }
    assert world.workflow.started == [train.job_id, evaluation.job_id]
    # A redelivery names the same jobs: nothing new is stored or started.
    assert world.submit(submission).job_ids == outcome.job_ids
    assert len(world.ports.jobs.list_jobs()) == 2 and len(world.workflow.started) == 2
    # A submission of one job keeps the id of its delivery.
    (single,) = world.submit(job("solo"), "delivery-2").job_ids
    assert single == job_id_for_delivery("delivery-2")


def test_a_dependency_on_a_job_id_must_name_a_job_that_exists() -> None:
    world = World()
    missing = job_id_for_delivery("never-delivered")
    outcome = world.submit(job("eval", depends_on=[{"job": missing}]))
    assert outcome.error is not None and not outcome.accepted
    assert outcome.error["fields"] == [
        {"field": "depends_on[0]", "message": f"no job {missing} exists"}
    ]
    assert world.ports.jobs.list_jobs() == [] and world.workflow.started == []
    (train,) = world.submit(job("train"), "delivery-2").job_ids
    (evaluation,) = world.submit(job("eval", depends_on=[{"job": train}]), "delivery-3").job_ids
    assert world.ports.jobs.get(evaluation).spec.depends_on == [Dependency(job=train)]


def children(world: World, array_id: str) -> list[str]:
    return [child_job_id(array_id, i) for i in range(world.ports.jobs.get(array_id).spec.size)]


def test_an_arrays_children_start_their_workflow_when_admitted_past_enqueue() -> None:
    world = World()
    ids = world.submitted(job("train", gpus=4, array={"size": 3}))
    kids = children(world, ids["train"])
    assert world.workflow.started == []  # nothing runs before admission: no open execution
    result = world.dispatcher.run_pass()
    assert result.admitted == kids[:2]  # 8 GPUs: two of 4, in index order
    assert world.workflow.started == kids[:2]
    state = world.workflow.inputs[kids[0]]
    assert state["admission"]["admitted"] is True and state["job_id"] == kids[0]
    assert state["plan"] == plan_of(world.ports, kids[0]).model_dump(mode="json")
    # A pass that tells admissions again (the dispatcher died in between) starts nothing twice.
    world.dispatcher.run_pass()
    assert world.workflow.started == kids[:2]
    world.end(kids[0], JobStatus.SUCCEEDED)
    assert world.dispatcher.run_pass().admitted == [kids[2]]


def test_a_plain_job_that_waits_element_by_element_is_refused_at_submission() -> None:
    with pytest.raises(SpecError) as refused:
        spec_from_mapping(job("eval", gpus=1, depends_on=[{"job": "prep", "mode": "element"}]))
    assert [(f.field, f.message) for f in refused.value.fields] == [
        ("depends_on", ELEMENT_WITHOUT_ARRAY)
    ]


def test_a_child_with_an_element_dependency_waits_for_the_child_of_its_index() -> None:
    world = World()
    ids = world.submitted(
        {
            "jobs": [
                job("prep", gpus=1, array={"size": 2}),
                job(
                    "train",
                    gpus=1,
                    array={"size": 2},
                    depends_on=[{"job": "prep", "mode": "element"}],
                ),
            ]
        }
    )
    prep, train = children(world, ids["prep"]), children(world, ids["train"])
    result = world.dispatcher.run_pass()
    assert result.admitted == prep
    # Each held on prep's child of its index, out of the stream: the pass did not read them.
    element = Dependency(job=ids["prep"], mode=DependencyMode.ELEMENT)
    assert result.waiting == {}
    assert world.ports.queue.state().holds == {element_of(element, 0), element_of(element, 1)}
    world.end(prep[1], JobStatus.SUCCEEDED)
    world.end(prep[0], JobStatus.FAILED)
    result = world.dispatcher.run_pass()
    assert result.admitted == [train[1]]
    assert result.cancelled == {train[0]: f"dependency {ids['prep']} ended FAILED"}


def test_a_job_depending_on_an_array_waits_for_every_child() -> None:
    world = World()
    ids = world.submitted(
        {
            "jobs": [
                job("sweep", gpus=1, array={"size": 2}),
                job("eval", depends_on=[{"job": "sweep"}]),
            ]
        }
    )
    first, second = children(world, ids["sweep"])
    world.enqueue(ids["eval"])
    world.dispatcher.run_pass()
    world.end(first, JobStatus.SUCCEEDED)
    assert world.dispatcher.run_pass().released == 0
    assert world.held() == {ids["eval"]: ids["sweep"]}
    world.end(second, JobStatus.SUCCEEDED)
    assert world.dispatcher.run_pass().admitted == [ids["eval"]]


def test_cancelling_an_array_cancels_every_child_not_ended() -> None:
    world = World()
    ids = world.submitted(job("train", gpus=4, array={"size": 3}))
    kids = children(world, ids["train"])
    world.dispatcher.run_pass()  # two admitted (their workflows started), one waits
    world.end(kids[0], JobStatus.SUCCEEDED)
    summary = world.lifecycle.cancel(ids["train"])
    assert summary["status"] == "CANCELLED" and summary["cancelled"] == 2
    statuses = [world.ports.jobs.get(kid).status for kid in kids]
    assert statuses == [JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.CANCELLED]
    assert world.ports.queue.waiting() == [] and world.ports.queue.running() == []
    assert world.workflow.started == kids[:2]  # the waiting child never got a workflow


def test_a_job_waiting_for_its_dependency_holds_no_reservation_and_blocks_no_backfill() -> None:
    world = World()
    ids = world.submitted(
        {
            "jobs": [
                job("train", expected_duration="1h"),
                # The whole fleet, once train is done: were it before the policy, it would
                # hold the reservation, and `other` (ending after train) could not backfill.
                job("eval", gpus=8, depends_on=[{"job": "train"}]),
                job("other", expected_duration="10h"),
            ]
        }
    )
    assert world.enqueue(ids["train"])  # admitted as it arrives: nothing waits
    assert not world.enqueue(ids["eval"])  # held on train, out of the policy's sight
    assert world.held() == {ids["eval"]: ids["train"]}
    assert world.dispatcher.run_pass().admitted == []
    assert world.enqueue(ids["other"])  # only a held job waits: admitted as it arrives
    assert world.told(ids["eval"]) is None
    rows, _ = queue_listing(world.ports, POLICY)
    assert [(row.job_id, row.reason) for row in rows] == [(ids["eval"], "dependencies")]


def test_a_job_runs_once_its_dependency_succeeded() -> None:
    world = World()
    ids = world.submitted({"jobs": [job("train"), job("eval", depends_on=[{"job": "train"}])]})
    world.enqueue(ids["train"])
    world.enqueue(ids["eval"])
    assert world.held() == {ids["eval"]: ids["train"]}
    assert world.dispatcher.run_pass().admitted == []
    world.end(ids["train"], JobStatus.SUCCEEDED)
    result = world.dispatcher.run_pass()
    assert result.released == 1 and world.held() == {}
    assert result.admitted == [ids["eval"]] and result.cancelled == {}
    told = world.told(ids["eval"])
    assert told is not None and told["admitted"] is True


@pytest.mark.parametrize("ended", [JobStatus.FAILED, JobStatus.CANCELLED])
def test_a_job_whose_dependency_did_not_succeed_ends_cancelled_never_admitted(
    ended: JobStatus,
) -> None:
    world = World()
    ids = world.submitted({"jobs": [job("train"), job("eval", depends_on=[{"job": "train"}])]})
    world.enqueue(ids["train"])
    world.enqueue(ids["eval"])
    world.dispatcher.run_pass()
    world.end(ids["train"], ended)
    result = world.dispatcher.run_pass()
    reason = f"dependency {ids['train']} ended {ended.value}"
    assert result.admitted == [] and result.cancelled == {ids["eval"]: reason}
    evaluation = world.ports.jobs.get(ids["eval"])
    assert (evaluation.status, evaluation.failure_reason) == (JobStatus.CANCELLED, reason)
    assert evaluation.placement is None and evaluation.first_admitted_at is None
    assert world.told(ids["eval"]) == {"cancelled": True}  # its workflow ends, nothing ran
    (event,) = [
        e
        for e in world.events.of_type(DETAIL_JOB_STATUS_CHANGED)
        if e["job_id"] == ids["eval"] and e["status"] == "CANCELLED"
    ]
    assert event["reason"] == reason and event["previous"] == "QUEUED"
    assert world.ports.queue.waiting() == [] and world.dispatcher.run_pass().cancelled == {}


def test_a_job_depending_on_any_end_runs_after_a_failure() -> None:
    world = World()
    ids = world.submitted(
        {"jobs": [job("train"), job("eval", depends_on=[{"job": "train", "on": "any"}])]}
    )
    world.enqueue(ids["train"])
    world.enqueue(ids["eval"])
    world.end(ids["train"], JobStatus.FAILED)
    assert world.dispatcher.run_pass().admitted == [ids["eval"]]


def test_a_job_whose_dependency_failed_at_intake_is_cancelled_by_the_pass_its_arrival_wakes() -> (
    None
):
    world = World()
    # More GPUs than the fleet may hold: train is stored FAILED, and no workflow starts.
    ids = world.submitted(
        {"jobs": [job("train", gpus=16), job("eval", depends_on=[{"job": "train"}])]}
    )
    assert world.ports.jobs.get(ids["train"]).status is JobStatus.FAILED
    assert not world.enqueue(ids["eval"])
    assert world.dispatcher.run_pass(full=False).cancelled == {
        ids["eval"]: f"dependency {ids['train']} ended FAILED"
    }


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_a_jobs_end_wakes_a_dispatcher_unless_its_write_asked_for_holds(status: JobStatus) -> None:
    """A dependency may end holding no share (cancelled while it waited): no `Capacity
    Freed` then, but its dependants are judged again all the same. The usual end of a run
    asked in its write whether jobs are held on it, and woke a pass if so (`Capacity Freed`):
    its end wakes none. Matched as the emulator's EventBridge (moto) matches."""
    (rule,) = [r for r in RULES if r.construct_id == "DependencyRule"]
    pattern = EventPattern.load(json.dumps(rule.pattern))
    detail = {"job_id": "j-1", "status": status.value}
    end = {"source": CONTROL_PLANE_SOURCE, "detail-type": DETAIL_JOB_STATUS_CHANGED}
    assert pattern.matches_event({**end, "detail": detail})
    assert not pattern.matches_event({**end, "detail": {**detail, HOLDS_ASKED: True}})
    assert not pattern.matches_event({**end, "detail": {**detail, "status": "RUNNING"}})
    assert set(JOB_ENDED_STATUSES) == {s.value for s in TERMINAL_STATUSES}


def test_the_backstop_leaves_a_child_waiting_in_the_queue_with_no_workflow() -> None:
    world = World()
    ids = world.submitted(job("train", gpus=4, array={"size": 1}))
    (kid,) = children(world, ids["train"])
    live = [world.ports.jobs.get(kid)]
    backstop = BackstopService(world.ports, world.lifecycle)
    assert backstop.abandoned(live, now=1e12, after_seconds=60) == []
    assert world.ports.jobs.get(kid).status is JobStatus.QUEUED
