"""The admission queue: DynamoDB (moto) and in-memory keep the same promises, including under
concurrent dispatchers: no job admitted twice, no cap or quota exceeded."""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import replace
from typing import Any

import pytest

from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.aws.transactions import BACKOFF, Backoff
from gpufleet.adapters.local.memory import InMemoryJobQueue
from gpufleet.domain.arrays import element_of
from gpufleet.domain.fair_share import charge, usage_by_team
from gpufleet.domain.queueing import (
    Booking,
    QueuedJob,
    RunningJob,
)
from gpufleet.domain.spec import Dependency, DependencyMode, Priority
from gpufleet.emulator.account import Account
from gpufleet.ports import AdmissionLimits, JobQueue, QueueEntry, QueueState
from gpufleet.topology import QUEUE_TABLE
from tests.integration.dynamo_faults import cancelled_first_tries

NOW = 1_767_225_600.0
UNBOUNDED = AdmissionLimits(max_gpus=10_000, max_instances=10_000, team_gpus=None)


@pytest.fixture(params=["dynamodb", "memory"])
def queue(request: pytest.FixtureRequest, account: Account) -> JobQueue:
    if request.param == "memory":
        return InMemoryJobQueue()
    return dynamo_queue(account.client("dynamodb"))


def dynamo_queue(
    client: Any, jobs_table: str | None = None, backoff: Backoff = BACKOFF
) -> DynamoJobQueue:
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
    return DynamoJobQueue(client, name, jobs_table=jobs_table, backoff=backoff)


def entry(
    job_id: str,
    priority: Priority = Priority.NORMAL,
    gpus: int = 1,
    team: str = "t",
    waited: float = 0.0,
    instances: int = 1,
) -> QueueEntry:
    return QueueEntry(
        QueuedJob(job_id, team, priority, gpus, instances, NOW - waited),
        f"token-{job_id}",
        queued_at=NOW,
    )


def running(item: QueueEntry) -> RunningJob:
    job = item.job
    return RunningJob(job.job_id, job.team, job.priority, job.gpus, job.instances, NOW)


def test_each_team_and_class_is_a_fifo_stream_whose_shapes_the_state_knows(
    queue: JobQueue,
) -> None:
    rng = random.Random(7)
    entries = [
        entry(
            f"j{i:03d}",
            rng.choice(list(Priority)),
            gpus=rng.choice([0, 1, 4, 8]),
            team=rng.choice(["vision", "nlp", "audio"]),
            waited=rng.uniform(0, 8 * 3600),
            instances=rng.choice([1, 2]),
        )
        for i in range(60)
    ]
    for item in entries:
        queue.enqueue(item)
    streams: dict[tuple[str, Priority], list[QueueEntry]] = {}
    for item in entries:
        streams.setdefault((item.job.team, item.job.priority), []).append(item)
    state = queue.state()
    assert state.streams == {
        key: frozenset((e.job.gpus, e.job.instances) for e in members)
        for key, members in streams.items()
    }
    for (team, priority), members in streams.items():
        fifo = sorted(members, key=lambda e: e.job.enqueued_at)
        assert list(queue.stream(team, priority)) == fifo
    assert {w.job.job_id for w in queue.waiting()} == {e.job.job_id for e in entries}
    assert list(queue.stream("nobody", Priority.NORMAL)) == []


def test_a_stream_is_read_lazily(queue: JobQueue) -> None:
    for i in range(40):
        queue.enqueue(entry(f"j{i:03d}", waited=40 - i))
    before = queue.items_read()
    head = next(queue.stream("t", Priority.NORMAL))
    assert head.job.job_id == "j000"
    assert queue.items_read() - before <= 5  # the first page, not the stream


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


def test_a_release_charges_its_team_once_and_charges_add_up(queue: JobQueue) -> None:
    day = 86_400.0
    for job_id, team in (("j-a", "vision"), ("j-b", "vision"), ("j-c", "nlp")):
        item = entry(job_id, team=team)
        queue.enqueue(item)
        assert queue.admit(item, running(item), UNBOUNDED)
    assert queue.state().team_usage == {}
    assert queue.release("j-a", charge(3.0, NOW, day))
    assert not queue.release("j-a", charge(3.0, NOW, day))  # released already: no charge
    assert queue.release("j-b", charge(2.0, NOW + day, day))
    assert queue.release("j-c")  # a share given back with no run: nothing charged
    usage = usage_by_team(queue.state().team_usage, NOW + day, day)
    assert usage == {"vision": pytest.approx(3.0 / 2 + 2.0)}
    queue.charge("nlp", charge(1.0, NOW + day, day))  # a stage that keeps its share
    usage = usage_by_team(queue.state().team_usage, NOW + day, day)
    assert usage == {"vision": pytest.approx(3.5), "nlp": pytest.approx(1.0)}


def test_the_queue_keeps_what_the_reservation_needs(queue: JobQueue) -> None:
    # A waiting job's expected run time; a running job's expected end and preemption count.
    item = entry("j-a", gpus=2)
    item = replace(item, job=replace(item.job, expected_seconds=5400.0, preemptions=2))
    queue.enqueue(item)
    assert [w.job.expected_seconds for w in queue.waiting()] == [5400.0]
    admitted = replace(running(item), expected_end=NOW + 5400.0, preemptions=2)
    assert queue.admit(item, admitted, UNBOUNDED)
    held = queue.state().running[0].job
    assert (held.expected_end, held.preemptions) == (NOW + 5400.0, 2)


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
    queue.book(booking, lambda booked: None)
    assert queue.bookings() == [booking]
    assert queue.state().bookings == [booking]


def test_a_booking_is_checked_against_one_made_meanwhile(queue: JobQueue) -> None:
    """The check runs on the bookings as they are when the booking is written: a booking that
    went in between the read and the write is seen (DynamoDB: the ledger's version moved)."""
    first, second = (
        Booking("b-1", "nlp", 8, NOW, NOW + 3600),
        Booking("b-2", "nlp", 8, NOW, NOW + 60),
    )
    if not isinstance(queue, DynamoJobQueue):
        pytest.skip("the memory queue checks and writes under one lock: nothing books between")
    seen: list[list[Booking]] = []

    def check(booked: list[Booking]) -> None:
        seen.append(booked)
        if len(seen) == 1:
            queue.book(first, lambda _: None)  # another booking, between this read and write
        elif any(b.booking_id == "b-1" for b in booked):
            raise ValueError("overbooked")

    with pytest.raises(ValueError, match="overbooked"):
        queue.book(second, check)
    assert seen[-1] == [first]
    assert queue.bookings() == [first]


def test_bookings_are_cancelled_once_and_expire_with_their_window(queue: JobQueue) -> None:
    past, later = Booking("b-1", "nlp", 8, NOW, NOW + 60), Booking("b-2", "nlp", 4, NOW, NOW + 7200)
    queue.book(past, lambda _: None)
    queue.book(later, lambda _: None)
    assert queue.expire_bookings(NOW + 60) == [past]
    assert queue.expire_bookings(NOW + 60) == []
    assert queue.cancel_booking("b-2") == later
    assert queue.cancel_booking("b-2") is None
    assert queue.bookings() == []


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
    assert set(queue.state().streams) == {("t", Priority.HIGH), ("t", Priority.NORMAL)}

    queue.enqueue(items[3])  # back again (a requeue)
    assert waiting_by_class(queue.state())[Priority.LOW] == 1
    # Resized while it waits: out with its old shape, in with the new one.
    assert queue.remove("j-n1") is not None
    queue.enqueue(entry("j-n1", Priority.NORMAL, gpus=4, instances=2))
    assert queue.state().streams[("t", Priority.NORMAL)] == frozenset({(4, 2)})


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
    assert state.streams == {} and list(queue.stream("t", Priority.NORMAL)) == []
    assert queue.release("j1") and queue.state().running == []


def test_a_notice_is_first_only_once_per_key(queue: JobQueue) -> None:
    assert queue.first_notice("team-budget#ml#1764547200")
    assert not queue.first_notice("team-budget#ml#1764547200")
    assert queue.first_notice("team-budget#ml#1767225600")  # next month: told again
    assert queue.state().running == [] and queue.waiting() == []  # kept apart from the queue


def test_a_preemptor_is_a_nominee_until_it_is_admitted_or_leaves_the_queue(
    queue: JobQueue,
) -> None:
    victim, other = entry("j-victim", Priority.LOW, team="a"), entry("j-other", team="a")
    for item in (victim, other):
        queue.enqueue(item)
        assert queue.admit(item, running(item), UNBOUNDED)
    preemptor, gone = entry("j-high", Priority.HIGH, gpus=2), entry("j-gone", Priority.HIGH)
    queue.enqueue(preemptor)
    assert queue.preempt("j-victim", preemptor.job)
    assert not queue.preempt("j-victim", preemptor.job)  # already draining
    state = queue.state()
    assert state.nominees == [preemptor.job]
    assert {r.job.job_id: r.job.draining_for for r in state.running} == {
        "j-victim": "j-high",
        "j-other": None,
    }
    # The state knows the nominee, not its token: the entry is read when it is admitted.
    assert queue.waiting_entry(preemptor.job) == preemptor
    assert queue.admit(preemptor, running(preemptor), UNBOUNDED)
    assert queue.state().nominees == [] and queue.waiting_entry(preemptor.job) is None
    # A job that no longer waits makes no room: the victim is left alone.
    assert not queue.preempt("j-other", gone.job)
    assert queue.state().running[1].job.draining_for is None
    # A nominee that is cancelled leaves with its entry.
    queue.enqueue(gone)
    assert queue.preempt("j-other", gone.job) and queue.state().nominees == [gone.job]
    assert queue.remove("j-gone") == gone
    state = queue.state()
    assert state.nominees == [] and state.streams == {}


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


def test_an_enqueue_that_collides_with_another_transaction_still_counts_the_job(
    account: Account,
) -> None:
    client = account.client("dynamodb")
    waits: list[float] = []
    queue = dynamo_queue(client, backoff=Backoff(sleep=waits.append))  # waits asked, not taken
    queue.enqueue(entry("j-first", Priority.LOW))  # the usage item exists
    with cancelled_first_tries(client, "TransactionConflict") as cancelled:
        queue.enqueue(entry("j-collided", Priority.HIGH))
    assert list(cancelled.values()) == [1] and len(waits) == 1
    assert {w.job.job_id for w in queue.waiting()} == {"j-first", "j-collided"}
    assert waiting_by_class(queue.state())[Priority.HIGH] == 1


def test_a_remove_that_collides_with_another_transaction_still_removes_the_job(
    account: Account,
) -> None:
    client = account.client("dynamodb")
    waits: list[float] = []
    queue = dynamo_queue(client, backoff=Backoff(sleep=waits.append))  # waits asked, not taken
    queue.enqueue(entry("j-cancelled"))
    with cancelled_first_tries(client, "TransactionConflict") as cancelled:
        removed = queue.remove("j-cancelled")
    assert list(cancelled.values()) == [1] and len(waits) == 1
    assert removed is not None and queue.waiting() == []


def test_a_waiting_job_keeps_the_jobs_it_depends_on(queue: JobQueue) -> None:
    depends_on = (
        Dependency(job="j-" + "a" * 20),
        Dependency(job="j-" + "b" * 20, on="any"),
    )
    item = entry("j-dependant")
    item = replace(item, job=replace(item.job, depends_on=depends_on))
    queue.enqueue(item)
    queue.enqueue(entry("j-free"))
    assert list(queue.stream("t", Priority.NORMAL)) == [item, entry("j-free")]
    assert {w.job.job_id: w.job.depends_on for w in queue.waiting()} == {
        "j-dependant": depends_on,
        "j-free": (),
    }


def test_a_waiting_job_keeps_the_start_of_the_block_it_waits_for(queue: JobQueue) -> None:
    item = entry("j-blocky")
    item = replace(item, job=replace(item.job, not_before=NOW + 7200.5))
    queue.enqueue(item)
    queue.enqueue(entry("j-free"))
    assert list(queue.stream("t", Priority.NORMAL)) == [item, entry("j-free")]
    assert {w.job.job_id: w.job.not_before for w in queue.waiting()} == {
        "j-blocky": NOW + 7200.5,
        "j-free": None,
    }


def test_an_array_is_queued_in_batches_and_a_repeated_delivery_counts_nothing_twice(
    queue: JobQueue,
) -> None:
    children = [entry(f"j-c{i:03}", team="t" if i % 2 else "u", waited=-i) for i in range(60)]
    before = queue.transactions()
    queue.enqueue_all(children)
    if isinstance(queue, DynamoJobQueue):
        # Three items a child (its entry, the check it was not admitted, its locator) and one
        # counter item per team and the global one: 32 children a transaction.
        assert queue.transactions() - before == 2
    assert waiting_by_class(queue.state())[Priority.NORMAL] == 60
    assert [e.job.job_id for e in queue.stream("t", Priority.NORMAL)] == [
        c.job.job_id for c in children if c.job.team == "t"
    ]
    # The same submission delivered again, after one child was admitted: each child waits or
    # runs once, the admitted one handed to its new token.
    first = children[0]
    assert queue.admit(first, running(first), UNBOUNDED)
    again = [QueueEntry(c.job, f"token-again-{c.job.job_id}", queued_at=NOW) for c in children]
    queue.enqueue_all(again)
    state = queue.state()
    assert waiting_by_class(state)[Priority.NORMAL] == 59
    [admitted] = state.running
    assert (admitted.job.job_id, admitted.task_token) == (first.job.job_id, "token-again-j-c000")
    assert {e.task_token for e in queue.waiting()} == {e.task_token for e in again[1:]}


def test_a_hold_on_one_element_is_kept_as_one(queue: JobQueue) -> None:
    # A child that waits element by element is held on the dependency's child of its index.
    element = element_of(Dependency(job="j-" + "a" * 20, mode=DependencyMode.ELEMENT), 3)
    whole = Dependency(job=element.job)  # the same job, held on whole: another hold
    queue.enqueue(replace(entry("j-e"), held_on=element))
    queue.enqueue(replace(entry("j-w"), held_on=whole))
    assert queue.state().holds == {element, whole}
    assert [e.job.job_id for e in queue.held(element)] == ["j-e"]
    assert [e.held_on for e in queue.held(whole)] == [whole]


def test_a_held_job_waits_out_of_its_stream_until_moved_back(queue: JobQueue) -> None:
    prep = Dependency(job="j-" + "a" * 20)
    held = [replace(entry(f"j-h{i:03}", waited=30 - i), held_on=prep) for i in range(30)]
    held = [replace(e, job=replace(e.job, depends_on=(prep,))) for e in held]
    queue.enqueue_all(held[:29])
    queue.enqueue(held[29])
    queue.enqueue(entry("j-free"))
    state = queue.state()
    # No stream, no waiting counter holds them: a pass reads none of them, only the hold.
    assert state.holds == {prep} and waiting_by_class(state)[Priority.NORMAL] == 1
    read = queue.items_read()
    assert [e.job.job_id for e in queue.stream("t", Priority.NORMAL)] == ["j-free"]
    assert queue.items_read() - read == 1
    assert {e.job.job_id for e in queue.waiting()} == {"j-free", *(e.job.job_id for e in held)}
    assert [e.job.job_id for e in queue.held(prep)] == [e.job.job_id for e in held]
    assert queue.remove("j-h000") == held[0]  # a held job leaves as a waiting one does
    assert not queue.forget_hold(prep)  # it holds jobs still
    back = [replace(e, held_on=None) for e in held]
    assert queue.move_held(prep, back[1:20]) == 19
    # Moved again (a pass that crashed and ran again, or two passes at once): nothing twice.
    assert queue.move_held(prep, back[:25]) == 5  # the removed one and those moved stay
    assert waiting_by_class(queue.state())[Priority.NORMAL] == 1 + 24
    assert queue.move_held(prep, back[25:]) == 5
    assert queue.state().holds == frozenset() and queue.forget_hold(prep)
    assert [e.job.job_id for e in queue.stream("t", Priority.NORMAL)] == [
        *(e.job.job_id for e in held[1:]),
        "j-free",
    ]
