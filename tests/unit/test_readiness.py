"""`gpufleet doctor`'s decisions, over what it read: which quota an instance counts against,
what the config's largest jobs need, whether a subnet reaches the AWS APIs, who hears the
alarms, and the smoke job's timeline."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from gpufleet.cli.doctor import render_checks
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import FleetConfig, Reservation, WarmPool
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.queueing import QueuePolicy
from gpufleet.domain.readiness import (
    RELEASE_STATE,
    CheckStatus,
    Identity,
    Network,
    ProbeError,
    Route,
    RouteTable,
    StackFacts,
    Subnet,
    Subscription,
    VpcEndpoint,
    check_alerts,
    check_lambda_concurrency,
    check_ssm_parameters,
    check_stack,
    check_subnets,
    reaches_the_apis,
    smoke_timeline,
    vcpu_needs,
    vcpu_quota_of,
)
from gpufleet.domain.spec import Elastic, JobSpec, Resources
from gpufleet.services.doctor import Target, diagnose
from gpufleet.settings import Settings
from gpufleet.topology import JOB_LIFECYCLE, RELEASE, STACK_OUTPUTS

SPOT, ON_DEMAND = CapacityType.SPOT, CapacityType.ON_DEMAND


@pytest.mark.parametrize(
    ("instance_type", "capacity_type", "code"),
    [
        ("g5.xlarge", ON_DEMAND, "L-DB2E81BA"),
        ("gr6.4xlarge", SPOT, "L-3819A6DF"),
        ("vt1.3xlarge", SPOT, "L-3819A6DF"),
        ("p4d.24xlarge", SPOT, "L-7212CCBC"),
        ("p5en.48xlarge", SPOT, "L-C4BD4855"),
        ("p5en.48xlarge", ON_DEMAND, "L-417A185B"),
        ("p6-b200.48xlarge", SPOT, None),  # AWS's spot quota table names no quota for P6
        ("c5.large", SPOT, "L-34B43A08"),
        ("m7i.xlarge", ON_DEMAND, "L-1216C47A"),
        ("inf2.xlarge", ON_DEMAND, None),  # its own quota, not checked
        ("trn1.32xlarge", SPOT, None),
        ("dl1.24xlarge", ON_DEMAND, None),
        ("hpc7g.16xlarge", ON_DEMAND, None),
    ],
)
def test_an_instance_counts_against_its_familys_quota(
    instance_type: str, capacity_type: CapacityType, code: str | None
) -> None:
    quota = vcpu_quota_of(instance_type, capacity_type)
    assert (quota.code if quota else None) == code
    if quota is not None:
        assert quota.capacity_type is capacity_type


def test_the_largest_admitted_job_sets_the_need_and_one_the_queue_never_admits_does_not() -> None:
    catalog = load_bundled()
    eight_a100 = Resources(gpus=8, gpu_memory_gib=40, gpu_models=["A100"], vcpus=64)
    config = FleetConfig(
        queue=QueuePolicy(max_gpus=16, max_instances=8, reserve_share=0),
        templates={
            "two-nodes": eight_a100.model_copy(update={"nodes": 2}),
            # 8 x 8 GPUs: over max_gpus, never admitted, so it needs no quota.
            "too-big": eight_a100.model_copy(update={"nodes": 8}),
            "elastic": Resources(gpus=1, elastic=Elastic(min_nodes=1, max_nodes=3)),
        },
        warm_pool=WarmPool(instance_type="c5.9xlarge", count=2, capacity_type="on-demand"),
    )
    needs = vcpu_needs(config, catalog, "us-east-1")
    p4 = needs["L-7212CCBC"]  # spot P4: two 96-vCPU p4d nodes, not eight
    assert (p4.job, p4.instance_type, p4.nodes, p4.vcpus) == ("two-nodes", "p4d.24xlarge", 2, 192)
    g_spot = needs["L-3819A6DF"]  # the elastic job at its most nodes
    assert (g_spot.job, g_spot.nodes) == ("elastic", 3)
    assert g_spot.vcpus == 3 * catalog.instance_type(g_spot.instance_type).vcpus
    standard = needs["L-1216C47A"]
    assert (standard.job, standard.vcpus) == ("(the warm pool)", 2 * 36)


def _subnet(subnet_id: str = "subnet-a", public: bool = False, free: int = 250) -> Subnet:
    return Subnet(subnet_id, "vpc-1", "us-east-1a", "use1-az6", public, free)


def _table(*routes: Route, subnets: frozenset[str] = frozenset(), main: bool = True) -> RouteTable:
    return RouteTable("rtb-main" if main else "rtb-own", "vpc-1", main, subnets, routes)


LOCAL = Route("10.0.0.0/16", "local", True)
ENDPOINTS = (
    VpcEndpoint("vpce-s3", "vpc-1", "s3", "Gateway", True, False, frozenset({"rtb-main"})),
    *(
        VpcEndpoint(f"vpce-{name}", "vpc-1", name, "Interface", True, True)
        for name in ("events", "monitoring", "logs")
    ),
)


def test_a_subnet_reaches_the_apis_through_a_nat_an_igw_with_public_ips_or_endpoints() -> None:
    nat = Network((_subnet(),), (_table(LOCAL, Route("0.0.0.0/0", "nat-1", True)),), ())
    assert reaches_the_apis(_subnet(), nat).ok
    igw = Network((), (_table(LOCAL, Route("0.0.0.0/0", "igw-1", True)),), ())
    assert reaches_the_apis(_subnet(public=True), igw).ok
    no_public_ip = reaches_the_apis(_subnet(public=False), igw)
    assert not no_public_ip.ok and "no public IP" in no_public_ip.how
    private = Network((), (_table(LOCAL),), ENDPOINTS)
    assert reaches_the_apis(_subnet(), private).ok
    # The S3 gateway endpoint serves only the route tables it is attached to.
    own_table = _table(LOCAL, subnets=frozenset({"subnet-a"}), main=False)
    elsewhere = Network((), (_table(LOCAL), own_table), ENDPOINTS)
    reach = reaches_the_apis(_subnet(), elsewhere)
    assert not reach.ok and reach.how.endswith("no VPC endpoint for s3")
    # A NAT gateway that was deleted leaves a blackhole, which leads nowhere.
    dead = Network((), (_table(LOCAL, Route("0.0.0.0/0", "nat-gone", False)),), ENDPOINTS[:1])
    reach = reaches_the_apis(_subnet(), dead)
    assert not reach.ok and "blackhole" in reach.how and "events, monitoring, logs" in reach.how


def test_subnets_that_are_missing_full_or_miss_a_reservations_zone_fail_with_a_fix() -> None:
    network = Network((_subnet(free=0),), (_table(LOCAL, Route("0.0.0.0/0", "nat-1", True)),), ())
    reservation = Reservation(
        id="cr-0123456789abcdef0", kind="odcr", instance_type="p4d.24xlarge", zone="us-east-1b",
        count=1,
    )  # fmt: skip
    check = check_subnets(
        ["subnet-a", "subnet-gone"], network, "us-east-1", FleetConfig(reservations=[reservation])
    )
    assert check.status is CheckStatus.FAIL
    assert "subnet-gone does not exist in us-east-1" in check.detail
    assert "subnet-a has no free IP addresses" in check.detail
    assert "cr-0123456789abcdef0 is in us-east-1b: no subnet" in check.detail
    assert "add a subnet in us-east-1b" in check.fix


def test_only_a_confirmed_subscription_hears_the_alarms() -> None:
    topic = "arn:aws:sns:us-east-1:123456789012:alerts"
    pending = Subscription("email", "ops@example.com", "PendingConfirmation")
    check = check_alerts(topic, [pending])
    assert check.status is CheckStatus.FAIL and "1 waiting for confirmation" in check.detail
    assert f"--topic-arn {topic}" in check.fix
    confirmed = Subscription("email", "ops@example.com", f"{topic}:5f7c")
    assert check_alerts(topic, [pending, confirmed]).status is CheckStatus.OK


def test_a_stack_that_rolled_back_or_lacks_outputs_fails() -> None:
    outputs = dict.fromkeys(STACK_OUTPUTS, "x")
    rolled_back = check_stack(StackFacts("GpuFleetStack", "ROLLBACK_COMPLETE", outputs), outputs)
    assert rolled_back.status is CheckStatus.FAIL and "cdk destroy GpuFleetStack" in rolled_back.fix
    older = {k: v for k, v in outputs.items() if k != "SubnetIds"}
    lacking = check_stack(StackFacts("GpuFleetStack", "UPDATE_COMPLETE", older), outputs)
    assert lacking.status is CheckStatus.FAIL and "SubnetIds" in lacking.detail
    ok = check_stack(StackFacts("GpuFleetStack", "UPDATE_ROLLBACK_COMPLETE", outputs), outputs)
    assert ok.status is CheckStatus.OK


def test_the_smoke_timeline_times_each_step_from_the_one_seen_before() -> None:
    spec = JobSpec(name="smoke", team="doctor", image="busybox", command=["true"])
    placement = Placement(
        instance_ids=["i-1"], instance_type="m5.large", capacity_type="spot", hourly_usd=0.03,
        launched_at=1012.0,
    )  # fmt: skip
    job = Job(
        job_id="j-1", status=JobStatus.SUCCEEDED, spec=spec, source="s3://b/k", created_at=1001.0,
        updated_at=1100.0, first_admitted_at=1010.0, placement=placement, released_at=1090.0,
    )  # fmt: skip
    # The running step was missed between two polls.
    steps = smoke_timeline(1000.0, job, running_at=None, release_started_at=1080.0)
    assert [(s.name, s.at_seconds, s.latency_seconds) for s in steps] == [
        ("accepted", 1.0, 1.0),
        ("admitted", 10.0, 9.0),
        ("launched", 12.0, 2.0),
        ("running", None, None),
        ("finished", 80.0, 68.0),
        ("released", 90.0, 10.0),
    ]


def test_the_release_state_the_smoke_job_times_is_the_lifecycles_release_step() -> None:
    states = json.loads(JOB_LIFECYCLE.definition())["States"]
    function = states[RELEASE_STATE]["Parameters"]["FunctionName"]
    assert JOB_LIFECYCLE.function_substitutions[function[2:-1]] == RELEASE.construct_id


class _Probe:
    """An account whose reads give what the test says; a read named in `denied` is refused."""

    def __init__(self, *denied: str) -> None:
        self.denied = set(denied)

    def _allowed(self, action: str) -> None:
        if action in self.denied:
            raise ProbeError(action, "AccessDenied: not authorized")

    def identity(self) -> Identity:
        self._allowed("sts:GetCallerIdentity")
        return Identity("123456789012", "arn:aws:iam::123456789012:user/ops")

    def stack(self, name: str) -> StackFacts:
        return StackFacts(name, "CREATE_COMPLETE", dict.fromkeys(STACK_OUTPUTS, "x"))

    def ssm_parameters(self, names: Sequence[str]) -> dict[str, str]:
        return {}

    def role_exists(self, name: str) -> bool:
        return True

    def vcpu_quota(self, code: str) -> float:
        self._allowed("servicequotas:GetServiceQuota")
        return 1000.0

    def lambda_concurrency(self) -> int:
        self._allowed("lambda:GetAccountSettings")
        return 1000

    def network(self, subnet_ids: Sequence[str]) -> Network:
        nat = _table(LOCAL, Route("0.0.0.0/0", "nat-1", True))
        return Network((_subnet(),), (nat,), ())

    def subscriptions(self, topic_arn: str) -> list[Subscription]:
        return [Subscription("sqs", "arn:aws:sqs:us-east-1:123456789012:q", f"{topic_arn}:1")]


SETTINGS = Settings(
    region="us-east-1", jobs_table="j", idempotency_table="i", capacity_table="c",
    queue_table="q", event_bus_name="b", intake_bucket="k", subnet_ids=["subnet-a"],
    notify_topic_arn="arn:aws:sns:us-east-1:123456789012:alerts",
)  # fmt: skip


def test_a_refused_read_fails_its_checks_naming_the_action_and_the_others_still_run() -> None:
    target = Target("us-east-1", "GpuFleetStack", SETTINGS)
    checks = {
        c.name: c for c in diagnose(_Probe("servicequotas:GetServiceQuota"), target, load_bundled())
    }
    quotas = [c for name, c in checks.items() if name.startswith("quota ")]
    assert len(quotas) == 7
    assert all(c.status is CheckStatus.FAIL for c in quotas)
    assert "servicequotas:GetServiceQuota" in quotas[0].detail
    assert "allowed servicequotas:GetServiceQuota" in quotas[0].fix
    others = [c for name, c in checks.items() if not name.startswith("quota ")]
    assert {c.status for c in others} == {CheckStatus.OK}


def test_without_credentials_every_other_check_is_skipped_and_the_table_says_how_to_fix() -> None:
    target = Target("us-east-1", "GpuFleetStack", SETTINGS)
    checks = diagnose(_Probe("sts:GetCallerIdentity"), target, load_bundled())
    assert [c.status for c in checks] == [CheckStatus.FAIL] + [CheckStatus.SKIP] * (len(checks) - 1)
    table = render_checks(checks).splitlines()
    assert table[0].startswith("FAIL  credentials ")
    assert table[1].split()[0] == "fix:" and "configure AWS credentials" in table[1]
    assert table[2].startswith("SKIP  stack outputs ")
    assert table[-1] == "1 check(s) failed"


def test_a_new_accounts_lambda_concurrency_fails_with_the_quota_to_raise() -> None:
    check = check_lambda_concurrency(10, "eu-west-3")
    assert check.status is CheckStatus.FAIL and check.detail.startswith("10 concurrent executions")
    assert check.fix == (
        "aws service-quotas request-service-quota-increase --service-code lambda "
        "--quota-code L-B99A9384 --desired-value 1000 --region eu-west-3"
    )
    assert check_lambda_concurrency(100, "eu-west-3").status is CheckStatus.OK


def test_a_missing_ssm_parameter_fails_with_the_fix_for_its_kind() -> None:
    ami = "/aws/service/deeplearning/ami/x86_64/gone/latest/ami-id"
    bootstrap = "/cdk-bootstrap/hnb659fds/version"
    wanted = {"Ami": ami, "BootstrapVersion": bootstrap}
    check = check_ssm_parameters(wanted, {bootstrap: "28"}, "eu-west-3")
    assert check.status is CheckStatus.FAIL and check.detail == f"{ami} does not exist in eu-west-3"
    assert "-c ami_<target>=" in check.fix and "cdk bootstrap" not in check.fix
    check = check_ssm_parameters(wanted, {ami: "ami-1"}, "eu-west-3")
    assert check.fix == "bootstrap CDK here: cdk bootstrap aws://ACCOUNT/eu-west-3"
    assert check_ssm_parameters(wanted, {ami: "ami-1", bootstrap: "28"}, "eu-west-3").status is (
        CheckStatus.OK
    )
