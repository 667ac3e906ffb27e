"""The admission queue: DynamoDB (moto) and in-memory keep the same promises, including under
concurrent dispatchers: no job admitted twice, no cap or quota exceeded."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

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
from gpufleet.ports import AdmissionLimits, JobQueue, QueueEntry, QueueState
from gpufleet.topology import QUEUE_TABLE

NOW = 1_767_225_600.0
POLICY = QueuePolicy(aging_per_hour=0.5)
UNBOUNDED = AdmissionLimits(max_gpus=10_000, max_instances=10_000, team_gpus=None)


@pytest.fixture(params=["dynamodb", "memory"])
def queue(request: pytest.FixtureRequest, account: Account) -> JobQueue:
    if request.param == "memory":
        return InMemoryJobQueue()
    return dynamo_queue(account.client("dynamodb"))


def dynamo_queue(client: Any, jobs_table: str | None = None) -> DynamoJobQueue:
    # A table of its own per test: the module shares one account.
    name = f"queue-{uuid.uuid4().hex[:8]}"
    client.create_table(
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
    return DynamoJobQueue(client, name, jobs_table=jobs_table)


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
    assert [r.job.job_id for r in queue.state().running] == ["j-a"]
    assert queue.state().running[0].notified is False
    queue.note_launch("j-a", 12.5, None)  # its launch: the workflow evidently heard
    assert queue.state().running[0].notified is True
    assert queue.state().running[0].job.hourly_usd == 12.5
    assert queue.waiting() == []
    assert queue.mark_draining("j-a", "j-b")
    assert not queue.mark_draining("j-a", "j-c")  # already draining
    assert queue.state().running[0].job.draining_for == "j-b"
    assert queue.release("j-a")
    assert not queue.release("j-a")  # a second release changes nothing
    assert queue.state().running == []


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
    assert queue.state().bookings == [booking]


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
    state = queue.state()
    assert sum(r.job.gpus for r in state.running) == 16 == state.gpus_held
    assert len(queue.waiting()) == 12 == waiting_by_class(state)[Priority.NORMAL]


# -- the state a pass starts from ----------------------------------------------------------------


def waiting_by_class(state: QueueState) -> dict[Priority, int]:
    return {priority: state.waiting.get(priority, 0) for priority in Priority}


def test_the_state_counts_waiting_jobs_by_class_through_enqueue_admit_and_remove(
    queue: JobQueue,
) -> None:
    items = [
        entry("j-h1", Priority.HIGH),
        entry("j-h2", Priority.HIGH),
        entry("j-n1", Priority.NORMAL),
        entry("j-l1", Priority.LOW),
    ]
    for item in items:
        queue.enqueue(item)
    counts = {Priority.CRITICAL: 0, Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 1}
    assert waiting_by_class(queue.state()) == counts

    assert queue.admit(items[0], running(items[0]), UNBOUNDED)
    assert not queue.admit(items[0], running(items[0]), UNBOUNDED)  # counted once
    assert not queue.admit(items[2], running(items[2]), AdmissionLimits(0, 100, None))  # no room
    assert queue.remove("j-l1") is not None
    assert queue.remove("j-l1") is None  # removed once, counted once
    counts.update({Priority.HIGH: 1, Priority.LOW: 0})
    assert waiting_by_class(queue.state()) == counts

    queue.enqueue(items[3])  # back again (a requeue)
    assert waiting_by_class(queue.state())[Priority.LOW] == 1


def test_a_job_enqueued_again_while_it_waits_is_counted_once(queue: JobQueue) -> None:
    first = entry("j-again", Priority.HIGH)
    queue.enqueue(first)
    # Its Enqueue task ran again (a retry): the new token replaces the old one.
    again = QueueEntry(first.job, "token-retried", queued_at=NOW + 5)
    queue.enqueue(again)
    assert waiting_by_class(queue.state())[Priority.HIGH] == 1
    [waiting] = queue.waiting()
    assert waiting.task_token == "token-retried"
    assert queue.admit(again, running(again), UNBOUNDED)
    assert waiting_by_class(queue.state())[Priority.HIGH] == 0


def test_a_job_enqueued_again_after_its_admission_hands_the_admission_to_the_new_token(
    queue: JobQueue,
) -> None:
    # The Enqueue attempt that wrote the entry crashed; a pass admitted the job under its token
    # before the retry (with a new token) came: the retry must not queue the job a second time.
    first = entry("j1")
    queue.enqueue(first)
    assert queue.admit(first, running(first), UNBOUNDED)
    queue.note_launch("j1", 1.0, None)  # as if told; the retry makes it untold again
    queue.enqueue(QueueEntry(first.job, "token-retry", queued_at=NOW + 1))
    state = queue.state()
    [admitted] = state.running
    assert (admitted.task_token, admitted.notified) == ("token-retry", False)
    assert sum(waiting_by_class(state).values()) == 0
    assert queue.candidates(NOW, POLICY, 10) == []
    assert queue.release("j1") and queue.state().running == []


def test_a_notice_is_first_only_once_per_key(queue: JobQueue) -> None:
    assert queue.first_notice("team-budget#ml#1764547200")
    assert not queue.first_notice("team-budget#ml#1764547200")
    assert queue.first_notice("team-budget#ml#1767225600")  # next month: told again
    assert queue.state().running == [] and queue.waiting() == []  # kept apart from the queue


def test_candidates_of_given_classes_come_only_from_those_classes(queue: JobQueue) -> None:
    rng = random.Random(11)
    entries = [
        entry(f"j{i:03d}", rng.choice(list(Priority)), waited=rng.uniform(0, 8 * 3600))
        for i in range(40)
    ]
    for item in entries:
        queue.enqueue(item)
    classes = {Priority.HIGH, Priority.LOW}
    wanted = [e.job for e in entries if e.job.priority in classes]
    expected = [j.job_id for j in admission_order(wanted, NOW, POLICY)]
    got = queue.candidates(NOW, POLICY, limit=10, classes=classes)
    assert [c.job.job_id for c in got] == expected[:10]
    assert queue.candidates(NOW, POLICY, limit=10, classes=[]) == []
    everything = [j.job_id for j in admission_order([e.job for e in entries], NOW, POLICY)]
    assert [c.job.job_id for c in queue.candidates(NOW, POLICY, limit=10)] == everything[:10]


def test_gpus_held_follow_admissions_and_releases(queue: JobQueue) -> None:
    assert queue.state().gpus_held == 0
    big, small = entry("j-big", gpus=8, team="a"), entry("j-small", gpus=2, team="b")
    for item in (big, small):
        queue.enqueue(item)
        assert queue.admit(item, running(item), UNBOUNDED)
    assert queue.state().gpus_held == 10
    assert queue.release("j-big")
    assert not queue.release("j-big")
    state = queue.state()
    assert state.gpus_held == 2 and [r.job.job_id for r in state.running] == ["j-small"]


# -- DynamoDB only: a transaction another one got in the way of ----------------------------------


def conflict_once(client: Any) -> None:
    """Make the next TransactWriteItems fail as DynamoDB fails one that collides with another
    transaction on the same item (here, the usage item every enqueue, admission and release
    writes): TransactionCanceledException with a TransactionConflict reason."""

    def cancel(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        client.meta.events.unregister("before-call.dynamodb.TransactWriteItems", cancel)
        # The queue item and the usage item, in that order: the usage item collided.
        reasons = [
            {"Code": "None"},
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"},
        ]
        parsed = {
            "Error": {
                "Code": "TransactionCanceledException",
                "Message": "Transaction cancelled, please refer cancellation reasons for "
                f"specific reasons [{', '.join(r['Code'] for r in reasons)}]",
            },
            "CancellationReasons": reasons,
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
        return AWSResponse("https://dynamodb", 400, {}, None), parsed

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", cancel)


def test_an_enqueue_that_collides_with_another_transaction_still_counts_the_job(
    account: Account,
) -> None:
    client = account.client("dynamodb")
    queue = dynamo_queue(client)
    queue.enqueue(entry("j-first", Priority.LOW))  # the usage item exists
    conflict_once(client)
    queue.enqueue(entry("j-collided", Priority.HIGH))
    assert {w.job.job_id for w in queue.waiting()} == {"j-first", "j-collided"}
    assert waiting_by_class(queue.state())[Priority.HIGH] == 1


def test_a_remove_that_collides_with_another_transaction_still_removes_the_job(
    account: Account,
) -> None:
    client = account.client("dynamodb")
    queue = dynamo_queue(client)
    queue.enqueue(entry("j-cancelled"))
    conflict_once(client)
    removed = queue.remove("j-cancelled")
    assert removed is not None and queue.waiting() == []
