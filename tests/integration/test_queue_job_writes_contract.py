"""The writes that span the job store and the queue keep the same promises on DynamoDB (moto,
one transaction across the two tables) and in memory: all or nothing, and only while the
job and its share are as the caller saw them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.adapters.local.memory import InMemoryJobQueue, InMemoryJobStore
from gpufleet.domain.arrays import holds_settled_by
from gpufleet.domain.fair_share import UsageCharge, charge, usage_by_team
from gpufleet.domain.job import Job, JobChanges, JobStatus, Placement
from gpufleet.domain.queueing import QueuedJob, RunningJob
from gpufleet.domain.spec import Dependency, DependencyMode, Priority, parse_spec
from gpufleet.emulator.account import Account
from gpufleet.ports import (
    AdmissionLimits,
    Freed,
    JobQueue,
    JobStore,
    QueueEntry,
    RunningShare,
    StatusChange,
)
from gpufleet.topology import JOBS_TABLE
from tests.integration.test_queue_contract import dynamo_queue

NOW = 1_767_225_600.0
SPEC = parse_spec("name: t\nteam: ml\nimage: img\ncommand: [x]\nresources: {gpus: 2}\n")
UNBOUNDED = AdmissionLimits(max_gpus=10_000, max_instances=10_000, team_gpus=None)
SHARE = RunningShare("ml", 2, 1)


@dataclass
class Stores:
    jobs: JobStore
    queue: JobQueue


@pytest.fixture(params=["dynamodb", "memory"])
def stores(request: pytest.FixtureRequest, account: Account) -> Iterator[Stores]:
    if request.param == "memory":
        jobs = InMemoryJobStore()
        yield Stores(jobs, InMemoryJobQueue(jobs))
        return
    client = account.client("dynamodb")
    jobs_table = account.table_names[JOBS_TABLE.construct_id]
    yield Stores(DynamoJobStore(client, jobs_table), dynamo_queue(client, jobs_table))


def queued(stores: Stores) -> Job:
    job = Job(
        job_id=f"j-{uuid.uuid4().hex[:20]}",
        status=JobStatus.QUEUED,
        spec=SPEC,
        source="test",
        created_at=NOW,
        updated_at=NOW,
    )
    assert stores.jobs.put_new(job)
    return job


def entry_of(job: Job) -> QueueEntry:
    return QueueEntry(
        QueuedJob(job.job_id, "ml", Priority.NORMAL, 2, 1, job.created_at), "token", NOW
    )


def admitted(stores: Stores, job: Job) -> None:
    item = entry_of(job)
    running = RunningJob(job.job_id, "ml", Priority.NORMAL, 2, 1, NOW)
    assert stores.queue.admit(item, running, UNBOUNDED, waiting=False)


def placement() -> Placement:
    return Placement(
        instance_ids=["i-0a", "i-0b"],
        instance_type="g6.12xlarge",
        capacity_type="spot",
        zone="us-east-1a",
        hourly_usd=2.0,
        launched_at=NOW,
    )


def test_a_job_that_ended_is_neither_queued_nor_admitted_on_arrival(stores: Stores) -> None:
    job = queued(stores)
    stores.jobs.transition(job.job_id, JobStatus.CANCELLED, NOW + 1)
    item = entry_of(job)
    running = RunningJob(job.job_id, "ml", Priority.NORMAL, 2, 1, NOW)
    assert not stores.queue.admit(item, running, UNBOUNDED, waiting=False)
    assert not stores.queue.enqueue(item)
    state = stores.queue.state()
    assert state.running == [] and sum(state.waiting.values()) == 0
    assert stores.queue.waiting() == []


def test_a_job_admitted_on_arrival_holds_its_share_without_a_queue_entry(stores: Stores) -> None:
    job = queued(stores)
    admitted(stores, job)
    state = stores.queue.state()
    assert [r.job.job_id for r in state.running] == [job.job_id]
    assert state.gpus_held == 2 and sum(state.waiting.values()) == 0
    # The caps are conditions of that write too.
    other = queued(stores)
    running = RunningJob(other.job_id, "ml", Priority.NORMAL, 2, 1, NOW)
    assert not stores.queue.admit(
        entry_of(other), running, AdmissionLimits(3, 100, None), waiting=False
    )


def test_a_launch_moves_the_job_and_notes_its_cost_in_one_write(stores: Stores) -> None:
    job = queued(stores)
    admitted(stores, job)
    change = StatusChange(
        job.job_id,
        JobStatus.LAUNCHING,
        frozenset({JobStatus.QUEUED}),
        NOW + 2,
        JobChanges(placement=placement(), attempts=1),
    )
    assert stores.queue.record_launch(change, 4.5, NOW + 3600)
    stored = stores.jobs.get(job.job_id)
    assert stored.status is JobStatus.LAUNCHING and stored.placement == placement()
    [running] = stores.queue.state().running
    assert running.notified and running.job.hourly_usd == 4.5 and running.job.stop_at == NOW + 3600
    # Again, from a status the job has left: nothing is written.
    assert not stores.queue.record_launch(change, 9.0, None)
    assert stores.queue.state().running[0].job.hourly_usd == 4.5


def test_a_launch_of_a_job_whose_share_was_released_writes_nothing(stores: Stores) -> None:
    job = queued(stores)
    change = StatusChange(
        job.job_id,
        JobStatus.LAUNCHING,
        frozenset({JobStatus.QUEUED}),
        NOW + 2,
        JobChanges(attempts=1),
    )
    assert not stores.queue.record_launch(change, 1.0, None)
    assert stores.jobs.get(job.job_id).status is JobStatus.QUEUED


def running_job(stores: Stores) -> Job:
    job = queued(stores)
    admitted(stores, job)
    stores.jobs.transition(
        job.job_id, JobStatus.LAUNCHING, NOW + 1, JobChanges(placement=placement())
    )
    return stores.jobs.transition(job.job_id, JobStatus.RUNNING, NOW + 2, holding="i-0b")


def ended(job: Job, at: float = NOW + 100) -> StatusChange:
    return StatusChange(
        job.job_id,
        JobStatus.SUCCEEDED,
        frozenset({JobStatus.RUNNING}),
        at,
        JobChanges(released_at=at, cost_usd=0.05),
        version=job.version,
    )


def release(
    stores: Stores,
    job: Job,
    share: RunningShare = SHARE,
    *,
    charged: UsageCharge | None = None,
    array_id: str | None = None,
) -> Freed | None:
    settles = holds_settled_by(job.job_id, array_id)
    return stores.queue.record_release(ended(job), share, charged, settles=settles)


def test_a_release_ends_the_job_and_frees_its_share_in_one_write(stores: Stores) -> None:
    job = running_job(stores)
    assert release(stores, job) is Freed.NOBODY_WAITS
    stored = stores.jobs.get(job.job_id)
    assert stored.status is JobStatus.SUCCEEDED and stored.cost_usd == 0.05
    state = stores.queue.state()
    assert state.running == [] and state.gpus_held == 0
    assert release(stores, job) is None  # released already


def test_a_release_charges_the_run_to_its_team_in_the_same_write(stores: Stores) -> None:
    job = running_job(stores)
    run = charge(2.0, NOW + 100, 3600.0)
    assert release(stores, job, charged=run) is Freed.NOBODY_WAITS
    assert release(stores, job, charged=run) is None  # nothing charged twice
    usage = usage_by_team(stores.queue.state().team_usage, NOW + 3700, 3600.0)
    assert usage == {SHARE.team: pytest.approx(1.0)}


def test_a_release_says_when_jobs_wait_for_the_share(stores: Stores) -> None:
    job = running_job(stores)
    waiting = queued(stores)
    assert stores.queue.enqueue(entry_of(waiting))
    assert release(stores, job) is Freed.OTHERS_WAIT
    assert stores.jobs.get(job.job_id).status is JobStatus.SUCCEEDED
    assert stores.queue.state().gpus_held == 0


ARRAY_ID = "j-" + "a" * 20


@pytest.mark.parametrize("held_on", ["the job", "the job as an element", "its array"])
def test_a_release_says_when_jobs_are_held_on_its_end(stores: Stores, held_on: str) -> None:
    job = running_job(stores)
    dependency = {
        "the job": Dependency(job=job.job_id),
        "the job as an element": Dependency(job=job.job_id, mode=DependencyMode.ELEMENT),
        "its array": Dependency(job=ARRAY_ID, on="any"),
    }[held_on]
    dependant = queued(stores)
    assert stores.queue.enqueue(replace(entry_of(dependant), held_on=dependency))
    assert release(stores, job, array_id=ARRAY_ID) is Freed.OTHERS_WAIT
    assert stores.jobs.get(job.job_id).status is JobStatus.SUCCEEDED
    state = stores.queue.state()
    assert state.gpus_held == 0 and state.holds == {dependency}  # the pass moves it


@pytest.mark.parametrize("why", ["held on another job", "held no more"])
def test_a_release_nobody_is_held_on_wakes_no_pass(stores: Stores, why: str) -> None:
    job = running_job(stores)
    other = Dependency(job=job.job_id if why == "held no more" else "j-" + "b" * 20)
    dependant = queued(stores)
    assert stores.queue.enqueue(replace(entry_of(dependant), held_on=other))
    if why == "held no more":  # cancelled while held: its hold counts none
        assert stores.queue.remove(dependant.job_id) is not None
    assert release(stores, job) is Freed.NOBODY_WAITS
    assert stores.jobs.get(job.job_id).status is JobStatus.SUCCEEDED


@pytest.mark.parametrize("why", ["the job changed since", "the share is not what it holds"])
def test_a_release_from_a_stale_view_writes_nothing(stores: Stores, why: str) -> None:
    job = running_job(stores)
    share = SHARE
    if why == "the job changed since":
        stores.jobs.update(job.job_id, NOW + 50, JobChanges(drain_reason="preempted"))
    else:
        share = RunningShare("ml", 4, 1)  # resized since its admission
    assert release(stores, job, share) is None
    assert stores.jobs.get(job.job_id).status is JobStatus.RUNNING
    assert [r.job.job_id for r in stores.queue.state().running] == [job.job_id]


def test_the_state_tells_until_when_the_latest_shortage_is_remembered(stores: Stores) -> None:
    assert stores.queue.state().shortages_until == 0.0
    stores.queue.note_shortage(NOW + 300)
    stores.queue.note_shortage(NOW + 100)  # an earlier expiry does not shorten it
    assert stores.queue.state().shortages_until == NOW + 300
