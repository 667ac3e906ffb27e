"""A Capacity Block's end on the embedded account, against the wall clock (a block's dates are
EC2's, and EC2 begins terminating its instances 30 minutes before its end, 5 minutes after the
control plane's drain): `realtime`, outside `make test`.

A run the drain never reached (no reconciler runs here) is still on the block when EC2
terminates its instance (`emulator/capacity_blocks.py`). Its run settles as the block's end:
back to the queue as `reservation-ending`, no retry used, no lost node, and relaunched off the
ending block; no instance is left behind. (The drain before the end:
`tests/integration/test_blocks_and_windows.py`.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.adapters.aws.runtime import aws_ports
from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.queueing import QueuePolicy
from gpufleet.domain.reserved import BLOCK_TERMINATION_LEAD_SECONDS, drain_lead_seconds
from gpufleet.domain.settlement import RESERVATION_ENDING
from gpufleet.emulator.account import Account
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.services.factory import build_lifecycle
from gpufleet.settings import Settings
from gpufleet.topology import RECONCILE_PERIOD_SECONDS, TAG_JOB_ID
from tests.helpers import with_passes
from tests.integration.test_blocks_and_windows import (
    account_with_nodes,
    job_named,
    placed,
    submit,
)

pytestmark = pytest.mark.realtime

GRACE_SECONDS = 10
LEAD = drain_lead_seconds(RECONCILE_PERIOD_SECONDS, GRACE_SECONDS)
# The run lands on the ending block with this long to spare before its drain.
LEFT_SECONDS = 60


def _block(suffix: str, end: datetime) -> Reservation:
    return Reservation(
        id=f"cr-0{suffix * 16}",
        kind=ReservationKind.CAPACITY_BLOCK,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        count=1,
        start=end - timedelta(days=1),
        end=end,
        hourly_usd=0.5,
    )


@pytest.fixture(scope="module")
def config() -> FleetConfig:
    now = datetime.now(UTC)
    ending = now + timedelta(seconds=BLOCK_TERMINATION_LEAD_SECONDS + LEAD + LEFT_SECONDS)
    return FleetConfig(
        # The ending block's id sorts first: a job that fits goes to it.
        reservations=[_block("a", ending), _block("b", now + timedelta(hours=6))],
        queue=QueuePolicy(reserve_share=0.0, preemption_grace_seconds=GRACE_SECONDS),
    )


@pytest.fixture(scope="module")
def account(config: FleetConfig) -> Iterator[Account]:
    # It would run for ten minutes: it is still running when EC2 ends the block.
    scenario = NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=600.0))
    with account_with_nodes(config, scenario) as created:
        yield created


def _instances_of(account: Account, job_id: str) -> dict[str, str]:
    pages = (
        account.client("ec2")
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]}])
    )
    return {
        i["InstanceId"]: i["State"]["Name"]
        for page in pages
        for r in page["Reservations"]
        for i in r["Instances"]
    }


def test_a_run_still_on_a_block_when_ec2_ends_it_goes_back_to_the_queue_as_the_blocks_end(
    config: FleetConfig, account: Account
) -> None:
    ending, lasting = config.reservations
    submit(account, "stays", "vision", "expected_duration: 10s\n")
    first = placed(account, "stays")
    assert first.placement is not None and first.placement.reservation_id == ending.id
    assert first.drain_reason is None  # no reconciler runs here: its drain never comes

    assert ending.end is not None
    terminates = ending.end.timestamp() - BLOCK_TERMINATION_LEAD_SECONDS
    time.sleep(max(0.0, terminates - time.time()))

    def moved() -> Job | None:
        job = job_named(account, "stays")
        if job is None or job.placement is None or job.placement.reservation_id == ending.id:
            return None
        return job if job.status is JobStatus.RUNNING else None

    again = with_passes(account, moved, "the relaunch off the ended block")
    # Back in the queue as the block's end, and relaunched on the lasting block: no retry,
    # no preemption, no interruption used; the ended run's time on the block is paid.
    assert again.placement is not None and again.placement.reservation_id == lasting.id
    assert (again.retries, again.preemptions, again.interruptions) == (0, 0, 0)
    assert again.prior_capacity_usd.get("reserved", 0.0) > 0
    assert again.drain_reason != RESERVATION_ENDING
    [ended_instance] = first.placement.instance_ids
    instances = _instances_of(account, first.job_id)
    assert instances[ended_instance] == "terminated"
    assert [i for i, state in instances.items() if state == "running"] == (
        again.placement.instance_ids
    )

    # Nothing is left once the job is cancelled: every instance it ever had is terminated.
    settings = Settings.from_env(account.environment())
    build_lifecycle(aws_ports(settings), settings).cancel(first.job_id)
    assert set(_instances_of(account, first.job_id).values()) <= {"shutting-down", "terminated"}
