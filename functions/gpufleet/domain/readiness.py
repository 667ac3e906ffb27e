"""Whether an account and region are ready for gpufleet's first job: what `gpufleet doctor`
decides from what it read.

Pure: each function takes what was read (the stack, SSM parameters, quotas, subnets and their
route tables, the alerts topic's subscriptions) and returns a `Check`: its verdict, what was
found, and how to fix it when it failed. Reading is the account probe's job
(`adapters/aws/account_probe.py`); running the checks in order, the doctor service's
(`services/doctor.py`).

AWS facts these checks rest on (docs/deploy.md, "Before the first job", says more):

- EC2 limits running instances per family in vCPUs, through Service Quotas, separately for
  on-demand and spot; the GPU families start at 0 in new accounts, Standard at 5.
- Spot instances need the service-linked role `AWSServiceRoleForEC2Spot`; without it, and
  without the right to create it, a spot launch fails with
  `AuthFailure.ServiceLinkedRoleCreationNotPermitted`. An instant fleet needs no
  `AWSServiceRoleForEC2Fleet`.
- A node reaches the AWS APIs through a 0.0.0.0/0 route to a NAT gateway, or to an internet
  gateway when it has a public IPv4 address, or else through VPC endpoints for what the node
  agent calls: S3 (its run manifest and code; a gateway endpoint), EventBridge (its reports),
  CloudWatch (metrics) and CloudWatch Logs (the container's output, Docker's awslogs driver).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.domain.catalog import Catalog
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.duration import DEFAULT_SECONDS, DurationEstimate
from gpufleet.domain.job import Job
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.planning import plan_launch
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.spec import JobSpec, Resources
from gpufleet.errors import GpufleetError


class CheckStatus(StrEnum):
    OK = "ok"
    FAIL = "fail"
    SKIP = "skip"  # not checked: something it needs failed first


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str = ""  # what to do, when it failed

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def passed(name: str, detail: str) -> Check:
    return Check(name, CheckStatus.OK, detail)


def failed(name: str, detail: str, fix: str) -> Check:
    return Check(name, CheckStatus.FAIL, detail, fix)


def skipped(name: str, why: str) -> Check:
    return Check(name, CheckStatus.SKIP, why)


def all_passed(checks: Iterable[Check]) -> bool:
    """Whether nothing failed (a skipped check follows from one that did)."""
    return all(check.status is not CheckStatus.FAIL for check in checks)


class ProbeError(GpufleetError):
    """A read of the account failed: `action` is the IAM action it needed, `reason` what AWS
    (or the SDK) said."""

    def __init__(self, action: str, reason: str) -> None:
        super().__init__(f"{action}: {reason}")
        self.action = action
        self.reason = reason

    def as_check(self, name: str, fix: str = "") -> Check:
        return failed(
            name,
            f"cannot read ({self.action}): {self.reason}",
            fix or f"run as a principal allowed {self.action} in this account and region",
        )


# -- credentials and region ----------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    account: str
    arn: str


CREDENTIALS = "credentials"
# GetCallerIdentity needs no permission: when it fails, the credentials are missing or bad.
CREDENTIALS_FIX = "configure AWS credentials (aws configure, aws sso login, AWS_PROFILE)"


def no_region(detail: str = "no region") -> Check:
    return failed(CREDENTIALS, detail, "give --region, or export AWS_REGION")


def check_credentials(identity: Identity, region: str | None) -> Check:
    if not region:
        return no_region(f"account {identity.account} as {identity.arn}, but no region")
    return passed(CREDENTIALS, f"account {identity.account} as {identity.arn} in {region}")


# -- the stack -------------------------------------------------------------------------------

STACK = "stack outputs"
# A stack in one of these states holds a complete deployment (after a failed update it rolls
# back to the previous one, which still works).
USABLE_STACK_STATUSES = frozenset(
    {
        "CREATE_COMPLETE",
        "UPDATE_COMPLETE",
        "UPDATE_ROLLBACK_COMPLETE",
        "IMPORT_COMPLETE",
        "IMPORT_ROLLBACK_COMPLETE",
    }
)


@dataclass(frozen=True)
class StackFacts:
    name: str
    status: str
    outputs: Mapping[str, str]
    # Parameters of type AWS::SSM::Parameter::Value<...> -> the SSM parameter each one reads.
    ssm_parameters: Mapping[str, str] = field(default_factory=dict)


def check_stack(stack: StackFacts, required_outputs: Iterable[str]) -> Check:
    """The stack is deployed and has every output the CLI reads (`topology.STACK_OUTPUTS`)."""
    if stack.status not in USABLE_STACK_STATUSES:
        fix = "wait for the stack operation to finish"
        if stack.status in ("ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED"):
            fix = f"read the stack's events, delete it (cdk destroy {stack.name}), deploy again"
        return failed(STACK, f"stack {stack.name} is {stack.status}", fix)
    missing = sorted(set(required_outputs) - set(stack.outputs))
    if missing:
        return failed(
            STACK,
            f"stack {stack.name} ({stack.status}) lacks the outputs {', '.join(missing)}",
            f"deploy this version of gpufleet: cdk deploy {stack.name}",
        )
    return passed(STACK, f"stack {stack.name} is {stack.status}, {len(stack.outputs)} outputs")


def check_environment_target(error: str | None) -> Check:
    """Without --stack, the deployment variables come from the environment."""
    if error:
        return failed(
            STACK, error, "give --stack NAME (and --region), or export the stack's outputs"
        )
    return passed(STACK, "deployment variables from the environment (no --stack)")


# -- SSM parameters the stack resolves --------------------------------------------------------

SSM_PARAMETERS = "ssm parameters"


# CDK's bootstrap stack keeps its version here; every CDK template checks it at deploy time.
CDK_BOOTSTRAP_PREFIX = "/cdk-bootstrap/"


def check_ssm_parameters(
    wanted: Mapping[str, str], resolved: Mapping[str, str], region: str
) -> Check:
    """Every SSM parameter the stack resolves at deploy time (the AMI's public parameter, CDK's
    bootstrap version) exists in the region: else the next `cdk deploy` fails on it."""
    if not wanted:
        return passed(SSM_PARAMETERS, "the stack reads no SSM parameters")
    missing = sorted(name for name in set(wanted.values()) if name not in resolved)
    if missing:
        fixes = []
        if any(name.startswith(CDK_BOOTSTRAP_PREFIX) for name in missing):
            fixes.append(f"bootstrap CDK here: cdk bootstrap aws://ACCOUNT/{region}")
        if any(not name.startswith(CDK_BOOTSTRAP_PREFIX) for name in missing):
            fixes.append(
                "deploy with image parameters that exist there (-c ami_<target>=... or =none; "
                "list them: aws ssm get-parameters-by-path --path /aws/service/deeplearning/ami/"
                " --recursive --query 'Parameters[].Name')"
            )
        return failed(
            SSM_PARAMETERS, f"{', '.join(missing)} does not exist in {region}", "; ".join(fixes)
        )
    return passed(
        SSM_PARAMETERS,
        "; ".join(f"{name} = {resolved[name]}" for name in sorted(set(wanted.values()))),
    )


# -- the spot service-linked role --------------------------------------------------------------

SPOT_ROLE = "spot service-linked role"
SPOT_ROLE_NAME = "AWSServiceRoleForEC2Spot"


def check_spot_role(exists: bool) -> Check:
    if exists:
        return passed(SPOT_ROLE, f"{SPOT_ROLE_NAME} exists")
    return failed(
        SPOT_ROLE,
        f"{SPOT_ROLE_NAME} is missing: the first spot launch creates it only where the Launch "
        "role may (an SCP or permissions boundary that denies iam:CreateServiceLinkedRole fails "
        "every spot launch with AuthFailure.ServiceLinkedRoleCreationNotPermitted)",
        "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com",
    )


# -- Lambda concurrency ----------------------------------------------------------------------

LAMBDA_CONCURRENCY = "lambda concurrency"
# Lambda's "Concurrent executions" quota (Service Quotas), shared by every function of the
# account and region. New accounts start with a reduced one (as low as 10, "Lambda quotas"):
# a burst of jobs then throttles the control plane's functions, and their events end in the
# dead-letter queues. Below this, the check fails.
MIN_LAMBDA_CONCURRENCY = 100
LAMBDA_CONCURRENCY_QUOTA = "L-B99A9384"
_LAMBDA_CONCURRENCY_WANTED = 1000  # AWS's default for an established account


def check_lambda_concurrency(limit: int, region: str) -> Check:
    if limit >= MIN_LAMBDA_CONCURRENCY:
        return passed(LAMBDA_CONCURRENCY, f"{limit} concurrent executions")
    return failed(
        LAMBDA_CONCURRENCY,
        f"{limit} concurrent executions for every function of the account and region (new "
        f"accounts start reduced; gpufleet wants at least {MIN_LAMBDA_CONCURRENCY}): a burst of "
        "jobs throttles the control plane and its events can end in the dead-letter queues",
        "aws service-quotas request-service-quota-increase --service-code lambda "
        f"--quota-code {LAMBDA_CONCURRENCY_QUOTA} --desired-value {_LAMBDA_CONCURRENCY_WANTED} "
        f"--region {region}",
    )


# -- EC2 vCPU quotas -----------------------------------------------------------------------


@dataclass(frozen=True)
class VcpuQuota:
    """One Service Quotas quota on running vCPUs (service code `ec2`)."""

    code: str
    name: str
    capacity_type: CapacityType


VCPU_QUOTAS: tuple[VcpuQuota, ...] = (
    VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances", CapacityType.ON_DEMAND),
    VcpuQuota("L-3819A6DF", "All G and VT Spot Instance Requests", CapacityType.SPOT),
    VcpuQuota("L-417A185B", "Running On-Demand P instances", CapacityType.ON_DEMAND),
    # Called "All P Spot Instance Requests" until P5 got its own spot quota.
    VcpuQuota("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests", CapacityType.SPOT),
    VcpuQuota("L-C4BD4855", "All P5 Spot Instance Requests", CapacityType.SPOT),
    VcpuQuota(
        "L-1216C47A",
        "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
        CapacityType.ON_DEMAND,
    ),
    VcpuQuota(
        "L-34B43A08",
        "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
        CapacityType.SPOT,
    ),
)
_QUOTA_BY_CODE = {quota.code: quota for quota in VCPU_QUOTAS}
_FAMILY = re.compile(r"^([a-z]+)(\d*)")
# Families whose first letter is a Standard one but which have quotas of their own.
_NOT_STANDARD = frozenset({"dl", "hpc", "inf", "mac", "trn"})


def vcpu_quota_of(instance_type: str, capacity_type: CapacityType) -> VcpuQuota | None:
    """The vCPU quota an instance of this type counts against; None for families whose quota
    gpufleet does not check (Inf, Trn, DL, F, X, and spot P6, which AWS's table of spot quotas
    does not name)."""
    match = _FAMILY.match(instance_type)
    if match is None:
        return None
    letters, generation = match.group(1), int(match.group(2) or 0)
    spot = capacity_type is CapacityType.SPOT
    if letters in ("g", "gr", "vt"):
        code = "L-3819A6DF" if spot else "L-DB2E81BA"
    elif letters == "p":
        if not spot:
            code = "L-417A185B"
        elif generation <= 4:
            code = "L-7212CCBC"
        elif generation == 5:
            code = "L-C4BD4855"
        else:
            return None
    elif letters[0] in "acdhimrtz" and letters not in _NOT_STANDARD:
        code = "L-34B43A08" if spot else "L-1216C47A"
    else:
        return None
    return _QUOTA_BY_CODE[code]


@dataclass(frozen=True)
class VcpuNeed:
    """The most vCPUs of one quota a single job (or the warm pool) of the config holds."""

    quota: VcpuQuota
    vcpus: int
    job: str  # the template (or the warm pool) that needs them
    instance_type: str
    nodes: int


# A job spec without `resources` asks for one GPU: the smallest first job.
DEFAULT_JOB = "(a spec's default resources)"
WARM_POOL = "(the warm pool)"


def _nodes_at_most(resources: Resources) -> int:
    return resources.elastic.max_nodes if resources.elastic else resources.nodes


def _admitted(resources: Resources, config: FleetConfig) -> bool:
    """Whether the queue's caps let a job of this shape in at all."""
    nodes = _nodes_at_most(resources)
    queue = config.queue
    return resources.gpus * nodes <= queue.max_gpus and nodes <= queue.max_instances


def vcpu_needs(config: FleetConfig, catalog: Catalog, region: str) -> dict[str, VcpuNeed]:
    """Per quota code, the largest need of the jobs the config allows: each template (and a
    default one-GPU job) the queue's caps admit, on the largest instance its launch plan could
    hand CreateFleet (spot and on-demand steps), and the warm pool. A template nothing in the
    region fits needs nothing (`gpufleet templates` says why)."""
    shapes: dict[str, Resources] = {DEFAULT_JOB: Resources(), **config.templates}
    needs: dict[str, VcpuNeed] = {}

    def consider(job: str, instance_type: str, capacity_type: CapacityType, nodes: int) -> None:
        quota = vcpu_quota_of(instance_type, capacity_type)
        if quota is None:
            return
        vcpus = catalog.instance_type(instance_type).vcpus * nodes
        if quota.code not in needs or vcpus > needs[quota.code].vcpus:
            needs[quota.code] = VcpuNeed(quota, vcpus, job, instance_type, nodes)

    for job, resources in shapes.items():
        if not _admitted(resources, config):
            continue
        nodes = _nodes_at_most(resources)
        try:
            plan = plan_launch(
                _planning_spec(job, resources),
                catalog,
                region,
                max_launch_attempts=1,
                retry_wait_seconds=1,
                boot_allowance_seconds=1,
                heartbeat_timeout_seconds=1,
                expected=DurationEstimate(DEFAULT_SECONDS, "default"),
            )
        except NoFeasibleOffering:
            continue
        for step in plan.steps:
            for override in step.overrides:
                consider(job, override.instance_type, step.capacity_type, nodes)
    pool = config.warm_pool
    if pool is not None:
        consider(WARM_POOL, pool.instance_type, CapacityType(pool.capacity_type), pool.count)
    return needs


def _planning_spec(job: str, resources: Resources) -> JobSpec:
    """A spec of these resources, only for its launch plan (spot `auto`: both steps)."""
    name = re.sub(r"[^a-z0-9._-]", "-", job.lower()).strip("-.") or "job"
    return JobSpec(
        name=name[:63], team="doctor", image="doctor", command=["true"], resources=resources
    )


def quota_check_name(quota: VcpuQuota) -> str:
    return f"quota {quota.code}"


def check_vcpu_quota(quota: VcpuQuota, value: float, need: VcpuNeed | None) -> Check:
    name = quota_check_name(quota)
    if need is None:
        return passed(name, f"{quota.name}: {value:g} vCPUs; no job of the config uses it")
    wants = f"{need.job} needs {need.vcpus} ({need.nodes} x {need.instance_type})"
    if value < need.vcpus:
        return failed(
            name,
            f"{quota.name}: {value:g} vCPUs; {wants}",
            f"aws service-quotas request-service-quota-increase --service-code ec2 "
            f"--quota-code {quota.code} --desired-value {need.vcpus}",
        )
    return passed(name, f"{quota.name}: {value:g} vCPUs; {wants}")


# -- subnets and their way to the AWS APIs -----------------------------------------------------

SUBNETS = "subnets"
# What the node agent calls (agent/aws.py and Docker's awslogs driver), as VPC endpoint services.
AGENT_ENDPOINT_SERVICES = ("s3", "events", "monitoring", "logs")
DEFAULT_ROUTE = "0.0.0.0/0"


@dataclass(frozen=True)
class Subnet:
    subnet_id: str
    vpc_id: str
    zone: str
    zone_id: str
    public_ip_on_launch: bool
    free_addresses: int


@dataclass(frozen=True)
class Route:
    destination: str  # a CIDR block or a prefix list id
    target: str  # igw-..., nat-..., vpce-..., tgw-..., local
    active: bool  # False: a blackhole (its target was deleted)


@dataclass(frozen=True)
class RouteTable:
    route_table_id: str
    vpc_id: str
    main: bool
    subnet_ids: frozenset[str]
    routes: tuple[Route, ...]


@dataclass(frozen=True)
class VpcEndpoint:
    endpoint_id: str
    vpc_id: str
    service: str  # the service's short name: "s3" for com.amazonaws.us-east-1.s3
    kind: str  # Gateway or Interface
    available: bool
    private_dns: bool
    route_table_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Network:
    subnets: tuple[Subnet, ...]
    route_tables: tuple[RouteTable, ...]
    endpoints: tuple[VpcEndpoint, ...]


def route_table_of(subnet: Subnet, tables: Sequence[RouteTable]) -> RouteTable | None:
    """The table a subnet uses: the one it is associated with, else its VPC's main table."""
    for table in tables:
        if subnet.subnet_id in table.subnet_ids:
            return table
    return next((t for t in tables if t.vpc_id == subnet.vpc_id and t.main), None)


@dataclass(frozen=True)
class Reach:
    ok: bool
    how: str


def reaches_the_apis(subnet: Subnet, network: Network) -> Reach:
    """Whether a node in `subnet` reaches the APIs the node agent calls, and how."""
    table = route_table_of(subnet, network.route_tables)
    if table is None:
        return Reach(False, "no route table")
    default = [r for r in table.routes if r.destination == DEFAULT_ROUTE]
    live = [r for r in default if r.active]
    if live:
        target = live[0].target
        if target.startswith("igw-") and not subnet.public_ip_on_launch:
            return Reach(
                False, f"{DEFAULT_ROUTE} goes to {target}, but the subnet gives nodes no public IP"
            )
        if target.startswith(("igw-", "nat-")):
            return Reach(True, f"{DEFAULT_ROUTE} -> {target}")
        # A transit gateway, peering or appliance may well lead out; what lies beyond it is
        # not visible from here.
        return Reach(True, f"{DEFAULT_ROUTE} -> {target} (not followed further)")
    missing = [s for s in AGENT_ENDPOINT_SERVICES if not _endpoint_serves(s, table, network)]
    if not missing:
        return Reach(True, "VPC endpoints for " + ", ".join(AGENT_ENDPOINT_SERVICES))
    dead = f" ({DEFAULT_ROUTE} -> {default[0].target} is a blackhole)" if default else ""
    return Reach(
        False,
        f"no {DEFAULT_ROUTE} route to a NAT or internet gateway{dead}, and no VPC endpoint for "
        + ", ".join(missing),
    )


def _endpoint_serves(service: str, table: RouteTable, network: Network) -> bool:
    for endpoint in network.endpoints:
        if endpoint.service != service or endpoint.vpc_id != table.vpc_id:
            continue
        if not endpoint.available:
            continue
        if endpoint.kind == "Gateway" and table.route_table_id in endpoint.route_table_ids:
            return True
        if endpoint.kind == "Interface" and endpoint.private_dns:
            return True
    return False


def check_subnets(
    subnet_ids: Sequence[str], network: Network, region: str, config: FleetConfig
) -> Check:
    """The stack's subnets exist in the region, reach the AWS APIs, have free addresses, and
    cover the zones of the config's reservations."""
    if not subnet_ids:
        return failed(
            SUBNETS,
            "the stack names no subnets (its SubnetIds output)",
            "deploy with -c subnet_ids=subnet-...,subnet-...",
        )
    found = {subnet.subnet_id: subnet for subnet in network.subnets}
    problems: list[str] = []
    fixes: list[str] = []
    zones_by_way: dict[str, list[str]] = {}  # how they reach the APIs -> the subnets' zones
    for subnet_id in subnet_ids:
        subnet = found.get(subnet_id)
        if subnet is None:
            problems.append(f"{subnet_id} does not exist in {region}")
            fixes.append("deploy with -c subnet_ids naming subnets of this region")
            continue
        reach = reaches_the_apis(subnet, network)
        zones_by_way.setdefault(reach.how, []).append(subnet.zone)
        if not reach.ok:
            problems.append(f"{subnet_id} ({subnet.zone}): {reach.how}")
            fixes.append(
                f"give {subnet_id}'s route table a {DEFAULT_ROUTE} route to a NAT gateway (or an "
                "internet gateway, with public IPs on launch), or create VPC endpoints for "
                + ", ".join(AGENT_ENDPOINT_SERVICES)
            )
        if subnet.free_addresses == 0:
            problems.append(f"{subnet_id} has no free IP addresses")
            fixes.append(f"free addresses in {subnet_id}, or deploy with another subnet")
    zones = {s.zone for s in found.values()} | {s.zone_id for s in found.values()}
    for reservation in config.reservations:
        if reservation.zone not in zones:
            problems.append(f"reservation {reservation.id} is in {reservation.zone}: no subnet")
            fixes.append(f"add a subnet in {reservation.zone} to -c subnet_ids")
    if problems:
        return failed(SUBNETS, "; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    return passed(
        SUBNETS,
        "; ".join(
            f"{len(zones)} in {', '.join(sorted(zones))}: {how}"
            for how, zones in zones_by_way.items()
        ),
    )


# -- the alerts topic ------------------------------------------------------------------------

ALERTS = "alerts subscriber"
# What ListSubscriptionsByTopic shows instead of an ARN for a subscription not confirmed yet.
_UNCONFIRMED = frozenset({"PendingConfirmation", "Deleted"})


@dataclass(frozen=True)
class Subscription:
    protocol: str
    endpoint: str
    subscription_arn: str

    @property
    def confirmed(self) -> bool:
        return self.subscription_arn not in _UNCONFIRMED


def check_alerts(topic_arn: str, subscriptions: Sequence[Subscription]) -> Check:
    if not topic_arn:
        return failed(ALERTS, "the stack names no alerts topic", "deploy this version of gpufleet")
    confirmed = [s for s in subscriptions if s.confirmed]
    pending = len(subscriptions) - len(confirmed)
    waiting = f"; {pending} waiting for confirmation" if pending else ""
    if not confirmed:
        return failed(
            ALERTS,
            f"nobody receives the alarms of {topic_arn}{waiting}",
            f"aws sns subscribe --topic-arn {topic_arn} --protocol email "
            "--notification-endpoint you@example.com, then confirm from the e-mail",
        )
    who = ", ".join(f"{s.protocol} {s.endpoint}" for s in confirmed)
    return passed(ALERTS, f"{who}{waiting}")


# -- the smoke job's steps ---------------------------------------------------------------------

SMOKE_STEPS = ("accepted", "admitted", "launched", "running", "finished", "released")
# The lifecycle's step that releases a job's instances (statemachines/job_lifecycle.asl.json):
# the workflow enters it when the node's finish report ends the launch step's wait.
RELEASE_STATE = "Release"


@dataclass(frozen=True)
class SmokeStep:
    name: str
    at_seconds: float | None  # since the upload; None: not seen
    latency_seconds: float | None  # since the step before it that was seen


def smoke_timeline(
    uploaded_at: float, job: Job, running_at: float | None, release_started_at: float | None
) -> list[SmokeStep]:
    """Each step of a job's first run, on the control plane's clocks: intake recorded it, the
    queue admitted it, its instances were launched, the node reported it running, the
    workflow moved to release it (the node's finish ended the wait), its instances were
    released. `running_at` is when the job was recorded RUNNING and `release_started_at` when
    the workflow entered its release step, where they were seen."""
    moments = {
        "accepted": job.created_at,
        "admitted": job.first_admitted_at,
        "launched": job.placement.launched_at if job.placement else None,
        "running": running_at,
        "finished": release_started_at,
        "released": job.released_at,
    }
    steps = []
    previous = uploaded_at
    for name in SMOKE_STEPS:
        moment = moments[name]
        if moment is None:
            steps.append(SmokeStep(name, None, None))
            continue
        steps.append(SmokeStep(name, moment - uploaded_at, max(0.0, moment - previous)))
        previous = moment
    return steps
