"""Admission benchmark: one pass over 10,000 queued jobs, and one with 10,000 blocked ahead.

1. The decision itself (`gpufleet.domain.queueing.decide`), in-process: budget 200 ms.
2. A dispatcher pass against the DynamoDB queue (moto, in-process): how many queue items it
   reads per job it admits. The queue is read lazily, each team's and class's stream only as
   far as the pass needs, so a pass reads what it needs, not the whole queue.
3. 10,000 jobs blocked ahead (over the fleet's general cap, the teams' quotas) of one job of
   another team that fits: the next pass admits it. Its time and the queue items it reads, on
   the in-memory queue and on DynamoDB (moto) at the same size; and, in-process, 10,000 jobs of
   one team each over what is left of its monthly budget (the shapes cannot tell: the pass
   reads a page past the head of that stream, no more).
4. 10,000 queued 1-GPU jobs of one team (a large array) on a fleet that can hold them all: one
   pass admits them all, as many to a DynamoDB transaction as fit (`admit_all`). The
   transactions it writes and its time, on the in-memory queue (the same transactions) and on
   DynamoDB (moto, in-process; `ARRAY_MOTO` jobs, moto scanning the partition for each page of a
   stream it reads).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from gpufleet.domain.queueing import (
    LOOKAHEAD,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    Stream,
    TeamQuota,
    WaitingJobs,
    decide,
    decide_streams,
)
from gpufleet.domain.spec import Priority
from gpufleet.ports import AdmissionLimits, AdmissionRequest, JobQueue, QueueEntry

QUEUED = 10_000
MOTO_QUEUED = 1_000
BLOCKED = 10_000
NOW = 1_767_225_600.0
POLICY = QueuePolicy(
    max_gpus=512,
    max_instances=256,
    teams={f"team-{i}": TeamQuota(gpus=48, borrow=16) for i in range(10)},
)
UNBOUNDED = AdmissionLimits(max_gpus=10_000, max_instances=10_000, team_gpus=None)
ARRAY = 10_000
# moto scans the whole partition for each page of a stream (pages of 25): a pass over the
# array reads it in time that grows with its square, so moto gets a smaller one.
ARRAY_MOTO = 2_000
# Room for the whole array: its team's quota and the fleet's caps (no reserve held back).
ARRAY_POLICY = QueuePolicy(
    max_gpus=ARRAY,
    max_instances=ARRAY,
    reserve_share=0.0,
    teams={"array": TeamQuota(gpus=ARRAY)},
)


def workload(rng: random.Random) -> tuple[list[QueuedJob], list[RunningJob]]:
    queued = [
        QueuedJob(
            f"j-{i:020x}",
            f"team-{rng.randrange(10)}",
            rng.choice(list(Priority)),
            rng.choice([1, 1, 2, 4, 8, 16]),
            1,
            NOW - rng.uniform(0, 48 * 3600),
        )
        for i in range(QUEUED)
    ]
    running = [
        RunningJob(f"r-{i:020x}", f"team-{i % 10}", Priority.NORMAL, 8, 1, NOW - 3600)
        for i in range(50)
    ]
    return queued, running


def blocked_workload(
    rng: random.Random,
) -> tuple[list[QueueEntry], list[RunningJob], QueueEntry]:
    """Teams 0-8 hold their quotas, team-9 40 of its 48 GPUs: 472 of the 486 GPUs outside the
    reserve. 10,000 jobs of teams 0-8, 16 GPUs each and waiting for up to two days (so ahead
    of anything new), cannot fit and have nothing to preempt; one new job of team-9 fits."""
    running = [
        RunningJob(f"r-{i:020x}", f"team-{i % 9}", Priority.HIGH, 8, 1, NOW - 3600)
        for i in range(54)
    ] + [RunningJob(f"r-9-{i:016x}", "team-9", Priority.HIGH, 8, 1, NOW - 3600) for i in range(5)]
    blocked = [
        QueueEntry(
            QueuedJob(
                f"j-{i:020x}",
                f"team-{rng.randrange(9)}",
                rng.choice([Priority.HIGH, Priority.NORMAL]),
                16,
                2,
                NOW - rng.uniform(3600, 48 * 3600),
            ),
            f"token-{i}",
            NOW,
        )
        for i in range(BLOCKED)
    ]
    fits = QueueEntry(QueuedJob("j-fits", "team-9", Priority.NORMAL, 1, 1, NOW), "token-fits", NOW)
    return blocked, running, fits


def bench_decide() -> float:
    rng = random.Random(1)
    queued, running = workload(rng)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        decide(queued, running, [], NOW, POLICY)
        times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    print(
        f"decide over {QUEUED} queued + {len(running)} running jobs: median {median:.1f} ms "
        f"(budget 200 ms)"
    )
    return median


def dispatcher_pass(queue: JobQueue, policy: QueuePolicy = POLICY) -> tuple[Any, float]:
    """One pass of the real dispatcher over `queue` (the other ports in memory)."""
    from gpufleet.adapters.local.memory import ManualClock, in_memory_ports
    from gpufleet.services.dispatcher import DispatcherService
    from gpufleet.services.factory import build_lifecycle
    from gpufleet.settings import Settings

    ports = in_memory_ports(clock=ManualClock(NOW), queue=queue)
    settings = Settings(
        region="us-east-1",
        jobs_table="-",
        idempotency_table="-",
        capacity_table="-",
        queue_table="queue",
        event_bus_name="-",
        intake_bucket="-",
    )
    dispatcher = DispatcherService(ports, build_lifecycle(ports, settings), policy)
    started = time.perf_counter()
    result = dispatcher.run_pass()
    return result, time.perf_counter() - started


def load_dynamodb(queue: JobQueue, entries: list[QueueEntry]) -> None:
    """Queue the entries as intake queues an array's children (`enqueue_all`), and say in how
    many transactions and how long."""
    before = queue.transactions()
    started = time.perf_counter()
    queue.enqueue_all(entries)
    print(
        f"  ({len(entries)} jobs queued in moto as intake queues an array's children: "
        f"{queue.transactions() - before} transactions, one each before; "
        f"{time.perf_counter() - started:.0f} s)"
    )


def hold(queue: JobQueue, running: list[RunningJob]) -> None:
    for job in running:
        queued = QueuedJob(job.job_id, job.team, job.priority, job.gpus, job.instances, NOW)
        assert queue.admit(
            QueueEntry(queued, f"token-{job.job_id}", NOW), job, UNBOUNDED, waiting=False
        )


def print_blocked(where: str, result: Any, seconds: float) -> bool:
    admitted: bool = result.admitted == ["j-fits"]
    print(
        f"dispatcher pass, {BLOCKED} blocked jobs ahead of one that fits, {where}: "
        f"{'admitted it' if admitted else 'DID NOT ADMIT IT'} in {seconds * 1000:.0f} ms, "
        f"read {result.items_read} queue items; {len(result.blocked)} streams not read on"
    )
    return admitted


def bench_blocked_in_memory() -> bool:
    from gpufleet.adapters.local.memory import InMemoryJobQueue

    blocked, running, fits = blocked_workload(random.Random(2))
    queue = InMemoryJobQueue()
    hold(queue, running)
    for entry in [*blocked, fits]:
        queue.enqueue(entry)
    return print_blocked("in-memory queue", *dispatcher_pass(queue))


def bench_budget_lookahead() -> bool:
    """10,000 jobs of one team, each over what is left of its budget, ahead of another team's."""
    policy = POLICY.model_copy(
        update={"teams": {**POLICY.teams, "team-0": TeamQuota(gpus=48, monthly_budget_usd=100.0)}}
    )
    dear = [
        QueuedJob(
            f"j-{i:020x}", "team-0", Priority.HIGH, 1, 1, NOW - 3600 - i, estimated_cost_usd=20.0
        )
        for i in range(BLOCKED)
    ]
    fits = QueuedJob("j-fits", "team-1", Priority.NORMAL, 1, 1, NOW)
    reads = 0

    def counted(jobs: list[QueuedJob]) -> Iterator[QueuedJob]:
        nonlocal reads
        for job in jobs:
            reads += 1
            yield job

    waiting = WaitingJobs(
        [
            Stream("team-0", Priority.HIGH, frozenset({(1, 1)}), counted(dear)),
            Stream("team-1", Priority.NORMAL, frozenset({(1, 1)}), counted([fits])),
        ]
    )
    started = time.perf_counter()
    decision = decide_streams(waiting, [], [], NOW, policy, team_spend_usd={"team-0": 90.0})
    seconds = time.perf_counter() - started
    admitted = [a.job_id for a in decision.admitted] == ["j-fits"]
    print(
        f"decide_streams, {BLOCKED} jobs over what is left of their team's budget ahead of one "
        f"that fits: {'admitted it' if admitted else 'DID NOT ADMIT IT'} in "
        f"{seconds * 1000:.1f} ms, read {reads} jobs (lookahead {LOOKAHEAD})"
    )
    return admitted


def bench_dynamodb() -> bool:
    from gpufleet.adapters.aws.queue import DynamoJobQueue
    from gpufleet.emulator.account import embedded_account, table_definition
    from gpufleet.topology import QUEUE_TABLE

    # The embedded account: moto, with the emulator's patches (a transaction is undone item by
    # item where plain moto deep-copies the table before each of its items).
    with embedded_account() as account:
        client = account.client("dynamodb")
        client.create_table(**table_definition(QUEUE_TABLE, "bench-queue"))
        # moto scans a whole partition for every query page, so this pass uses a smaller
        # queue; the items read depend on what is admitted, not on the queue's length.
        queued = workload(random.Random(1))[0][:MOTO_QUEUED]
        entries = [QueueEntry(job, f"token-{job.job_id}", NOW) for job in queued]
        queue = DynamoJobQueue(client, "bench-queue")
        load_dynamodb(queue, entries)
        result, seconds = dispatcher_pass(queue)
        admitted = len(result.admitted)
        per_job = result.items_read / max(1, admitted)
        print(
            f"dispatcher pass on a DynamoDB queue of {MOTO_QUEUED} (moto): admitted {admitted}, "
            f"read {result.items_read} queue items = {per_job:.1f} per admitted job "
            f"(a full scan would read {MOTO_QUEUED}); {seconds * 1000:.0f} ms in moto"
        )

        client.create_table(**table_definition(QUEUE_TABLE, "bench-blocked"))
        blocked, running, fits = blocked_workload(random.Random(2))
        queue = DynamoJobQueue(client, "bench-blocked")
        hold(queue, running)
        load_dynamodb(queue, blocked)
        queue.enqueue(fits)
        where = "DynamoDB queue (moto; the items read include the state's)"
        return print_blocked(where, *dispatcher_pass(queue))


def array_entries(count: int) -> list[QueueEntry]:
    return [
        QueueEntry(
            QueuedJob(f"j-{i:020x}", "array", Priority.NORMAL, 1, 1, NOW - count + i),
            f"token-{i}",
            NOW,
        )
        for i in range(count)
    ]


def print_array(where: str, count: int, queue: JobQueue) -> bool:
    """One pass over the queued array; the time of its admissions (`admit_all`) apart."""
    spent: list[float] = []
    admit_all = queue.admit_all

    def timed(requests: Sequence[AdmissionRequest]) -> list[str]:
        started = time.perf_counter()
        try:
            return admit_all(requests)
        finally:
            spent.append(time.perf_counter() - started)

    setattr(queue, "admit_all", timed)  # noqa: B010 - timed, on this queue only
    before = queue.transactions()
    result, seconds = dispatcher_pass(queue, ARRAY_POLICY)
    transactions = queue.transactions() - before
    admitted = len(result.admitted)
    print(
        f"dispatcher pass, {count} queued 1-GPU jobs of one team on a fleet that holds them, "
        f"{where}: admitted {admitted} in {transactions} transactions "
        f"({admitted / max(1, transactions):.0f} a transaction; one each before: {admitted}), "
        f"the admissions in {sum(spent) * 1000:.0f} ms of the pass's {seconds * 1000:.0f} ms"
    )
    return admitted == count


def bench_array_in_memory() -> bool:
    from gpufleet.adapters.local.memory import InMemoryJobQueue

    queue = InMemoryJobQueue()
    for entry in array_entries(ARRAY):
        queue.enqueue(entry)
    return print_array("in-memory queue", ARRAY, queue)


def bench_array_dynamodb() -> bool:
    from gpufleet.adapters.aws.queue import DynamoJobQueue
    from gpufleet.emulator.account import embedded_account, table_definition
    from gpufleet.topology import QUEUE_TABLE

    with embedded_account() as account:
        client = account.client("dynamodb")
        client.create_table(**table_definition(QUEUE_TABLE, "bench-array"))
        queue = DynamoJobQueue(client, "bench-array")
        load_dynamodb(queue, array_entries(ARRAY_MOTO))
        return print_array("DynamoDB queue (moto)", ARRAY_MOTO, queue)


if __name__ == "__main__":
    median = bench_decide()
    found = [
        bench_blocked_in_memory(),
        bench_budget_lookahead(),
        bench_dynamodb(),
        bench_array_in_memory(),
        bench_array_dynamodb(),
    ]
    sys.exit(0 if median <= 200 and all(found) else 1)
