"""CreateFleet and release on the embedded account: moto's EC2 held to EC2's launch rules
(`gpufleet.emulator.ec2_rules`), with real-shaped capacity errors injected."""

from __future__ import annotations

from typing import Any, cast

import botocore.handlers
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from gpufleet.adapters.aws.fleet import MAX_CLIENT_TOKENS, Ec2Fleet
from gpufleet.adapters.local.memory import (
    InMemoryJobQueue,
    InMemoryJobStore,
    InMemoryObjects,
    in_memory_ports,
)
from gpufleet.domain.boot import EfaWidth, network_interfaces
from gpufleet.domain.launch import (
    NO_LAUNCH_TEMPLATE,
    TOKENS_SPENT,
    CapacityType,
    ErrorCategory,
    LaunchOverride,
    LaunchRequest,
    classify_launch_error,
)
from gpufleet.emulator import ec2_rules
from gpufleet.emulator.account import AMI_BY_ARCH, Account
from gpufleet.ports import StatusChange
from gpufleet.services.factory import build_lifecycle
from gpufleet.topology import TAG_JOB_ID, TAG_MANAGED
from tests.helpers import SPEC_YAML, intake_for, make_settings, plan_of

PLAIN = "x86_64-nvidia"  # the launch template of single-node NVIDIA x86_64 jobs
_jobs = iter(range(1, 1_000_000))


def job_id() -> str:
    return f"j-{next(_jobs):020x}"


@pytest.fixture
def ec2(account: Account) -> Any:
    return account.client("ec2")


@pytest.fixture
def fleet(account: Account, ec2: Any) -> Ec2Fleet:
    return Ec2Fleet(ec2, account.launch_templates, account.subnet_ids)


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


def live_instances_of(ec2: Any, job: str) -> set[str]:
    reservations = ec2.describe_instances(
        Filters=[
            {"Name": f"tag:{TAG_JOB_ID}", "Values": [job]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    return {i["InstanceId"] for r in reservations for i in r["Instances"]}


def moto_alone(account: Account) -> Any:
    """A client of the same account without EC2's launch rules: what moto by itself answers."""
    client = account.client("ec2")
    for event, handler, *_ in botocore.handlers.BUILTIN_HANDLERS:
        if getattr(handler, "__module__", "") == ec2_rules.__name__:
            client.meta.events.unregister(event, handler)
    return client


def fleet_request(
    template: str, subnet: str, capacity: str = "on-demand", **extra: Any
) -> dict[str, Any]:
    """A bare instant CreateFleet of one g5.xlarge from `template`."""
    return {
        "Type": "instant",
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": [{"InstanceType": "g5.xlarge", "SubnetId": subnet}],
            }
        ],
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": 1,
            "DefaultTargetCapacityType": capacity,
        },
        **extra,
    }


def launched(response: dict[str, Any]) -> list[str]:
    return [i for group in response.get("Instances", []) for i in group["InstanceIds"]]


def error_codes(response: dict[str, Any]) -> set[str]:
    return {e["ErrorCode"] for e in response.get("Errors", [])}


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


def test_a_partial_launch_is_terminated_even_before_ec2_lists_its_instances(
    fleet: Ec2Fleet, ec2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.sleep", lambda _: None)
    seen_by_fleet: list[str] = []
    unseen_answers = [1]

    def drop_one(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Instances"][-1]["InstanceIds"].pop()
        seen_by_fleet.extend(i for group in parsed["Instances"] for i in group["InstanceIds"])

    def not_listed_yet(**_: Any) -> Any:
        # Eventual consistency: right after CreateFleet, EC2 may not know the ids it answered.
        if not unseen_answers:
            return None
        unseen_answers.pop()
        error = {"Code": "InvalidInstanceID.NotFound", "Message": "does not exist"}
        return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 400, {}, None), {
            "Error": error,
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }

    ec2.meta.events.register("after-call.ec2.CreateFleet", drop_one)
    ec2.meta.events.register_first("before-call.ec2.TerminateInstances", not_listed_yet)
    try:
        result = fleet.launch(request(job_id(), nodes=3))
    finally:
        ec2.meta.events.unregister("after-call.ec2.CreateFleet", drop_one)
        ec2.meta.events.unregister("before-call.ec2.TerminateInstances", not_listed_yet)
    assert not result.launched and not unseen_answers
    assert len(seen_by_fleet) == 2
    assert states(ec2, seen_by_fleet) == {"terminated"}


def test_terminate_instances_takes_at_most_1000_ids(account: Account, ec2: Any) -> None:
    with pytest.raises(ClientError, match="up to 1000 instance IDs"):
        ec2.terminate_instances(InstanceIds=[f"i-{n:017x}" for n in range(1001)])


class _TerminateOnly:
    """An EC2 client that terminates as EC2 does, refusing more than 1,000 ids a call (the
    embedded account refuses the same: `test_terminate_instances_takes_at_most_1000_ids`)."""

    def __init__(self) -> None:
        self.terminated: list[str] = []

    def terminate_instances(self, InstanceIds: list[str]) -> None:  # boto3 names it so
        if len(InstanceIds) > 1000:
            raise ClientError({"Error": {"Code": "InvalidParameterValue"}}, "TerminateInstances")
        self.terminated.extend(InstanceIds)


def test_more_than_1000_instances_are_terminated_in_batches() -> None:
    client = _TerminateOnly()
    orphans = [f"i-{n:017x}" for n in range(2001)]
    Ec2Fleet(client, {PLAIN: "lt-0"}, ["subnet-0"]).terminate_instances(orphans)
    assert client.terminated == orphans


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
    reservation = ec2.create_capacity_reservation(
        InstanceType="p4d.24xlarge",
        InstancePlatform="Linux/UNIX",
        AvailabilityZone="us-east-1a",
        InstanceCount=2,
        InstanceMatchCriteria="targeted",
    )["CapacityReservation"]["CapacityReservationId"]
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
                        reservation_id=reservation,
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
        "CapacityReservationTarget": {"CapacityReservationId": reservation}
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


def test_each_type_launches_from_the_template_of_its_boot_target_and_efa_width(
    account: Account, ec2: Any
) -> None:
    fleet = Ec2Fleet(ec2, account.launch_templates, account.subnet_ids)
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register(
        "provide-client-params.ec2.CreateFleet", lambda params, **_: sent.append(params)
    )
    overrides = [
        LaunchOverride(instance_type=name, zone="us-east-1a", hourly_usd=1.0)
        for name in ("p5.48xlarge", "p4d.24xlarge", "g5.xlarge")
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
    by_key = {template: key for key, template in account.launch_templates.items()}
    multi, single = (
        {
            by_key[c["LaunchTemplateSpecification"]["LaunchTemplateId"]]: [
                o["InstanceType"] for o in c["Overrides"]
            ]
            for c in params["LaunchTemplateConfigs"]
        }
        for params in sent[-2:]
    )
    # EFA only pays off between nodes: each EFA type of a multi-node job gets its full width
    # (CreateFleet overrides cannot set interfaces, so one config per template).
    assert multi == {
        "x86_64-nvidia-efa32": ["p5.48xlarge"],
        "x86_64-nvidia-efa4": ["p4d.24xlarge"],
        "x86_64-nvidia": ["g5.xlarge"],
    }
    assert single == {PLAIN: ["p5.48xlarge", "p4d.24xlarge", "g5.xlarge"]}
    [version] = ec2.describe_launch_template_versions(
        LaunchTemplateId=account.launch_templates["x86_64-nvidia-efa4"]
    )["LaunchTemplateVersions"]
    interfaces = version["LaunchTemplateData"]["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"),
        (1, 0, "efa-only"),
        (2, 0, "efa-only"),
        (3, 0, "efa-only"),
    ]


def test_a_type_no_template_boots_is_not_asked_of_ec2(account: Account, ec2: Any) -> None:
    nvidia_only = {PLAIN: account.launch_templates[PLAIN]}
    fleet = Ec2Fleet(ec2, nvidia_only, account.subnet_ids)
    result = fleet.launch(
        LaunchRequest(
            job_id=job_id(),
            attempt=0,
            capacity_type=CapacityType.ON_DEMAND,
            nodes=1,
            overrides=[LaunchOverride(instance_type="trn1.2xlarge", zone=None, hourly_usd=1.3)],
        )
    )
    assert not result.launched
    assert [e.code for e in result.errors] == [NO_LAUNCH_TEMPLATE]
    assert classify_launch_error(NO_LAUNCH_TEMPLATE) is ErrorCategory.CONFIGURATION


# -- EC2's launch rules: moto alone accepts each of these, EC2 (and the embedded account) not ---


def test_a_template_that_tags_spot_requests_fails_every_launch_that_makes_none(
    account: Account, ec2: Any
) -> None:
    subnet = account.subnet_ids[0]
    template = ec2.create_launch_template(
        LaunchTemplateName="tags-spot-requests",
        LaunchTemplateData={
            "ImageId": AMI_BY_ARCH["x86_64"],
            "TagSpecifications": [
                {"ResourceType": "spot-instances-request", "Tags": [{"Key": "k", "Value": "v"}]}
            ],
        },
    )["LaunchTemplate"]["LaunchTemplateId"]
    lax = moto_alone(account)
    assert launched(lax.create_fleet(**fleet_request(template, subnet)))
    refused = ec2.create_fleet(**fleet_request(template, subnet))
    # As Karpenter met it (karpenter-provider-aws#5850): per override, HTTP 200, no instances.
    assert launched(refused) == [] and error_codes(refused) == {"InvalidParameterValue"}
    assert "no Spot instances requests" in refused["Errors"][0]["ErrorMessage"]
    assert refused["Errors"][0]["Lifecycle"] == "on-demand"
    # A spot launch makes spot requests: the same template launches.
    assert launched(ec2.create_fleet(**fleet_request(template, subnet, "spot")))
    run = {"LaunchTemplate": {"LaunchTemplateId": template}, "MinCount": 1, "MaxCount": 1}
    assert lax.run_instances(**run)["Instances"]
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        ec2.run_instances(**run)


def _template(ec2: Any, name: str, **data: Any) -> str:
    template: str = ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)[
        "LaunchTemplate"
    ]["LaunchTemplateId"]
    return template


def _one_of(template: str, instance_type: str, subnet: str) -> dict[str, Any]:
    request = fleet_request(template, subnet)
    request["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"] = instance_type
    return request


def test_an_image_of_another_architecture_than_the_type_is_refused(
    account: Account, ec2: Any
) -> None:
    lax = moto_alone(account)
    subnet = account.subnet_ids[0]
    arm_image = _template(ec2, "arm-image", ImageId=AMI_BY_ARCH["arm64"])
    request = _one_of(arm_image, "g5.xlarge", subnet)
    assert launched(lax.create_fleet(**request))
    refused = ec2.create_fleet(**request)
    assert launched(refused) == [] and error_codes(refused) == {"InvalidParameterValue"}
    assert (
        "architecture 'x86_64' of the specified instance type does not match the "
        in (refused["Errors"][0]["ErrorMessage"])
    )
    assert launched(ec2.create_fleet(**_one_of(arm_image, "g5g.xlarge", subnet)))
    run = {
        "LaunchTemplate": {"LaunchTemplateId": arm_image},
        "InstanceType": "c5.large",
        "MinCount": 1,
        "MaxCount": 1,
    }
    with pytest.raises(ClientError, match="does not match the architecture 'arm64'"):
        ec2.run_instances(**run)


@pytest.mark.parametrize(
    ("instance_type", "width", "why"),
    [
        ("g5.xlarge", EfaWidth(1, 1), "does not support Elastic Fabric Adapter"),
        ("p4d.24xlarge", EfaWidth(5, 5), "at most 4 EFA interfaces"),
        ("g6e.48xlarge", EfaWidth(4, 8), "Network card index 4 is out of range"),
    ],
)
def test_efa_interfaces_must_fit_the_type(
    account: Account, ec2: Any, instance_type: str, width: EfaWidth, why: str
) -> None:
    group = ec2.describe_security_groups(GroupNames=["default"])["SecurityGroups"][0]["GroupId"]
    template = _template(
        ec2,
        f"efa-{instance_type}-{width.name}",
        ImageId=AMI_BY_ARCH["x86_64"],
        NetworkInterfaces=network_interfaces(width, group),
    )
    request = _one_of(template, instance_type, account.subnet_ids[0])
    assert launched(moto_alone(account).create_fleet(**request))
    refused = ec2.create_fleet(**request)
    assert launched(refused) == [] and why in refused["Errors"][0]["ErrorMessage"]


def test_the_stacks_efa_templates_launch_the_types_of_their_width(
    account: Account, ec2: Any
) -> None:
    for key, instance_type in (
        ("x86_64-nvidia-efa32", "p5.48xlarge"),
        ("x86_64-nvidia-efa16of17", "p6-b300.48xlarge"),
        ("x86_64-neuron-efa16", "trn1n.32xlarge"),
    ):
        request = _one_of(account.launch_templates[key], instance_type, account.subnet_ids[0])
        assert launched(ec2.create_fleet(**request)), key


def test_tags_a_launch_cannot_give_are_refused(account: Account, ec2: Any) -> None:
    lax = moto_alone(account)
    # An instant fleet tags only itself and its instances: not its spot requests.
    tagged = fleet_request(
        account.launch_templates[PLAIN],
        account.subnet_ids[0],
        "spot",
        TagSpecifications=[
            {"ResourceType": "spot-instances-request", "Tags": [{"Key": "k", "Value": "v"}]}
        ],
    )
    assert launched(lax.create_fleet(**tagged))
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        ec2.create_fleet(**tagged)
    # A template tags only instances, volumes, network interfaces and spot requests.
    tags = [{"Key": "k", "Value": "v"}]
    data = {
        "ImageId": AMI_BY_ARCH["x86_64"],
        "TagSpecifications": [{"ResourceType": "fleet", "Tags": tags}],
    }
    lax.create_launch_template(LaunchTemplateName="tags-fleet-lax", LaunchTemplateData=data)
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        ec2.create_launch_template(LaunchTemplateName="tags-fleet", LaunchTemplateData=data)


def test_a_client_token_answers_with_its_first_call_even_once_its_instances_ended(
    account: Account, ec2: Any
) -> None:
    request = fleet_request(
        account.launch_templates[PLAIN], account.subnet_ids[0], ClientToken=f"token-{job_id()}"
    )
    first = ec2.create_fleet(**request)
    ec2.terminate_instances(InstanceIds=launched(first))
    again = ec2.create_fleet(**request)
    assert again["FleetId"] == first["FleetId"] and launched(again) == launched(first)
    assert states(ec2, launched(again)) == {"terminated"}
    other = {**request, "TargetCapacitySpecification": {"TotalTargetCapacity": 2}}
    with pytest.raises(ClientError, match="IdempotentParameterMismatch"):
        ec2.create_fleet(**other)
    lax = moto_alone(account)
    assert lax.create_fleet(**request)["FleetId"] != first["FleetId"]
    assert launched(lax.create_fleet(**other))


def test_a_launch_names_only_placement_groups_and_reservations_that_exist(
    account: Account, ec2: Any
) -> None:
    lax = moto_alone(account)
    subnets = ec2.describe_subnets(SubnetIds=account.subnet_ids)["Subnets"]
    here, elsewhere = subnets[0], subnets[1]
    grouped = fleet_request(account.launch_templates[PLAIN], here["SubnetId"])
    grouped["LaunchTemplateConfigs"][0]["Overrides"][0]["Placement"] = {"GroupName": "no-such"}
    assert launched(lax.create_fleet(**grouped))
    assert error_codes(ec2.create_fleet(**grouped)) == {"InvalidPlacementGroup.Unknown"}

    reservation = ec2.create_capacity_reservation(
        InstanceType="p4d.24xlarge",
        InstancePlatform="Linux/UNIX",
        AvailabilityZone=here["AvailabilityZone"],
        InstanceCount=1,
        InstanceMatchCriteria="targeted",
    )["CapacityReservation"]["CapacityReservationId"]

    def into(target: str, instance_type: str = "p4d.24xlarge", subnet: Any = here) -> Any:
        return {
            "LaunchTemplate": {"LaunchTemplateId": account.launch_templates[PLAIN]},
            "InstanceType": instance_type,
            "SubnetId": subnet["SubnetId"],
            "MinCount": 1,
            "MaxCount": 1,
            "CapacityReservationSpecification": {
                "CapacityReservationTarget": {"CapacityReservationId": target}
            },
        }

    assert lax.run_instances(**into("cr-00000000000000000"))["Instances"]
    with pytest.raises(ClientError, match=r"InvalidCapacityReservationId\.NotFound"):
        ec2.run_instances(**into("cr-00000000000000000"))
    for mismatched in (into(reservation, "g5.xlarge"), into(reservation, subnet=elsewhere)):
        with pytest.raises(ClientError, match="ReservationCapacityExceeded"):
            ec2.run_instances(**mismatched)
    [instance] = ec2.run_instances(**into(reservation))["Instances"]
    with pytest.raises(ClientError, match="ReservationCapacityExceeded"):
        ec2.run_instances(**into(reservation))  # its one instance is taken

    def available() -> int:
        [described] = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation])[
            "CapacityReservations"
        ]
        return int(described["AvailableInstanceCount"])

    assert available() == 0
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    assert available() == 1


# -- retried launches ----------------------------------------------------------------------------


def test_a_retried_launch_keeps_what_its_first_call_launched(fleet: Ec2Fleet, ec2: Any) -> None:
    job = job_id()
    first = fleet.launch(request(job, nodes=2))
    again = fleet.launch(request(job, nodes=2))
    assert again.instance_ids == first.instance_ids
    assert live_instances_of(ec2, job) == set(first.instance_ids)


def test_a_retry_never_takes_instances_that_ended_since(fleet: Ec2Fleet, ec2: Any) -> None:
    job = job_id()
    first = fleet.launch(request(job))
    ec2.terminate_instances(InstanceIds=first.instance_ids)  # e.g. the reconciler, or a reclaim
    again = fleet.launch(request(job))
    assert again.launched and not set(again.instance_ids) & set(first.instance_ids)
    assert live_instances_of(ec2, job) == set(again.instance_ids)


def test_a_retry_with_other_offerings_launches_anew_and_ends_the_first_fleet(
    fleet: Ec2Fleet, ec2: Any
) -> None:
    job = job_id()
    first = fleet.launch(request(job))
    changed = request(job).model_copy(update={"overrides": request(job).overrides[1:]})
    calls: list[str] = []

    def note(model: Any, **_: Any) -> None:
        calls.append(model.name)

    for operation in ("CreateFleet", "TerminateInstances"):
        ec2.meta.events.register(f"provide-client-params.ec2.{operation}", note)
    try:
        again = fleet.launch(changed)  # the first token's parameters differ: it is spent
    finally:
        for operation in ("CreateFleet", "TerminateInstances"):
            ec2.meta.events.unregister(f"provide-client-params.ec2.{operation}", note)
    assert again.launched and again.instance_type == "g6.xlarge"
    assert states(ec2, first.instance_ids) == {"terminated"}
    assert live_instances_of(ec2, job) == set(again.instance_ids)
    # The first fleet ended before the next token could launch: never two fleets alive.
    assert calls == ["CreateFleet", "TerminateInstances", "CreateFleet"]


def test_an_attempt_whose_tokens_are_all_spent_fails_for_the_next_attempt(
    fleet: Ec2Fleet, ec2: Any
) -> None:
    job = job_id()
    for _ in range(MAX_CLIENT_TOKENS):
        ended = fleet.launch(request(job))
        ec2.terminate_instances(InstanceIds=ended.instance_ids)
    spent = fleet.launch(request(job))
    assert not spent.launched and spent.errors[0].code == TOKENS_SPENT
    assert spent.error_category is ErrorCategory.TRANSIENT
    assert fleet.launch(request(job).model_copy(update={"attempt": 1})).launched


class DiesOnceRecording(InMemoryJobQueue):
    """The Launch function dies after CreateFleet, as it records the launch, once."""

    died = False

    def record_launch(self, change: StatusChange, hourly_usd: float, stop_at: float | None) -> bool:
        if not self.died:
            self.died = True
            raise RuntimeError("Launch died after CreateFleet")
        return super().record_launch(change, hourly_usd, stop_at)


@pytest.mark.parametrize("offerings_changed", [False, True], ids=["same", "changed"])
def test_a_launch_retried_after_it_died_records_live_instances_only(
    account: Account, ec2: Any, offerings_changed: bool
) -> None:
    jobs = InMemoryJobStore()
    ports = in_memory_ports(
        jobs=jobs,
        queue=DiesOnceRecording(jobs),
        fleet=Ec2Fleet(ec2, account.launch_templates, account.subnet_ids),
    )
    settings = make_settings()
    cast(InMemoryObjects, ports.objects).objects["jobs/vision/a.yaml"] = SPEC_YAML
    delivery = job_id()  # a delivery of its own: a job (and client tokens) of its own
    job = intake_for(ports, settings).submit_object("jobs/vision/a.yaml", delivery, delivery).job_id
    assert job is not None
    service, plan = build_lifecycle(ports, settings), plan_of(ports, job)
    with pytest.raises(RuntimeError, match="died"):
        service.launch(job, plan, step=0, attempt=0, task_token="run")
    first_fleet = live_instances_of(ec2, job)
    assert first_fleet
    if offerings_changed:  # the first choice ran out since: the retry asks for other offerings
        first = plan.steps[0].overrides[0]
        zone = first.zone or settings.region
        ports.capacity.remember([f"spot:{first.instance_type}:{zone}"], until=1e12)
    # The state machine retries the task: the same attempt.
    assert service.launch(job, plan, step=0, attempt=0, task_token="run") is None
    placement = ports.jobs.get(job).placement
    assert placement is not None
    assert live_instances_of(ec2, job) == set(placement.instance_ids)
    assert (set(placement.instance_ids) == first_fleet) is not offerings_changed
    assert ports.jobs.get(job).alarming == []  # the run's metric alarms start afresh
