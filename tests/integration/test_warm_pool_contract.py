"""The warm pool behind the fleet port: EC2 + DynamoDB (moto) and in-memory keep the same
promises. A launch that may use the pool takes an idle warm instance instead of launching one;
two launches never take the same instance; a retried launch keeps the one it took."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.adapters.aws.warm_pool import DynamoWarmPool
from gpufleet.adapters.local.memory import FakeFleet, ManualClock
from gpufleet.domain.config import WarmPool
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.emulator.account import Account
from gpufleet.ports import Fleet
from gpufleet.topology import QUEUE_TABLE, TAG_MANAGED

POOL = WarmPool(instance_type="g5.xlarge", count=2, ttl_minutes=30, capacity_type="spot")
_jobs = iter(range(1, 1_000_000))


def job_id() -> str:
    return f"j-{next(_jobs):020x}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=time.time())


@pytest.fixture(params=["ec2", "memory"])
def fleet(request: pytest.FixtureRequest, account: Account, clock: ManualClock) -> Fleet:
    if request.param == "memory":
        return FakeFleet(warm_pool=POOL, clock=clock)
    ec2 = account.client("ec2")
    # The module shares one account: no instance of an earlier test may look warm here.
    earlier = [
        i["InstanceId"]
        for r in ec2.describe_instances(
            Filters=[{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]
        )["Reservations"]
        for i in r["Instances"]
    ]
    if earlier:
        ec2.terminate_instances(InstanceIds=earlier)
    dynamodb = account.client("dynamodb")
    table = f"queue-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=table,
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
    assert (QUEUE_TABLE.partition_key, QUEUE_TABLE.sort_key) == ("pk", "sk")
    return Ec2Fleet(
        ec2,
        account.launch_templates,
        account.subnet_ids,
        warm_pool=DynamoWarmPool(dynamodb, table, POOL, clock),
    )


def request(
    job: str,
    *,
    instance_type: str = "g5.xlarge",
    nodes: int = 1,
    capacity: CapacityType = CapacityType.SPOT,
) -> LaunchRequest:
    return LaunchRequest(
        job_id=job,
        attempt=0,
        capacity_type=capacity,
        nodes=nodes,
        overrides=[
            LaunchOverride(instance_type=instance_type, zone=None, hourly_usd=0.5),
            LaunchOverride(instance_type="g6.xlarge", zone=None, hourly_usd=0.45),
        ],
    )


def idle_ids(fleet: Fleet) -> list[str]:
    return sorted(i.instance_id for i in fleet.warm_pool().idle)


def test_a_new_pool_is_empty_and_in_demand(fleet: Fleet, clock: ManualClock) -> None:
    status = fleet.warm_pool()
    assert status.idle == []
    assert status.demand_at == pytest.approx(clock.now())
    clock.advance(60)
    assert fleet.warm_pool().demand_at == pytest.approx(clock.now() - 60)  # remembered


def test_warm_instances_are_idle_and_belong_to_no_job(fleet: Fleet) -> None:
    added = fleet.add_warm_instances(2)
    assert len(added) == 2
    assert idle_ids(fleet) == sorted(added)
    managed = {m.instance_id: m for m in fleet.managed_instances()}
    assert all(managed[i].warm and managed[i].job_id is None for i in added)
    assert fleet.job_of(added[0]) is None


def test_a_launch_of_the_warm_type_takes_a_warm_instance(fleet: Fleet, clock: ManualClock) -> None:
    [warm] = fleet.add_warm_instances(1)
    clock.advance(600)
    job = job_id()
    result = fleet.launch(request(job))
    assert result.instance_ids == [warm]
    assert result.instance_type == "g5.xlarge" and result.capacity_type is CapacityType.SPOT
    assert fleet.job_of(warm) == job
    assert idle_ids(fleet) == []
    assert fleet.warm_pool().demand_at == pytest.approx(clock.now())
    [taken] = [m for m in fleet.managed_instances() if m.instance_id == warm]
    # From now on it is the job's instance, and counts from when the job took it.
    assert taken.job_id == job and not taken.warm
    assert taken.launched_at == pytest.approx(clock.now())
    assert fleet.terminate_job_instances(job) == [warm]


def test_a_retried_launch_keeps_the_instance_it_took(fleet: Fleet) -> None:
    added = fleet.add_warm_instances(2)
    job = job_id()
    first = fleet.launch(request(job)).instance_ids
    assert fleet.launch(request(job)).instance_ids == first
    assert idle_ids(fleet) == sorted(set(added) - set(first))


def test_launches_that_cannot_use_the_pool_launch_as_usual(fleet: Fleet) -> None:
    [warm] = fleet.add_warm_instances(1)
    for other in (
        request(job_id(), nodes=2),  # multi-node: its own placement group, all at once
        request(job_id(), instance_type="g6.xlarge"),
        request(job_id(), capacity=CapacityType.ON_DEMAND),  # another price
    ):
        launched = fleet.launch(other)
        assert launched.launched and warm not in launched.instance_ids
    assert idle_ids(fleet) == [warm]


def test_concurrent_launches_take_a_warm_instance_exactly_once(fleet: Fleet) -> None:
    [warm] = fleet.add_warm_instances(1)
    jobs = [job_id() for _ in range(6)]
    results: dict[str, list[str]] = {}
    start = threading.Barrier(len(jobs))

    def launch(job: str) -> None:
        start.wait()
        results[job] = fleet.launch(request(job)).instance_ids

    threads = [threading.Thread(target=launch, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [job for job, ids in results.items() if warm in ids]
    assert len(winners) == 1
    assert fleet.job_of(warm) == winners[0]
    every_instance: list[Any] = [i for ids in results.values() for i in ids]
    assert len(every_instance) == len(set(every_instance)) == len(jobs)  # one each, no sharing


def test_a_top_up_names_one_subnet_per_zone_and_a_retried_pass_launches_nothing_more(
    fleet: Fleet, account: Account
) -> None:
    if not isinstance(fleet, Ec2Fleet):
        pytest.skip("what CreateFleet is asked: EC2's")
    ec2 = account.client("ec2")
    first = ec2.describe_subnets(SubnetIds=[account.subnet_ids[0]])["Subnets"][0]
    twin = ec2.create_subnet(
        VpcId=first["VpcId"],
        CidrBlock="172.31.250.0/24",
        AvailabilityZone=first["AvailabilityZone"],
    )["Subnet"]["SubnetId"]
    # deploy.md allows two subnets in one zone; an EC2 Fleet cannot span them.
    subnets = [*account.subnet_ids, twin]
    two_in_one_zone = Ec2Fleet(ec2, account.launch_templates, subnets, warm_pool=fleet._warm)
    asked: list[dict[str, Any]] = []
    added: list[str] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        asked.append(dict(params))

    def not_listed_yet(parsed: dict[str, Any], **_: Any) -> None:
        # Eventual consistency: the retried pass does not see what the first call launched.
        for reservation in parsed.get("Reservations", []):
            reservation["Instances"] = [
                i for i in reservation["Instances"] if i["InstanceId"] not in added
            ]

    ec2.meta.events.register("provide-client-params.ec2.CreateFleet", keep)
    ec2.meta.events.register("after-call.ec2.DescribeInstances", not_listed_yet)
    try:
        added.extend(two_in_one_zone.add_warm_instances(1))
        # The same pass again (a Reconcile the Scheduler retried): EC2 answers the first call.
        again = two_in_one_zone.add_warm_instances(1)
        overrides = [o for c in asked[0]["LaunchTemplateConfigs"] for o in c["Overrides"]]
        described = ec2.describe_subnets(SubnetIds=[o["SubnetId"] for o in overrides])["Subnets"]
    finally:
        ec2.meta.events.unregister("provide-client-params.ec2.CreateFleet", keep)
        ec2.meta.events.unregister("after-call.ec2.DescribeInstances", not_listed_yet)
        ec2.terminate_instances(InstanceIds=added)
        ec2.delete_subnet(SubnetId=twin)
    zones = [subnet["AvailabilityZone"] for subnet in described]
    assert len(zones) == len(set(zones)) == len(account.subnet_ids)
    assert again == added and len(added) == 1
