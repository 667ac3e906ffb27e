"""`gpufleet doctor` against the emulator, as a user runs it after `cdk deploy`.

The embedded account holds what a real one would before the first job (the public AMI
parameter, the spot service-linked role, EC2 vCPU quotas, a default VPC with a way out, a
subscribed alerts topic): every check passes; breaking one thing fails that check and only it.
One emulator serves the module; each test that breaks something puts it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import redirect_stdout
from io import StringIO
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.cli.doctor import SMOKE_SPEC
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.readiness import DEFAULT_ROUTE, SMOKE_STEPS, SUBNETS, VCPU_QUOTAS
from gpufleet.domain.selection import select
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator.account_baseline import (
    EC2_VCPU_QUOTAS,
    LAMBDA_CONCURRENCY,
    set_lambda_concurrency,
    set_vcpu_quota,
)
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.emulator.server import STACK_NAME, RunningEmulator, serve


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    # Nodes that boot and run at once: the smoke job's steps, not its length, are the point.
    nodes = NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=1.5))
    with serve(port=0, nodes=nodes) as running:
        yield running


def doctor(*argv: str) -> tuple[int, dict[str, Any]]:
    buffer = StringIO()
    with redirect_stdout(buffer):
        code = main(["doctor", "--stack", STACK_NAME, "--json", *argv])
    return code, json.loads(buffer.getvalue())


def results(report: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}


@pytest.fixture(scope="module")
def healthy(emulator: RunningEmulator) -> tuple[int, dict[str, Any]]:
    """`gpufleet doctor --smoke` on the account as set up: the checks, then the smoke job."""
    return doctor("--smoke", "--smoke-timeout", "120")


def test_every_check_passes_on_the_account_as_set_up(
    healthy: tuple[int, dict[str, Any]],
) -> None:
    code, report = healthy
    assert code == 0 and report["ok"] is True
    assert results(report) == {
        "credentials": "ok",
        "stack outputs": "ok",
        "ssm parameters": "ok",
        "spot service-linked role": "ok",
        "lambda concurrency": "ok",
        **{f"quota {quota.code}": "ok" for quota in VCPU_QUOTAS},
        "subnets": "ok",
        "alerts subscriber": "ok",
    }


def test_subnets_without_a_route_out_fail_the_subnet_check_and_only_it(
    emulator: RunningEmulator,
) -> None:
    ec2 = emulator.account.client("ec2")
    with acting_as(EMULATOR):
        [table] = ec2.describe_route_tables(
            Filters=[{"Name": "association.main", "Values": ["true"]}]
        )["RouteTables"]
        [route] = [r for r in table["Routes"] if r.get("DestinationCidrBlock") == DEFAULT_ROUTE]
        ec2.delete_route(RouteTableId=table["RouteTableId"], DestinationCidrBlock=DEFAULT_ROUTE)
    try:
        code, report = doctor()
    finally:
        with acting_as(EMULATOR):
            ec2.create_route(
                RouteTableId=table["RouteTableId"],
                DestinationCidrBlock=DEFAULT_ROUTE,
                GatewayId=route["GatewayId"],
            )
    assert code == 2 and report["ok"] is False
    assert {name for name, status in results(report).items() if status != "ok"} == {SUBNETS}
    [check] = [c for c in report["checks"] if c["name"] == SUBNETS]
    assert f"no {DEFAULT_ROUTE} route to a NAT or internet gateway" in check["detail"]
    assert "VPC endpoint for s3, events, monitoring, logs" in check["detail"]
    assert "NAT gateway" in check["fix"]


def test_a_quota_below_the_largest_job_fails_that_quota_and_only_it(
    emulator: RunningEmulator,
) -> None:
    code = "L-C4BD4855"  # All P5 Spot Instance Requests: gpu-train-large's 2 x p5.48xlarge
    set_vcpu_quota(emulator.account, code, 192)
    try:
        exit_code, report = doctor()
    finally:
        set_vcpu_quota(emulator.account, code, EC2_VCPU_QUOTAS[code])
    assert exit_code == 2
    assert {name for name, status in results(report).items() if status != "ok"} == {f"quota {code}"}
    [check] = [c for c in report["checks"] if c["name"] == f"quota {code}"]
    assert "192 vCPUs; gpu-train-large needs 384 (2 x p5.48xlarge)" in check["detail"]
    assert f"--quota-code {code} --desired-value 384" in check["fix"]


def test_a_new_accounts_lambda_concurrency_fails_that_check_and_only_it(
    emulator: RunningEmulator,
) -> None:
    set_lambda_concurrency(emulator.account, 10)  # what some new accounts start with
    try:
        exit_code, report = doctor()
    finally:
        set_lambda_concurrency(emulator.account, LAMBDA_CONCURRENCY)
    assert exit_code == 2
    assert {name for name, status in results(report).items() if status != "ok"} == {
        "lambda concurrency"
    }
    [check] = [c for c in report["checks"] if c["name"] == "lambda concurrency"]
    assert check["detail"].startswith("10 concurrent executions")
    assert "--service-code lambda --quota-code L-B99A9384" in check["fix"]


def test_the_smoke_job_runs_on_the_cheapest_instance_and_reports_each_step(
    emulator: RunningEmulator, healthy: tuple[int, dict[str, Any]]
) -> None:
    code, report = healthy
    smoke = report["smoke"]
    assert code == 0 and smoke["ok"] is True, smoke
    assert smoke["status"] == "SUCCEEDED" and smoke["failure_reason"] is None
    resources = parse_spec(SMOKE_SPEC.format(run="now", team="doctor").encode(), "auto").resources
    cheapest = select(resources, "auto", load_bundled(), emulator.account.region).best
    assert smoke["instance_type"] == cheapest.instance_type.name
    assert smoke["cost_usd"] > 0
    steps = smoke["steps"]
    assert [step["name"] for step in steps] == list(SMOKE_STEPS)
    seen = [step["at_seconds"] for step in steps if step["at_seconds"] is not None]
    # Every step but the node's start report is read from a record that keeps it; that one
    # is caught by polling, which a slow machine could miss between two polls.
    assert len(seen) >= len(SMOKE_STEPS) - 1
    assert seen == sorted(seen)
    # Each latency runs from the step seen before it: together they make up the whole run.
    latencies = [step["latency_seconds"] for step in steps if step["latency_seconds"] is not None]
    assert sum(latencies) == pytest.approx(seen[-1])
