"""With a warm pool in the config, and only then, Reconcile may launch (tagged) instances and
Launch may claim them: retag an idle warm instance and write the pool's partition of the queue
table, nothing more."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from cdk_nag import AwsSolutionsChecks

from gpufleet import topology

if TYPE_CHECKING:
    from conftest import Synth

MANAGED = topology.TAG_MANAGED


@pytest.fixture(scope="module")
def warm(synth_with_config: Callable[[str], Synth]) -> Synth:
    return synth_with_config("\nwarm_pool: {instance_type: g5.xlarge, count: 2, ttl_minutes: 30}\n")


def _statements(synth: Synth, function: topology.Function) -> list[dict[str, Any]]:
    return synth.statements_of_role(synth.role_of_function(function.construct_id))


def _by_sid(statements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in statements if "Sid" in s}


def test_the_reconciler_launches_only_tagged_instances_and_only_with_a_warm_pool(
    warm: Synth, synth: Synth
) -> None:
    reconcile = _by_sid(_statements(warm, topology.RECONCILE))
    assert reconcile["LaunchTaggedInstances"]["Condition"] == {
        "StringEquals": {f"aws:RequestTag/{MANAGED}": "true"}
    }
    assert "ClaimWarmInstances" not in reconcile
    default = _by_sid(synth.statements_of_role(synth.role_of_function("Reconcile")))
    assert "LaunchTaggedInstances" not in default and "WarmPoolClaims" not in default


def test_launch_may_retag_only_warm_instances_with_their_job(
    warm: Synth,
) -> None:
    claim = _by_sid(_statements(warm, topology.LAUNCH))["ClaimWarmInstances"]
    assert claim["Action"] == "ec2:CreateTags"
    assert claim["Condition"] == {
        "StringEquals": {
            f"aws:ResourceTag/{MANAGED}": "true",
            f"aws:ResourceTag/{topology.TAG_WARM}": ["true", "claimed"],
            f"aws:RequestTag/{topology.TAG_WARM}": "claimed",
        },
        "ForAllValues:StringEquals": {"aws:TagKeys": [topology.TAG_JOB_ID, topology.TAG_WARM]},
    }


@pytest.mark.parametrize(
    "function", [topology.LAUNCH, topology.RECONCILE], ids=lambda f: f.construct_id
)
def test_the_warm_pools_items_are_the_only_queue_items_it_grants(
    warm: Synth, function: topology.Function
) -> None:
    claims = _by_sid(_statements(warm, function))["WarmPoolClaims"]
    assert claims["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [topology.WARM_POOL_PARTITION]}
    }
    assert "dynamodb:Scan" not in claims["Action"]


@pytest.mark.parametrize(
    "function", [topology.LAUNCH, topology.RECONCILE], ids=lambda f: f.construct_id
)
def test_the_largest_roles_keep_their_policy_inline(
    warm: Synth, function: topology.Function
) -> None:
    # An overflow policy needs more of the deployer and can drop statements for a moment on an
    # update (infra/constructs/functions.py: ARN_SIZE_ESTIMATE).
    assert warm.overflow_policies_of_role(warm.role_of_function(function.construct_id)) == []


def test_cdk_nag_has_no_unacknowledged_findings_with_a_warm_pool(
    warm: Synth,
) -> None:
    report = AwsSolutionsChecks().validate_scope(warm.app)
    findings = [
        f"{v.rule_name} at {r.construct_path}"
        for v in report.violations
        for r in v.violating_resources
    ]
    assert not findings, "\n".join(findings)
