"""Held children are cheap for a pass (docs/arrays.md): a job that waits for a dependency is held
on it, out of its stream, so a pass reads none of the jobs held, only one item and one record a
dependency; the dependency's end moves them back, in batches, and a move cut short is finished
by the next pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import TypeAdapter

from gpufleet.adapters.local.memory import InMemoryJobQueue, InMemoryJobStore, in_memory_ports
from gpufleet.domain.arrays import child_job_id
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import Job, JobChanges, JobStatus
from gpufleet.domain.queueing import QueuedJob, QueuePolicy, TeamQuota
from gpufleet.domain.spec import Dependency
from gpufleet.errors import TransientError
from gpufleet.ports import Ports, QueueEntry
from gpufleet.services.dispatcher import MOVED_PER_PASS
from gpufleet.services.factory import build_dispatcher, build_intake, build_lifecycle
from tests.helpers import make_settings, plan_of, sent_as

POLICY = QueuePolicy(
    max_gpus=8, max_instances=8, reserve_share=0.0, teams={"vision": TeamQuota(gpus=8)}
)
SETTINGS = make_settings(config=FleetConfig(queue=POLICY))
QUEUED = TypeAdapter(QueuedJob)


class CountingJobStore(InMemoryJobStore):
    """Counts the job records read (one a `get`, one a status of `statuses`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records_read = 0

    def get(self, job_id: str) -> Job:
        self.records_read += 1
        return super().get(job_id)

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        self.records_read += len(job_ids)
        return super().statuses(job_ids)


def spec(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "vision",
        "image": "img:1",
        "command": ["python"],
        "resources": {"gpus": 1},
        **fields,
    }


class World:
    def __init__(self, document: object) -> None:
        self.jobs = CountingJobStore()
        self.ports: Ports = in_memory_ports(jobs=self.jobs)
        lifecycle = build_lifecycle(self.ports, SETTINGS)
        self.dispatcher = build_dispatcher(self.ports, SETTINGS, lifecycle)
        intake = build_intake(self.ports, SETTINGS, lifecycle)
        outcome = intake.submit_document(document, "d-1", "event:d-1", sent_as("vision"))
        assert outcome.accepted, outcome.error
        self.ids = {self.ports.jobs.get(i).name: i for i in outcome.job_ids}

    def enqueue(self, name: str) -> bool:
        """The workflow's Enqueue task of a plain job."""
        job_id = self.ids[name]
        state = self.ports.workflow.inputs[job_id]  # type: ignore[attr-defined]
        queued = QUEUED.validate_python(state["queued"])
        return self.dispatcher.enqueue(queued, f"t-{job_id}", plan_of(self.ports, job_id))

    def end(self, name: str, status: JobStatus) -> None:
        self._end(self.ids[name], status)

    def end_child(self, name: str, index: int, status: JobStatus) -> None:
        """A running child of the array `name` ends."""
        self.ports.jobs.transition(child_job_id(self.ids[name], index), status, 0.0)

    def _end(self, job_id: str, status: JobStatus) -> None:
        for step in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            self.ports.jobs.transition(job_id, step, 0.0)
        self.ports.jobs.transition(job_id, status, 0.0, JobChanges(cost_usd=1.0))
        self.ports.queue.release(job_id)

    def held(self) -> int:
        return sum(e.held_on is not None for e in self.ports.queue.waiting())

    def reads_of_a_pass(self) -> tuple[int, int]:
        """Queue items and job records one pass reads."""
        records = self.jobs.records_read
        result = self.dispatcher.run_pass()
        return result.items_read, self.jobs.records_read - records


def prep_and_train(size: int, on: str = "success") -> dict[str, Any]:
    train = spec("train", array={"size": size}, depends_on=[{"job": "prep", "on": on}])
    return {"jobs": [spec("prep"), train]}


@pytest.mark.parametrize("size", [10, 5000])
def test_a_pass_reads_no_held_child_however_many_wait_on_one_job(size: int) -> None:
    world = World(prep_and_train(size))
    assert world.enqueue("prep")  # nothing waits in a stream: admitted as it arrives
    world.ports.queue.note_launch(world.ids["prep"], 0.0, None)  # its launch heard of it
    assert world.held() == size
    # One hold in the state; prep's record read once; no child read: the same for 10 or 5,000.
    assert world.reads_of_a_pass() == (0, 1)
    assert world.reads_of_a_pass() == (0, 1)


def test_the_end_of_the_dependency_moves_its_held_children_back_in_batches() -> None:
    size = MOVED_PER_PASS + 200
    world = World(prep_and_train(size))
    world.enqueue("prep")
    world.end("prep", JobStatus.SUCCEEDED)
    first = world.dispatcher.run_pass()
    assert first.released == MOVED_PER_PASS
    assert first.admitted == [child_job_id(world.ids["train"], i) for i in range(8)]
    second = world.dispatcher.run_pass()
    assert second.released == 200 and world.held() == 0
    assert world.ports.queue.state().holds == frozenset()  # the hold is forgotten


def test_held_children_of_a_dependency_that_failed_end_cancelled() -> None:
    world = World(prep_and_train(3))
    world.enqueue("prep")
    world.end("prep", JobStatus.FAILED)
    result = world.dispatcher.run_pass()
    assert result.released == 3 and result.admitted == []
    assert set(result.cancelled) == {child_job_id(world.ids["train"], i) for i in range(3)}


def test_a_child_released_by_one_dependency_is_held_on_the_next() -> None:
    train = spec("train", array={"size": 4}, depends_on=[{"job": "a"}, {"job": "b"}])
    world = World({"jobs": [spec("a"), spec("b"), train]})
    world.enqueue("a")
    world.enqueue("b")
    world.end("a", JobStatus.SUCCEEDED)
    assert world.dispatcher.run_pass().released == 4
    state = world.ports.queue.state()
    assert state.holds == {Dependency(job=world.ids["b"])} and world.held() == 4
    world.end("b", JobStatus.SUCCEEDED)
    assert len(world.dispatcher.run_pass().admitted) == 4


@pytest.mark.parametrize("size", [10, 5000])
def test_children_that_wait_element_by_element_are_held_each_on_its_element(size: int) -> None:
    train = spec("train", array={"size": size}, depends_on=[{"job": "prep", "mode": "element"}])
    world = World({"jobs": [spec("prep", array={"size": size}), train]})
    prep = world.ids["prep"]
    for i in range(size):  # prep's children run, out of the queue
        child = child_job_id(prep, i)
        world.ports.queue.remove(child)
        for step in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            world.ports.jobs.transition(child, step, 0.0)
    assert world.held() == size
    # No child of train in a stream: a pass reads no queue item, and one status an element
    # (in batches of 100: world.jobs.statuses).
    assert world.reads_of_a_pass() == (0, size)
    world.end_child("prep", 3, JobStatus.SUCCEEDED)
    result = world.dispatcher.run_pass()
    assert result.released == 1 and result.admitted == [child_job_id(world.ids["train"], 3)]
    world.end_child("prep", 4, JobStatus.FAILED)
    result = world.dispatcher.run_pass()
    assert list(result.cancelled) == [child_job_id(world.ids["train"], 4)]
    assert world.held() == size - 2


class CrashingQueue(InMemoryJobQueue):
    """Its first move of held jobs moves part of them, then the dispatcher dies."""

    crashed = False

    def move_held(self, dependency: Dependency, entries: Sequence[QueueEntry]) -> int:
        if self.crashed:
            return super().move_held(dependency, entries)
        self.crashed = True
        super().move_held(dependency, entries[:2])
        raise TransientError("the dispatcher's Lambda timed out")


def test_a_move_cut_short_by_a_crash_is_finished_by_the_next_pass() -> None:
    world = World(prep_and_train(5))
    crashing = CrashingQueue(world.jobs)
    for entry in world.ports.queue.waiting():
        crashing.enqueue(entry)
    world.ports.queue = crashing
    world.dispatcher = build_dispatcher(
        world.ports, SETTINGS, build_lifecycle(world.ports, SETTINGS)
    )
    world.enqueue("prep")
    world.end("prep", JobStatus.SUCCEEDED)
    with pytest.raises(TransientError):
        world.dispatcher.run_pass()
    assert world.held() == 3  # two went back before the crash; none lost
    again = world.dispatcher.run_pass()
    assert again.released == 3 and len(again.admitted) == 5 and world.held() == 0
