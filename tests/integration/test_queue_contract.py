"""The admission queue: DynamoDB (moto) and in-memory keep the same promises, including under
concurrent dispatchers: no job admitted twice, no cap or quota exceeded."""

from __future__ import annotations

import random
import threading
import uuid

import pytest

from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.local.memory import InMemoryJobQueue
from gpufleet.domain.queueing import (
    Booking,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    admission_order,
)
from gpufleet.domain.spec import Priority
from gpufleet.emulator.account import Account
from gpufleet.ports import AdmissionLimits, JobQueue, QueueEntry
from gpufleet.topology import QUEUE_TABLE

NOW = 1_767_225_600.0
POLICY = QueuePolicy(aging_per_hour=0.5)
UNBOUNDED = AdmissionLimits(max_gpus=10_000, max_instances=10_000, team_gpus=None)


@pytest.fixture(params=["dynamodb", "memory"])
def queue(request: pytest.FixtureRequest, account: Account) -> JobQueue:
    if request.param == "memory":
        return InMemoryJobQueue()
    # A table of its own per test: the module shares one account.
    name = f"queue-{uuid.uuid4().hex[:8]}"
    account.client("dynamodb").create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    )
    assert QUEUE_TABLE.partition_key == "pk" and QUEUE_TABLE.sort_key == "sk"
    return DynamoJobQueue(account.client("dynamodb"), name)


def entry(
    job_id: str,
    priority: Priority = Priority.NORMAL,
    gpus: int = 1,
    team: str = "t",
    waited: float = 0.0,
) -> QueueEntry:
    return QueueEntry(
        QueuedJob(job_id, team, priority, gpus, 1, NOW - waited), f"token-{job_id}", queued_at=NOW
    )


def running(item: QueueEntry) -> RunningJob:
    job = item.job
    return RunningJob(job.job_id, job.team, job.priority, job.gpus, job.instances, NOW)


def test_candidates_come_best_first_across_shards_and_classes(queue: JobQueue) -> None:
    rng = random.Random(7)
    entries = [
        entry(f"j{i:03d}", rng.choice(list(Priority)), waited=rng.uniform(0, 8 * 3600))
        for i in range(60)
    ]
    for item in entries:
        queue.enqueue(item)
    expected = [j.job_id for j in admission_order([e.job for e in entries], NOW, POLICY)]
    got = [c.job.job_id for c in queue.candidates(NOW, POLICY, limit=15)]
    assert got == expected[:15]
    assert {w.job.job_id for w in queue.waiting()} == {e.job.job_id for e in entries}


def test_admission_moves_a_job_once_and_release_gives_its_share_back(queue: JobQueue) -> None:
    item = entry("j-a", gpus=4)
    queue.enqueue(item)
    assert queue.admit(item, running(item), UNBOUNDED)
    assert not queue.admit(item, running(item), UNBOUNDED)  # already admitted
    assert [r.job.job_id for r in queue.running()] == ["j-a"]
    assert queue.running()[0].notified is False
    queue.mark_notified("j-a")
    assert queue.running()[0].notified is True
    assert queue.waiting() == []
    assert queue.mark_draining("j-a", "j-b")
    assert not queue.mark_draining("j-a", "j-c")  # already draining
    assert queue.running()[0].job.draining_for == "j-b"
    assert queue.release("j-a")
    assert not queue.release("j-a")  # a second release changes nothing
    assert queue.running() == []


def test_caps_and_team_quota_are_conditions_of_the_write(queue: JobQueue) -> None:
    first, second = entry("j-1", gpus=6), entry("j-2", gpus=6)
    queue.enqueue(first)
    queue.enqueue(second)
    limits = AdmissionLimits(max_gpus=100, max_instances=100, team_gpus=10)
    assert queue.admit(first, running(first), limits)
    assert not queue.admit(second, running(second), limits)  # the team would hold 12 > 10
    assert not queue.admit(second, running(second), AdmissionLimits(8, 100, None))  # global cap
    queue.release("j-1")
    assert queue.admit(second, running(second), limits)


def test_remove_takes_a_waiting_job_out_once(queue: JobQueue) -> None:
    item = entry("j-x")
    queue.enqueue(item)
    removed = queue.remove("j-x")
    assert removed is not None and removed.task_token == "token-j-x"
    assert queue.remove("j-x") is None
    assert not queue.admit(item, running(item), UNBOUNDED)


def test_bookings_round_trip(queue: JobQueue) -> None:
    booking = Booking("b-1", "nlp", 8, NOW, NOW + 3600)
    queue.book(booking)
    assert queue.bookings() == [booking]


def test_concurrent_dispatchers_never_admit_twice_or_exceed_the_quota(queue: JobQueue) -> None:
    items = [entry(f"j-{i}", gpus=2, team="vision") for i in range(20)]
    for item in items:
        queue.enqueue(item)
    limits = AdmissionLimits(max_gpus=100, max_instances=100, team_gpus=16)  # room for 8 jobs
    admitted: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def dispatcher(seed: int) -> None:
        order = items[:]
        random.Random(seed).shuffle(order)
        barrier.wait()
        for item in order:
            if queue.admit(item, running(item), limits):
                with lock:
                    admitted.append(item.job.job_id)

    threads = [threading.Thread(target=dispatcher, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == len(set(admitted)) == 8
    assert sum(r.job.gpus for r in queue.running()) == 16
    assert len(queue.waiting()) == 12
