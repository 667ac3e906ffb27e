"""Four dispatchers at once against the DynamoDB queue (moto): every job admitted exactly once,
no quota or cap exceeded."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import cast

from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.local.memory import InMemoryObjects, RecordingWorkflow
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.domain.spec import Priority
from gpufleet.emulator.account import Account
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.topology import QUEUE_TABLE
from tests.helpers import enqueue, local_ports, make_settings, plan_of

POLICY = QueuePolicy(
    max_gpus=40,
    max_instances=40,
    reserve_share=0.0,
    teams={"vision": TeamQuota(gpus=8, borrow=4), "nlp": TeamQuota(gpus=12, borrow=0)},
)
SETTINGS = make_settings(config=FleetConfig(queue=POLICY))


def test_concurrent_dispatchers_admit_each_job_once_within_quotas(account: Account) -> None:
    client = account.client("dynamodb")
    table = account.table_names[QUEUE_TABLE.construct_id]
    base = local_ports()
    ports = replace(base, queue=DynamoJobQueue(client, table))
    lifecycle = build_lifecycle(ports, SETTINGS)
    intake = build_intake(ports, SETTINGS, lifecycle)
    objects = cast(InMemoryObjects, ports.objects)
    tokens: dict[str, str] = {}
    for index in range(24):
        team = "vision" if index % 2 else "nlp"
        key = f"jobs/{team}/{index}.yaml"
        objects.objects[key] = (
            f"name: j{index}\nteam: {team}\nimage: img\ncommand: [x]\nresources: {{gpus: 2}}\n"
        ).encode()
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        tokens[job_id] = f"token-{index}"
        enqueue(lifecycle, ports, job_id, tokens[job_id], plan_of(ports, job_id))

    dispatchers = [
        DispatcherService(replace(ports, queue=DynamoJobQueue(client, table)), lifecycle, POLICY)
        for _ in range(4)
    ]
    admitted: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(dispatchers))

    def run(dispatcher: DispatcherService, full: bool) -> None:
        barrier.wait()
        for _ in range(3):
            result = dispatcher.run_pass(full=full)
            with lock:
                admitted.extend(result.admitted)

    # Half of them woken by events (they read only the classes the counts say have jobs), half
    # by the schedule.
    threads = [
        threading.Thread(target=run, args=(d, index % 2 == 0))
        for index, d in enumerate(dispatchers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Exactly once: no job admitted by two dispatchers, each parked task completed once.
    assert len(admitted) == len(set(admitted))
    workflow = cast(RecordingWorkflow, ports.workflow)
    assert set(workflow.completed) == {tokens[job_id] for job_id in admitted}
    # Within quotas: vision 8 + borrow 4 = 12 GPUs (6 jobs), nlp 12 GPUs (6 jobs).
    state = ports.queue.state()
    running = state.running
    held = Counter[str]()
    for entry in running:
        held[entry.job.team] += entry.job.gpus
    assert held["vision"] <= 12 and held["nlp"] <= 12
    assert sum(held.values()) <= POLICY.max_gpus
    assert {e.job.job_id for e in running} == set(admitted)
    # The counts the next event-woken pass reads agree with what happened.
    assert state.gpus_held == sum(held.values())
    assert state.waiting[Priority.NORMAL] == 24 - len(admitted) == len(ports.queue.waiting())
    # As much as the quotas allow was admitted (vision borrows only while nlp quota is idle).
    assert 10 <= len(admitted) <= 12
