"""Admission benchmark: one pass over 10,000 queued jobs.

1. The decision itself (`gpufleet.domain.queueing.decide`), in-process: budget 200 ms.
2. A dispatcher pass against the DynamoDB queue (moto, in-process): how many queue items it
   reads per job it admits. The queue is read lazily, best first, so a pass reads what it
   needs, not the whole queue.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

from gpufleet.domain.queueing import QueuedJob, QueuePolicy, RunningJob, TeamQuota, decide
from gpufleet.domain.spec import Priority

QUEUED = 10_000
MOTO_QUEUED = 1_000
NOW = 1_767_225_600.0
POLICY = QueuePolicy(
    max_gpus=512,
    max_instances=256,
    teams={f"team-{i}": TeamQuota(gpus=48, borrow=16) for i in range(10)},
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


def bench_dynamodb_pass() -> None:
    from moto import mock_aws

    from gpufleet.adapters.aws.queue import DynamoJobQueue, _entry_item
    from gpufleet.adapters.local.memory import ManualClock, in_memory_ports
    from gpufleet.emulator.account import table_definition
    from gpufleet.ports import QueueEntry
    from gpufleet.services.dispatcher import DispatcherService
    from gpufleet.services.factory import build_lifecycle
    from gpufleet.settings import Settings
    from gpufleet.topology import QUEUE_TABLE

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_DEFAULT_REGION="us-east-1")
    os.environ["AWS_SECRET_ACCESS_KEY"] = "bench"  # noqa: S105 - moto's fake credentials
    with mock_aws():
        import boto3

        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(**table_definition(QUEUE_TABLE, "queue"))
        queue = DynamoJobQueue(client, "queue")
        # moto scans a whole partition for every query page, so the DynamoDB pass uses a
        # smaller queue; the items read depend on what is admitted, not on the queue's length.
        queued = workload(random.Random(1))[0][:MOTO_QUEUED]
        items = [_entry_item(QueueEntry(job, f"token-{job.job_id}", NOW)) for job in queued]
        for start in range(0, len(items), 25):
            client.batch_write_item(
                RequestItems={
                    "queue": [{"PutRequest": {"Item": i}} for i in items[start : start + 25]]
                }
            )
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
        dispatcher = DispatcherService(ports, build_lifecycle(ports, settings), POLICY)
        started = time.perf_counter()
        result = dispatcher.run_pass()
        seconds = time.perf_counter() - started
        admitted = len(result.admitted)
        per_job = result.items_read / max(1, admitted)
        print(
            f"dispatcher pass on a DynamoDB queue of {MOTO_QUEUED} (moto): admitted {admitted}, "
            f"read {result.items_read} queue items = {per_job:.1f} per admitted job "
            f"(a full scan would read {MOTO_QUEUED}); {seconds * 1000:.0f} ms in moto"
        )


if __name__ == "__main__":
    median = bench_decide()
    bench_dynamodb_pass()
    sys.exit(0 if median <= 200 else 1)
