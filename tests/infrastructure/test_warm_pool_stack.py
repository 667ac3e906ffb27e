"""With a warm pool in the config, and only then, Reconcile may launch (tagged) instances and
Launch may claim them: retag an idle warm instance and write the pool's partition of the queue
table, nothing more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cdk_nag import AwsSolutionsChecks
from infra.app import ROOT, build_app
from infra.stack import STACK_NAME

from gpufleet import topology

if TYPE_CHECKING:
    from conftest import Synth

MANAGED = topology.TAG_MANAGED


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("warm")
    config = folder / "gpufleet.yaml"
    config.write_text(
        (ROOT / "gpufleet.yaml").read_text(encoding="utf-8")
        + "\nwarm_pool: {instance_type: g5.xlarge, count: 2, ttl_minutes: 30}\n",
        encoding="utf-8",
    )
    app, _ = build_app(context={"config_file": str(config)}, outdir=str(folder / "cdk.out"))
    app.synth()
    doc = json.loads(Path(folder / "cdk.out" / f"{STACK_NAME}.template.json").read_text())
    return app, doc


def _statements(doc: dict[str, Any], function: topology.Function) -> list[dict[str, Any]]:
    [function_id] = [
        k
        for k, r in doc["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == function.handler
    ]
    role = doc["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements: list[dict[str, Any]] = []
    for resource in doc["Resources"].values():
        if (
            resource["Type"] == "AWS::IAM::Policy"
            and {"Ref": role} in resource["Properties"]["Roles"]
        ):
            statements += resource["Properties"]["PolicyDocument"]["Statement"]
    return statements


def _by_sid(statements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in statements if "Sid" in s}


def test_the_reconciler_launches_only_tagged_instances_and_only_with_a_warm_pool(
    warm: tuple[Any, dict[str, Any]], synth: Synth
) -> None:
    _, doc = warm
    reconcile = _by_sid(_statements(doc, topology.RECONCILE))
    assert reconcile["LaunchTaggedInstances"]["Condition"] == {
        "StringEquals": {f"aws:RequestTag/{MANAGED}": "true"}
    }
    assert "ClaimWarmInstances" not in reconcile
    default = _by_sid(synth.statements_of_role(synth.role_of_function("Reconcile")))
    assert "LaunchTaggedInstances" not in default and "WarmPoolClaims" not in default


def test_launch_may_retag_only_warm_instances_with_their_job(
    warm: tuple[Any, dict[str, Any]],
) -> None:
    _, doc = warm
    claim = _by_sid(_statements(doc, topology.LAUNCH))["ClaimWarmInstances"]
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
    warm: tuple[Any, dict[str, Any]], function: topology.Function
) -> None:
    _, doc = warm
    claims = _by_sid(_statements(doc, function))["WarmPoolClaims"]
    assert claims["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [topology.WARM_POOL_PARTITION]}
    }
    assert "dynamodb:Scan" not in claims["Action"]


def test_cdk_nag_has_no_unacknowledged_findings_with_a_warm_pool(
    warm: tuple[Any, dict[str, Any]],
) -> None:
    app, _ = warm
    report = AwsSolutionsChecks().validate_scope(app)
    findings = [
        f"{v.rule_name} at {r.construct_path}"
        for v in report.violations
        for r in v.violating_resources
    ]
    assert not findings, "\n".join(findings)
