"""A pass's admissions in batches (`JobQueue.admit_all`): DynamoDB (moto) and in-memory write
the same transactions, as many admissions to one as fit, and a stale job or a full cap costs
no job and exceeds no quota."""

from __future__ import annotations

import random
import threading
from math import ceil

import pytest

from gpufleet.adapters.admission_batches import ITEMS_PER_ADMISSION, TRANSACTION_ITEMS
from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.aws.transactions import Backoff
from gpufleet.adapters.local.memory import InMemoryJobQueue
from gpufleet.domain.spec import Priority
from gpufleet.emulator.account import Account, table_definition
from gpufleet.ports import AdmissionLimits, AdmissionRequest, JobQueue, QueueEntry
from gpufleet.topology import QUEUE_TABLE
from tests.integration.dynamo_faults import cancelled_first_tries
from tests.integration.test_queue_contract import (
    UNBOUNDED,
    dynamo_queue,
    entry,
    running,
    waiting_by_class,
)


@pytest.fixture(params=["dynamodb", "memory"])
def queue(request: pytest.FixtureRequest, account: Account) -> JobQueue:
    if request.param == "memory":
        return InMemoryJobQueue()
    return dynamo_queue(account.client("dynamodb"))


def requests_for(
    items: list[QueueEntry], limits: AdmissionLimits = UNBOUNDED
) -> list[AdmissionRequest]:
    return [AdmissionRequest(item, running(item), limits) for item in items]


def queued(queue: JobQueue, count: int, team: str = "t", gpus: int = 1) -> list[QueueEntry]:
    items = [
        entry(f"j-{team}-{i:04d}", team=team, gpus=gpus, waited=count - i) for i in range(count)
    ]
    for item in items:
        queue.enqueue(item)
    return items


def test_a_pass_admitting_250_jobs_writes_as_many_to_a_transaction_as_fit(
    queue: JobQueue,
) -> None:
    items = queued(queue, 250)
    before = queue.transactions()
    admitted = queue.admit_all(requests_for(items))
    assert admitted == [item.job.job_id for item in items]
    # Each job's own 2 items (its entry, its running item), and the 2 counter items (the
    # fleet's, the team's) once per transaction: 49 jobs to a transaction of 100 items.
    per_transaction = (TRANSACTION_ITEMS - 2) // ITEMS_PER_ADMISSION
    assert per_transaction == 49
    assert queue.transactions() - before == ceil(250 / per_transaction) == 6
    state = queue.state()
    assert len(state.running) == 250 == state.gpus_held
    assert sum(waiting_by_class(state).values()) == 0 and state.streams == {}
    assert queue.waiting() == [] and all(not r.notified for r in state.running)


def test_each_team_in_a_batch_takes_one_counter_item(queue: JobQueue) -> None:
    # 3 teams: the fleet's counter and 3 teams' in every transaction, 48 jobs to one.
    items = [item for team in ("a", "b", "c") for item in queued(queue, 20, team)]
    before = queue.transactions()
    assert len(queue.admit_all(requests_for(items))) == 60
    assert queue.transactions() - before == ceil(60 / 48) == 2
    assert queue.state().gpus_held == 60


def test_stale_jobs_in_a_batch_hold_back_none_of_the_others(queue: JobQueue) -> None:
    items = queued(queue, 20)
    # Another pass admitted one, an operator cancelled two, after this pass read the queue.
    assert queue.admit(items[3], running(items[3]), UNBOUNDED)
    assert queue.remove(items[7].job.job_id) is not None
    assert queue.remove(items[19].job.job_id) is not None
    before = queue.transactions()
    admitted = queue.admit_all(requests_for(items))
    stale = {items[i].job.job_id for i in (3, 7, 19)}
    assert admitted == [i.job.job_id for i in items if i.job.job_id not in stale]
    assert queue.transactions() - before == 2  # cancelled once, then written without them
    state = queue.state()
    assert {r.job.job_id for r in state.running} == {i.job.job_id for i in items} - {
        items[7].job.job_id,
        items[19].job.job_id,
    }
    assert state.gpus_held == 18 and sum(waiting_by_class(state).values()) == 0


def test_a_batch_over_a_quota_another_pass_filled_admits_what_fits_and_loses_no_job(
    queue: JobQueue,
) -> None:
    items = queued(queue, 12, team="vision", gpus=2)
    limits = AdmissionLimits(max_gpus=100, max_instances=100, team_gpus=16)  # room for 8 jobs
    # Another pass admitted 4 jobs (8 GPUs) after this one read the state: its batch of the
    # other 8 no longer fits as a whole, and is split until what fits is written.
    assert queue.admit_all(requests_for(items[:4], limits)) == [i.job.job_id for i in items[:4]]
    admitted = queue.admit_all(requests_for(items[4:], limits))
    assert admitted == [i.job.job_id for i in items[4:8]]  # in the policy's order
    state = queue.state()
    assert sum(r.job.gpus for r in state.running) == 16 == state.gpus_held
    assert [w.job.job_id for w in sorted(queue.waiting(), key=lambda w: w.job.job_id)] == [
        i.job.job_id for i in items[8:]
    ]
    assert waiting_by_class(state)[Priority.NORMAL] == 4
    assert state.streams == {("vision", Priority.NORMAL): frozenset({(2, 1)})}


def test_a_batch_is_bound_by_the_fleet_caps_in_its_order(queue: JobQueue) -> None:
    # Caps as each admission would check them after the ones before it: a job admitted into
    # the reserve may go past the general cap, a later one outside it may not.
    big, small, last = entry("j-big", gpus=6), entry("j-small", gpus=2), entry("j-last", gpus=1)
    for item in (big, small, last):
        queue.enqueue(item)
    general, reserve = AdmissionLimits(7, 100, None), AdmissionLimits(10, 100, None)
    requests = [
        AdmissionRequest(big, running(big), general),
        AdmissionRequest(small, running(small), reserve),
        AdmissionRequest(last, running(last), general),
    ]
    assert queue.admit_all(requests) == ["j-big", "j-small"]
    assert queue.state().gpus_held == 8
    assert [w.job.job_id for w in queue.waiting()] == ["j-last"]


def test_concurrent_batched_passes_never_admit_twice_or_exceed_the_quota(
    queue: JobQueue,
) -> None:
    items = queued(queue, 40, team="vision", gpus=2)
    limits = AdmissionLimits(max_gpus=100, max_instances=100, team_gpus=30)  # room for 15 jobs
    admitted: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def dispatcher(seed: int) -> None:
        order = items[:]
        random.Random(seed).shuffle(order)
        barrier.wait()
        got = queue.admit_all(requests_for(order, limits))
        with lock:
            admitted.extend(got)

    threads = [threading.Thread(target=dispatcher, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == len(set(admitted)) == 15
    state = queue.state()
    assert sum(r.job.gpus for r in state.running) == 30 == state.gpus_held
    assert {r.job.job_id for r in state.running} == set(admitted)
    assert len(queue.waiting()) == 25 == waiting_by_class(state)[Priority.NORMAL]


def test_a_job_asked_for_twice_in_a_pass_is_admitted_once(queue: JobQueue) -> None:
    [item] = queued(queue, 1)
    assert queue.admit_all(requests_for([item, item])) == [item.job.job_id]
    assert queue.state().gpus_held == 1


def admitted_preemptor(queue: JobQueue) -> QueueEntry:
    """j-high, admitted in a batch after it preempted j-victim (still running, draining)."""
    victim, preemptor = entry("j-victim", Priority.LOW), entry("j-high", Priority.HIGH)
    queue.enqueue(victim)
    assert queue.admit(victim, running(victim), UNBOUNDED)
    queue.enqueue(preemptor)
    assert queue.preempt("j-victim", preemptor.job)
    assert queue.admit_all(requests_for([preemptor])) == ["j-high"]
    return preemptor


def test_an_admitted_nominee_is_one_no_more_and_its_job_can_wait_again_after_release(
    queue: JobQueue,
) -> None:
    preemptor = admitted_preemptor(queue)
    assert queue.state().nominees == [] and queue.remove("j-high") is None  # it runs
    assert queue.release("j-high")
    queue.enqueue(preemptor)  # requeued: it waits again, and can be taken out by id
    assert queue.state().nominees == []
    assert queue.remove("j-high") == preemptor and queue.waiting() == []


# -- DynamoDB only: a batch another transaction got in the way of -------------------------------


def test_a_throttled_batch_is_tried_again_and_admits_every_job(account: Account) -> None:
    client = account.client("dynamodb")
    waits: list[float] = []
    queue = dynamo_queue(client, backoff=Backoff(sleep=waits.append))  # waits asked, not taken
    items = queued(queue, 30)
    with cancelled_first_tries(client, "ThrottlingError") as cancelled:
        admitted = queue.admit_all(requests_for(items))
    assert admitted == [item.job.job_id for item in items]
    assert list(cancelled.values()) == [1] and len(waits) == 1  # one batch, retried
    assert queue.state().gpus_held == 30


def test_a_released_job_leaves_nothing_of_its_wait_behind(account: Account) -> None:
    client = account.client("dynamodb")
    client.create_table(**table_definition(QUEUE_TABLE, "queue-left-behind"))
    queue = DynamoJobQueue(client, "queue-left-behind")
    admitted_preemptor(queue)
    assert queue.release("j-high") and queue.release("j-victim")
    left = {
        (item["pk"]["S"], item["sk"]["S"].split("#")[0])
        for item in client.scan(TableName="queue-left-behind")["Items"]
    }
    assert left == {("state", "usage")}  # counters only: no locator, nominee or entry
