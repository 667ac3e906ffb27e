"""EC2's end of a Capacity Block on the embedded account (`emulator/capacity_blocks.py`), on an
EC2 clock the test moves: the expiration warning forty minutes before the block's end, then,
thirty minutes before it, every instance in the block terminated with its state-change events;
an instance outside the block is left alone, and nothing is sent twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.capacity_blocks import CapacityBlockEnds
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.topology import DETAIL_BLOCK_EXPIRATION_WARNING, DETAIL_STATE_CHANGE

END = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=10)
BLOCK = Reservation(
    id="cr-0aaaaaaaaaaaaaaaa",
    kind=ReservationKind.CAPACITY_BLOCK,
    instance_type="g5.xlarge",
    zone="us-east-1a",
    count=2,
    start=END - timedelta(hours=12),
    end=END,
    hourly_usd=0.5,
)


class Ec2Clock:
    def __init__(self) -> None:
        self.now = END - timedelta(minutes=41)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account(config=FleetConfig(reservations=[BLOCK])) as created, acting_as(EMULATOR):
        yield created


def _launch(account: Account, into_block: bool) -> str:
    ec2 = account.client("ec2")
    [subnet] = [
        s["SubnetId"]
        for s in ec2.describe_subnets(SubnetIds=account.subnet_ids)["Subnets"]
        if s["AvailabilityZone"] == BLOCK.zone
    ]
    block: dict[str, Any] = {
        "InstanceMarketOptions": {"MarketType": "capacity-block"},
        "CapacityReservationSpecification": {
            "CapacityReservationTarget": {"CapacityReservationId": BLOCK.id}
        },
    }
    answer = ec2.run_instances(
        LaunchTemplate={"LaunchTemplateId": account.launch_templates["x86_64-nvidia"]},
        InstanceType=BLOCK.instance_type,
        SubnetId=subnet,
        MinCount=1,
        MaxCount=1,
        **(block if into_block else {}),
    )
    return str(answer["Instances"][0]["InstanceId"])


def _ec2_events(account: Account) -> Iterator[list[dict[str, Any]]]:
    sqs, events = account.client("sqs"), account.client("events")
    url = sqs.create_queue(QueueName="ec2-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(Name="ec2-events", EventPattern=json.dumps({"source": ["aws.ec2"]}))
    events.put_targets(Rule="ec2-events", Targets=[{"Id": "q", "Arn": arn}])
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        yield [json.loads(m["Body"]) for m in got]


def _state(account: Account, instance_id: str) -> str:
    [reservation] = account.client("ec2").describe_instances(InstanceIds=[instance_id])[
        "Reservations"
    ]
    return str(reservation["Instances"][0]["State"]["Name"])


def test_ec2_warns_then_terminates_a_blocks_instances_before_its_end(account: Account) -> None:
    in_block, elsewhere = _launch(account, into_block=True), _launch(account, into_block=False)
    received = _ec2_events(account)
    next(received)
    clock = Ec2Clock()
    ends = CapacityBlockEnds(account, now=clock)

    ends.tick()  # 41 minutes before the end: nothing yet
    assert (ends.warned, ends.terminated, next(received)) == ([], [], [])

    clock.now = END - timedelta(minutes=40)
    ends.tick()
    [warning] = next(received)
    assert (warning["detail-type"], warning["source"]) == (
        DETAIL_BLOCK_EXPIRATION_WARNING,
        "aws.ec2",
    )
    assert warning["detail"] == {"capacity-reservation-id": BLOCK.id, "end-date": END.isoformat()}
    assert warning["resources"] == [
        f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{BLOCK.id}"
    ]
    assert _state(account, in_block) == "running"

    clock.now = END - timedelta(minutes=30)
    ends.tick()
    changes = next(received)
    assert [(e["detail-type"], e["detail"]) for e in changes] == [
        (DETAIL_STATE_CHANGE, {"instance-id": in_block, "state": "shutting-down"}),
        (DETAIL_STATE_CHANGE, {"instance-id": in_block, "state": "terminated"}),
    ]
    assert (_state(account, in_block), _state(account, elsewhere)) == ("terminated", "running")

    clock.now = END - timedelta(minutes=20)
    ends.tick()  # nothing twice
    assert next(received) == [] and ends.terminated == [in_block]
