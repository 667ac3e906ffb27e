"""The emulator's nodes end with it: a node still running a long job when the simulator stops
is gone once `stop` returns, so none outlives the embedded account and calls the real AWS."""

from __future__ import annotations

import threading

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import JobStatus
from gpufleet.emulator.account import embedded_account
from gpufleet.emulator.clock import paced_clock
from gpufleet.emulator.nodes import Behaviour, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.topology import INTAKE_PREFIX, JOBS_TABLE
from tests.helpers import SPEC_YAML, stop_running_executions, wait_for


def test_a_node_running_a_long_job_ends_when_the_simulator_stops() -> None:
    with paced_clock() as clock, embedded_account(clock=clock) as account, acting_as(EMULATOR):
        # Ten minutes of emulated run: far longer than the test, so only the stop ends it.
        nodes = NodeSimulator(
            account, NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=600))
        )
        nodes.start()
        account.client("s3").put_object(
            Bucket=account.bucket, Key=f"{INTAKE_PREFIX}vision/resnet.yaml", Body=SPEC_YAML
        )
        store = DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
        [job] = wait_for(lambda: store.list_jobs(JobStatus.RUNNING))
        assert job.placement is not None
        [instance_id] = job.placement.instance_ids
        # The node's agent runs the job on its own thread, named after its instance.
        wait_for(lambda: any(t.name == instance_id for t in threading.enumerate()))

        nodes.stop()

        assert [t.name for t in threading.enumerate() if t.name == instance_id] == []
        stop_running_executions(account)
