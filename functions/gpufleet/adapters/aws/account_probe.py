"""Read-only reads of an account for `gpufleet doctor`: STS, CloudFormation, SSM, IAM, Service
Quotas, Lambda, EC2 and SNS, turned into the facts `domain.readiness` decides on.

Nothing here changes the account. A read that fails (no credentials, access denied, throttled
past the SDK's retries, no such stack) raises `ProbeError`, naming the IAM action it needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.adapters.aws.runtime import client
from gpufleet.domain.readiness import (
    Identity,
    Network,
    ProbeError,
    Route,
    RouteTable,
    StackFacts,
    Subnet,
    Subscription,
    VpcEndpoint,
)

_SSM_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<"
# GetParameters takes at most 10 names a call.
_SSM_BATCH = 10
_T = TypeVar("_T")


def _read(action: str, call: Callable[[], _T]) -> _T:
    try:
        return call()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise ProbeError(action, f"{error.get('Code')}: {error.get('Message')}") from None
    except BotoCoreError as exc:  # no credentials, no endpoint, ...
        raise ProbeError(action, str(exc)) from None


class AwsAccountProbe:
    def __init__(self, region: str) -> None:
        self._region = region
        self._clients: dict[str, Any] = {}

    def _client(self, service: str) -> Any:
        """One client per service: building one costs a few tenths of a second."""
        if service not in self._clients:
            self._clients[service] = client(service, self._region)
        return self._clients[service]

    def identity(self) -> Identity:
        def call() -> Identity:
            answer = self._client("sts").get_caller_identity()
            return Identity(account=str(answer["Account"]), arn=str(answer["Arn"]))

        return _read("sts:GetCallerIdentity", call)

    def stack(self, name: str) -> StackFacts:
        cloudformation = self._client("cloudformation")
        described = _read(
            "cloudformation:DescribeStacks",
            lambda: cloudformation.describe_stacks(StackName=name)["Stacks"][0],
        )
        # DescribeStacks gives parameter values; only the template says which are SSM paths.
        summary = _read(
            "cloudformation:GetTemplateSummary",
            lambda: cloudformation.get_template_summary(StackName=name),
        )
        return StackFacts(
            name=name,
            status=str(described["StackStatus"]),
            outputs={o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])},
            ssm_parameters={
                p["ParameterKey"]: p["DefaultValue"]
                for p in summary.get("Parameters", [])
                if str(p.get("ParameterType", "")).startswith(_SSM_PARAMETER_TYPE)
                and p.get("DefaultValue")
            },
        )

    def ssm_parameters(self, names: Sequence[str]) -> dict[str, str]:
        """The values of the parameters that exist (the others are left out)."""
        ssm = self._client("ssm")
        unique = sorted(set(names))

        def call() -> dict[str, str]:
            values: dict[str, str] = {}
            for start in range(0, len(unique), _SSM_BATCH):
                answer = ssm.get_parameters(Names=unique[start : start + _SSM_BATCH])
                values.update({p["Name"]: str(p["Value"]) for p in answer.get("Parameters", [])})
            return values

        return _read("ssm:GetParameters", call)

    def role_exists(self, name: str) -> bool:
        iam = self._client("iam")

        def call() -> bool:
            try:
                iam.get_role(RoleName=name)
            except iam.exceptions.NoSuchEntityException:
                return False
            return True

        return _read("iam:GetRole", call)

    def vcpu_quota(self, code: str) -> float:
        """The account's value of an EC2 quota; AWS's default where the account has none
        recorded (GetServiceQuota answers NoSuchResourceException then)."""
        quotas = self._client("service-quotas")

        def call() -> float:
            try:
                answer = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
            except quotas.exceptions.NoSuchResourceException:
                answer = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
            return float(answer["Quota"]["Value"])

        return _read("servicequotas:GetServiceQuota", call)

    def lambda_concurrency(self) -> int:
        """The account's concurrent executions in this region (all functions together)."""
        lambda_ = self._client("lambda")
        return _read(
            "lambda:GetAccountSettings",
            lambda: int(lambda_.get_account_settings()["AccountLimit"]["ConcurrentExecutions"]),
        )

    def network(self, subnet_ids: Sequence[str]) -> Network:
        """The subnets that exist among `subnet_ids`, with their VPCs' route tables and
        endpoints. A filter, not SubnetIds=: one unknown id must not hide the others."""
        subnets = [
            Subnet(
                subnet_id=s["SubnetId"],
                vpc_id=s["VpcId"],
                zone=s["AvailabilityZone"],
                zone_id=s.get("AvailabilityZoneId", ""),
                public_ip_on_launch=bool(s.get("MapPublicIpOnLaunch")),
                free_addresses=int(s.get("AvailableIpAddressCount", 0)),
            )
            for s in self._pages(
                "ec2:DescribeSubnets",
                "describe_subnets",
                "Subnets",
                Filters=[{"Name": "subnet-id", "Values": list(subnet_ids)}],
            )
        ]
        vpcs = sorted({s.vpc_id for s in subnets})
        if not vpcs:
            return Network((), (), ())
        by_vpc = [{"Name": "vpc-id", "Values": vpcs}]
        tables = [
            RouteTable(
                route_table_id=t["RouteTableId"],
                vpc_id=t["VpcId"],
                main=any(a.get("Main") for a in t.get("Associations", [])),
                subnet_ids=frozenset(
                    a["SubnetId"] for a in t.get("Associations", []) if a.get("SubnetId")
                ),
                routes=tuple(_route(r) for r in t.get("Routes", [])),
            )
            for t in self._pages(
                "ec2:DescribeRouteTables", "describe_route_tables", "RouteTables", Filters=by_vpc
            )
        ]
        endpoints = [
            VpcEndpoint(
                endpoint_id=e["VpcEndpointId"],
                vpc_id=e["VpcId"],
                service=str(e["ServiceName"]).rsplit(".", 1)[-1],
                kind=str(e.get("VpcEndpointType", "")),
                available=str(e.get("State", "")).lower() == "available",
                private_dns=bool(e.get("PrivateDnsEnabled")),
                route_table_ids=frozenset(e.get("RouteTableIds", [])),
            )
            for e in self._pages(
                "ec2:DescribeVpcEndpoints", "describe_vpc_endpoints", "VpcEndpoints", Filters=by_vpc
            )
        ]
        return Network(tuple(subnets), tuple(tables), tuple(endpoints))

    def _pages(self, action: str, operation: str, key: str, **parameters: Any) -> list[Any]:
        def call() -> list[Any]:
            paginator = self._client("ec2").get_paginator(operation)
            return [item for page in paginator.paginate(**parameters) for item in page[key]]

        return _read(action, call)

    def subscriptions(self, topic_arn: str) -> list[Subscription]:
        sns = self._client("sns")

        def call() -> list[Subscription]:
            paginator = sns.get_paginator("list_subscriptions_by_topic")
            return [
                Subscription(
                    protocol=str(s.get("Protocol", "")),
                    endpoint=str(s.get("Endpoint", "")),
                    subscription_arn=str(s.get("SubscriptionArn", "")),
                )
                for page in paginator.paginate(TopicArn=topic_arn)
                for s in page.get("Subscriptions", [])
            ]

        return _read("sns:ListSubscriptionsByTopic", call)

    def state_entered_at(self, state_machine_arn: str, job_id: str, state: str) -> float | None:
        """When the job's workflow last entered `state` (epoch seconds), if it did. The
        execution is named after the job (`adapters/aws/workflow.py`)."""
        sfn = self._client("stepfunctions")
        execution = state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"

        def call() -> float | None:
            entered = [
                event["timestamp"].timestamp()
                for page in sfn.get_paginator("get_execution_history").paginate(
                    executionArn=execution
                )
                for event in page["events"]
                if event.get("stateEnteredEventDetails", {}).get("name") == state
            ]
            return max(entered) if entered else None

        return _read("states:GetExecutionHistory", call)


def _route(route: dict[str, Any]) -> Route:
    destination = route.get("DestinationCidrBlock") or route.get("DestinationPrefixListId") or ""
    target_keys = (
        "GatewayId",
        "NatGatewayId",
        "TransitGatewayId",
        "VpcPeeringConnectionId",
        "NetworkInterfaceId",
        "InstanceId",
        "LocalGatewayId",
        "CarrierGatewayId",
        "CoreNetworkArn",
    )
    target = next((str(route[k]) for k in target_keys if route.get(k)), "")
    return Route(
        destination=str(destination), target=target, active=route.get("State") != "blackhole"
    )
