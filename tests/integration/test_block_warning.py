"""EC2's "Capacity Block Reservation Expiration Warning" on the embedded account, through the
real rule and function (BlockEnding): the runs on the warned block checkpoint and go back to the
queue at once, no retry used, hours before the config's end would have had the reconciler drain
them; their relaunch, and every launch after, goes elsewhere than the warned block. (Another
block's warning, and the same warning again, ask nothing: tests/unit/test_reconciler.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.domain.job import Job
from gpufleet.domain.queueing import QueuePolicy
from gpufleet.domain.settlement import RESERVATION_ENDING
from gpufleet.emulator.account import ACCOUNT_ID, Account
from gpufleet.emulator.ec2_rules import put_ec2_event
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.topology import DETAIL_BLOCK_EXPIRATION_WARNING, RUNS_PREFIX
from tests.helpers import with_passes
from tests.integration.test_blocks_and_windows import (
    account_with_nodes,
    job_named,
    placed,
    submit,
)

END = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=6)
BLOCK = Reservation(
    id="cr-0aaaaaaaaaaaaaaaa",
    kind=ReservationKind.CAPACITY_BLOCK,
    instance_type="g5.xlarge",
    zone="us-east-1a",
    count=1,
    start=END - timedelta(days=1),
    end=END,
    hourly_usd=0.5,
)


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    config = FleetConfig(
        reservations=[BLOCK], queue=QueuePolicy(reserve_share=0.0, preemption_grace_seconds=10)
    )
    # Its run ends only by checkpointing, as a drain asks.
    scenario = NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=600.0))
    with account_with_nodes(config, scenario) as created:
        yield created


def _warn(account: Account) -> None:
    detail = {"capacity-reservation-id": BLOCK.id, "end-date": END.isoformat()}
    arn = f"arn:aws:ec2:{account.region}:{ACCOUNT_ID}:capacity-reservation/{BLOCK.id}"
    put_ec2_event(account.client("events"), DETAIL_BLOCK_EXPIRATION_WARNING, detail, arn)


def test_the_warning_drains_the_blocks_runs_at_once(account: Account) -> None:
    submit(account, "on-block", "vision", "expected_duration: 1h\n")
    run = placed(account, "on-block")
    assert run.placement is not None and run.placement.reservation_id == BLOCK.id

    _warn(account)  # the rule hands it to BlockEnding, which drains the block's run

    def requeued() -> Job | None:
        job = job_named(account, "on-block")
        return job if job is not None and job.prior_held_seconds > 0 else None

    again = with_passes(account, requeued, "the warned run's requeue")
    # Asked to checkpoint for the block's end (a version of the control object: the next run
    # may have written its own since), and back to the queue for it: neither a retry nor an
    # interruption used.
    assert {
        "action": "checkpoint",
        "reason": RESERVATION_ENDING,
        "for_job_id": None,
    } in _versions(account, f"{RUNS_PREFIX}{run.job_id}/control.json")
    assert (again.retries, again.interruptions, again.preemptions) == (0, 0, 0)
    # Relaunched, with the config's hours still left on the block: not on it.
    relaunched = placed(account, "on-block")
    assert relaunched.placement is not None and relaunched.placement.reservation_id is None


def _versions(account: Account, key: str) -> list[Any]:
    """Every version the bucket kept of the JSON object `key`."""
    s3 = account.client("s3")
    listed = s3.list_object_versions(Bucket=account.bucket, Prefix=key).get("Versions", [])
    return [
        json.loads(
            s3.get_object(Bucket=account.bucket, Key=key, VersionId=v["VersionId"])["Body"].read()
        )
        for v in listed
        if v["Key"] == key
    ]
