"""CreateFleet and release against moto's EC2, with real-shaped capacity errors injected."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.launch import CapacityType, ErrorCategory, LaunchOverride, LaunchRequest
from gpufleet.emulator.account import Account
from gpufleet.topology import TAG_JOB_ID, TAG_MANAGED

_jobs = iter(range(1, 1_000_000))


def job_id() -> str:
    return f"j-{next(_jobs):020x}"


@pytest.fixture
def ec2(account: Account) -> Any:
    return account.client("ec2")


@pytest.fixture
def fleet(account: Account, ec2: Any) -> Ec2Fleet:
    return Ec2Fleet(ec2, account.launch_template_id, account.subnet_ids)


def request(job: str, nodes: int = 1, capacity: CapacityType = CapacityType.SPOT) -> LaunchRequest:
    return LaunchRequest(
        job_id=job,
        attempt=0,
        capacity_type=capacity,
        nodes=nodes,
        overrides=[
            LaunchOverride(instance_type="g5.xlarge", zone="us-east-1a", hourly_usd=0.4),
            LaunchOverride(instance_type="g6.xlarge", zone=None, hourly_usd=0.35),
        ],
    )


def states(ec2: Any, instance_ids: list[str]) -> set[str]:
    reservations = ec2.describe_instances(InstanceIds=instance_ids)["Reservations"]
    return {i["State"]["Name"] for r in reservations for i in r["Instances"]}


def test_a_launch_tags_every_instance_with_the_job(fleet: Ec2Fleet, ec2: Any) -> None:
    job = job_id()
    result = fleet.launch(request(job, nodes=2))
    assert result.launched and len(result.instance_ids) == 2
    assert result.instance_type == "g5.xlarge" and result.zone == "us-east-1a"
    reservations = ec2.describe_instances(InstanceIds=result.instance_ids)["Reservations"]
    for instance in (i for r in reservations for i in r["Instances"]):
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[TAG_JOB_ID] == job and tags[TAG_MANAGED] == "true"


def test_overrides_name_zones_by_name_or_by_id(fleet: Ec2Fleet, ec2: Any) -> None:
    zone_id = ec2.describe_subnets(SubnetIds=[fleet._subnet_ids[0]])["Subnets"][0][
        "AvailabilityZoneId"
    ]
    result = fleet.launch(
        LaunchRequest(
            job_id=job_id(),
            attempt=0,
            capacity_type=CapacityType.ON_DEMAND,
            nodes=1,
            overrides=[LaunchOverride(instance_type="g5.xlarge", zone=zone_id, hourly_usd=1.0)],
        )
    )
    assert result.launched and result.zone == zone_id


def test_a_capacity_error_comes_back_categorised(fleet: Ec2Fleet, ec2: Any) -> None:
    def no_capacity(**_: Any) -> tuple[Any, dict[str, Any]]:
        from botocore.awsrequest import AWSResponse

        parsed = {
            "FleetId": "fleet-1",
            "Instances": [],
            "Errors": [
                {
                    "LaunchTemplateAndOverrides": {
                        "Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-x"}
                    },
                    "Lifecycle": "spot",
                    "ErrorCode": "InsufficientInstanceCapacity",
                    "ErrorMessage": "There is no Spot capacity available",
                }
            ],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        return AWSResponse("https://ec2", 200, {}, None), parsed

    ec2.meta.events.register("before-call.ec2.CreateFleet", no_capacity)
    try:
        result = fleet.launch(request(job_id()))
    finally:
        ec2.meta.events.unregister("before-call.ec2.CreateFleet", no_capacity)
    assert not result.launched
    assert result.error_category is ErrorCategory.CAPACITY
    assert result.errors[0].instance_type == "g5.xlarge"


def test_a_partial_multi_node_launch_is_terminated(fleet: Ec2Fleet, ec2: Any) -> None:
    seen_by_fleet: list[str] = []

    def drop_one(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Instances"][-1]["InstanceIds"].pop()  # EC2 gave us fewer nodes than asked
        seen_by_fleet.extend(i for group in parsed["Instances"] for i in group["InstanceIds"])
        parsed["Errors"] = [{"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "x"}]

    ec2.meta.events.register("after-call.ec2.CreateFleet", drop_one)
    try:
        result = fleet.launch(request(job_id(), nodes=3))
    finally:
        ec2.meta.events.unregister("after-call.ec2.CreateFleet", drop_one)
    assert not result.launched
    assert result.error_category is ErrorCategory.CAPACITY
    assert len(seen_by_fleet) == 2
    assert states(ec2, seen_by_fleet) == {"terminated"}  # all or nothing


def test_release_terminates_only_the_jobs_tagged_instances(fleet: Ec2Fleet, ec2: Any) -> None:
    mine, other = job_id(), job_id()
    launched = fleet.launch(request(mine, nodes=2)).instance_ids
    survivor = fleet.launch(request(other)).instance_ids
    untagged = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    assert sorted(fleet.terminate_job_instances(mine)) == sorted(launched)
    assert states(ec2, launched) == {"terminated"}
    assert states(ec2, survivor) == {"running"}
    assert states(ec2, [untagged]) == {"running"}
    assert fleet.terminate_job_instances(mine) == []  # already released: a no-op


def test_a_capacity_block_is_targeted_by_id_with_run_instances(fleet: Ec2Fleet, ec2: Any) -> None:
    sent: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], **_: Any) -> None:
        sent.append(params)

    ec2.meta.events.register("provide-client-params.ec2.RunInstances", capture)
    try:
        result = fleet.launch(
            LaunchRequest(
                job_id=job_id(),
                attempt=0,
                capacity_type=CapacityType.RESERVED,
                nodes=2,
                overrides=[
                    LaunchOverride(
                        instance_type="p4d.24xlarge",
                        zone="us-east-1a",
                        hourly_usd=0.0,
                        reservation_id="cr-0123456789abcdef0",
                        capacity_block=True,
                    )
                ],
            )
        )
    finally:
        ec2.meta.events.unregister("provide-client-params.ec2.RunInstances", capture)
    assert result.launched and len(result.instance_ids) == 2
    [params] = sent
    assert params["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert params["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert params["MinCount"] == params["MaxCount"] == 2


def test_an_odcr_launch_uses_reservations_first(fleet: Ec2Fleet, ec2: Any) -> None:
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register(
        "provide-client-params.ec2.CreateFleet", lambda params, **_: sent.append(params)
    )
    result = fleet.launch(
        LaunchRequest(
            job_id=job_id(),
            attempt=0,
            capacity_type=CapacityType.RESERVED,
            nodes=1,
            overrides=[
                LaunchOverride(
                    instance_type="p4d.24xlarge",
                    zone="us-east-1a",
                    hourly_usd=0.0,
                    reservation_id="cr-0123456789abcdef0",
                )
            ],
        )
    )
    assert result.launched
    options = sent[-1]["OnDemandOptions"]
    assert options["CapacityReservationOptions"] == {
        "UsageStrategy": "use-capacity-reservations-first"
    }
    assert sent[-1]["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"


def test_managed_instances_are_listed_with_their_job_and_launch_time(
    fleet: Ec2Fleet, ec2: Any
) -> None:
    job = job_id()
    [instance] = fleet.launch(request(job)).instance_ids
    untagged = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    listed = {m.instance_id: m for m in fleet.managed_instances()}
    assert listed[instance].job_id == job and listed[instance].launched_at > 0
    assert untagged not in listed
    assert fleet.job_of(instance) == job and fleet.job_of(untagged) is None
    fleet.terminate_instances([instance])
    assert instance not in {m.instance_id for m in fleet.managed_instances()}


def test_multi_node_jobs_launch_into_their_own_cluster_placement_group(
    fleet: Ec2Fleet, ec2: Any
) -> None:
    job = job_id()
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register(
        "provide-client-params.ec2.CreateFleet", lambda params, **_: sent.append(params)
    )
    result = fleet.launch(request(job, nodes=2))
    assert result.launched
    group = f"gpufleet-{job}"
    overrides = sent[-1]["LaunchTemplateConfigs"][0]["Overrides"]
    assert all(o["Placement"] == {"GroupName": group} for o in overrides)
    [described] = ec2.describe_placement_groups(GroupNames=[group])["PlacementGroups"]
    assert described["Strategy"] == "cluster"
    assert job in fleet.placement_group_jobs()
    fleet.terminate_job_instances(job)
    assert fleet.delete_placement_group(job)
    assert job not in fleet.placement_group_jobs()
    assert not fleet.delete_placement_group(job)  # already gone: nothing to do


def test_multi_node_jobs_on_efa_types_launch_from_the_efa_template(
    account: Account, ec2: Any
) -> None:
    efa_types = frozenset(t.name for t in load_bundled().instance_types() if t.efa)
    assert "p4d.24xlarge" in efa_types and "g5.xlarge" not in efa_types
    fleet = Ec2Fleet(
        ec2,
        account.launch_template_id,
        account.subnet_ids,
        efa_launch_template_id=account.efa_launch_template_id,
        efa_types=efa_types,
    )
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register(
        "provide-client-params.ec2.CreateFleet", lambda params, **_: sent.append(params)
    )
    overrides = [
        LaunchOverride(instance_type="p4d.24xlarge", zone="us-east-1a", hourly_usd=20.0),
        LaunchOverride(instance_type="g5.xlarge", zone="us-east-1a", hourly_usd=0.4),
    ]
    for nodes in (2, 1):
        launched = fleet.launch(
            LaunchRequest(
                job_id=job_id(),
                attempt=0,
                capacity_type=CapacityType.ON_DEMAND,
                nodes=nodes,
                overrides=overrides,
            )
        )
        assert launched.launched and len(launched.instance_ids) == nodes
    multi, single = (
        {
            c["LaunchTemplateSpecification"]["LaunchTemplateId"]: [
                o["InstanceType"] for o in c["Overrides"]
            ]
            for c in params["LaunchTemplateConfigs"]
        }
        for params in sent[-2:]
    )
    # EFA only pays off between nodes: the EFA type of a multi-node job gets the EFA template.
    assert multi == {
        account.efa_launch_template_id: ["p4d.24xlarge"],
        account.launch_template_id: ["g5.xlarge"],
    }
    assert single == {account.launch_template_id: ["p4d.24xlarge", "g5.xlarge"]}
    [version] = ec2.describe_launch_template_versions(
        LaunchTemplateId=account.efa_launch_template_id
    )["LaunchTemplateVersions"]
    [interface] = version["LaunchTemplateData"]["NetworkInterfaces"]
    assert interface["InterfaceType"] == "efa" and interface["DeviceIndex"] == 0
