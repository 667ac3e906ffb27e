"""Cross-tenant suite (issue #19 point 4): what a job's container holds is its job's session of
the job role, and IAM's evaluation of the synthesized policies, with the session's tags read
into `${aws:PrincipalTag/...}`, lets it reach its own job's stage data and its own team's
checkpoints, and nothing of another job or team: no run manifest, no checkpoint or stage data of
theirs, no node report on the bus, no metrics. And a team's submit policy submits as that
team only: its own folder of the intake bucket and its own event source.

The evaluation is the embedded account's (`gpufleet/emulator/job_sessions.py` SessionPolicy:
IAM's for identity policies of Allow statements only), the one it judges a job session's
requests by (tests/integration/test_job_sessions.py has them refused end to end).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from infra.app import build_app
from infra.constructs.submitters import submitting_teams
from infra.stack import STACK_NAME

from gpufleet import topology
from gpufleet.domain.config import config_from_yaml
from gpufleet.domain.node_reports import node_key_object
from gpufleet.domain.submitters import team_source, upload_key
from gpufleet.domain.tenancy import job_session_statements, session_tags
from gpufleet.emulator.job_sessions import SessionPolicy as Session
from gpufleet.services.lifecycle_base import control_key, run_manifest_key

CHECKPOINTS = "s3://ckpt-bucket/gpufleet"
CONFIG = Path(__file__).resolve().parents[2] / "gpufleet.yaml"
CKPT = "arn:<AWS::Partition>:s3:::ckpt-bucket"
MINE, THEIRS = "j-0000000000000000000a", "j-0000000000000000000b"
TEAM, OTHER_TEAM = "vision", "speech"


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@dataclass
class Roles:
    doc: dict[str, Any]
    job_role: str
    instance_role: str
    bucket: str  # "<IntakeBucket....Arn>"
    statements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def session(self, job_id: str, team: str) -> Session:
        """The session the node agent opens for a job (its tags as domain.tenancy sets them),
        with its resource patterns rendered as the template writes them, variables kept."""
        tags = {t["Key"]: t["Value"] for t in session_tags(job_id, team)}
        return Session(self.statements[self.job_role], tags)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_render(p) for p in parts)
    return json.dumps(value, sort_keys=True)  # matches no resource this suite asks about


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Roles:
    outdir = tmp_path_factory.mktemp("cross-tenant.cdk.out")
    app, _ = build_app(context={"checkpoint_uri": CHECKPOINTS}, outdir=str(outdir))
    app.synth()
    doc = json.loads((Path(outdir) / f"{STACK_NAME}.template.json").read_text(encoding="utf-8"))
    resources = doc["Resources"]
    [job_role] = [
        k
        for k, r in resources.items()
        if k.startswith("FleetJobRole") and r["Type"] == "AWS::IAM::Role"
    ]
    [profile] = [r for r in resources.values() if r["Type"] == "AWS::IAM::InstanceProfile"]
    [instance_role] = [r["Ref"] for r in profile["Properties"]["Roles"]]
    statements: dict[str, list[dict[str, Any]]] = {job_role: [], instance_role: []}
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for role in resource["Properties"]["Roles"]:
            if role["Ref"] in statements:
                for statement in _listify(resource["Properties"]["PolicyDocument"]["Statement"]):
                    statements[role["Ref"]].append(
                        {
                            **statement,
                            "Resource": [_render(r) for r in _listify(statement["Resource"])],
                        }
                    )
    [bucket] = [
        k
        for k, r in resources.items()
        if r["Type"] == "AWS::S3::Bucket" and k.startswith("IntakeBucket")
    ]
    return Roles(doc, job_role, instance_role, f"<{bucket}.Arn>", statements)


def _stage_object(roles: Roles, job_id: str) -> str:
    return f"{roles.bucket}/{topology.RUNS_PREFIX}{job_id}/stages/prepare/part-0"


def _checkpoint(team: str) -> str:
    return f"{CKPT}/gpufleet/{team}/{MINE}/step-100.pt"


def test_a_job_reaches_its_own_stage_data_and_its_teams_checkpoints(roles: Roles) -> None:
    mine = roles.session(MINE, TEAM)
    for action in ("s3:GetObject", "s3:PutObject"):
        assert mine.allows(action, _stage_object(roles, MINE))
        assert mine.allows(action, _checkpoint(TEAM))
    assert mine.allows("s3:ListBucket", CKPT, {"s3:prefix": f"gpufleet/{TEAM}/{MINE}/"})
    assert mine.allows("s3:ListBucket", roles.bucket, {"s3:prefix": f"runs/{MINE}/stages/prepare/"})


@pytest.mark.parametrize(
    ("action", "what"),
    [
        ("s3:GetObject", "another team's checkpoint"),
        ("s3:PutObject", "another team's checkpoint"),
        ("s3:GetObject", "another job's stage data"),
        ("s3:PutObject", "another job's stage data"),
        ("s3:GetObject", "another job's run manifest"),
        ("s3:GetObject", "its own run manifest"),
        ("s3:PutObject", "another job's control file"),
        ("s3:GetObject", "its own run's node key"),
        ("s3:GetObject", "another job's node key"),
        ("s3:PutObject", "another job's node key"),
    ],
)
def test_a_job_cannot_touch_another_tenants_objects(roles: Roles, action: str, what: str) -> None:
    resource = {
        "another team's checkpoint": _checkpoint(OTHER_TEAM),
        "another job's stage data": _stage_object(roles, THEIRS),
        "another job's run manifest": f"{roles.bucket}/{run_manifest_key(THEIRS)}",
        # The manifest names the job's secrets and env: the agent reads it, the container not.
        "its own run manifest": f"{roles.bucket}/{run_manifest_key(MINE)}",
        "another job's control file": f"{roles.bucket}/{control_key(THEIRS)}",
        # What the agent signs its reports with: a container holding it could forge them.
        "its own run's node key": f"{roles.bucket}/{node_key_object(MINE)}",
        "another job's node key": f"{roles.bucket}/{node_key_object(THEIRS)}",
    }[what]
    assert not roles.session(MINE, TEAM).allows(action, resource)


def test_a_job_cannot_list_another_tenants_prefixes(roles: Roles) -> None:
    mine = roles.session(MINE, TEAM)
    assert not mine.allows("s3:ListBucket", CKPT, {"s3:prefix": f"gpufleet/{OTHER_TEAM}/"})
    assert not mine.allows("s3:ListBucket", CKPT, {"s3:prefix": "gpufleet/"})
    assert not mine.allows("s3:ListBucket", roles.bucket, {"s3:prefix": f"runs/{THEIRS}/"})


def test_a_job_cannot_report_for_a_job_or_put_its_metrics(roles: Roles) -> None:
    """Node reports and per-job metrics are the agent's (the instance role's), not the
    container's: its session has neither action on any resource."""
    mine = roles.session(MINE, TEAM)
    assert not mine.allows(
        "events:PutEvents", "<IntakeBus>", {"events:source": topology.AGENT_SOURCE}
    )
    assert not mine.allows(
        "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "GpuFleet/Jobs"}
    )
    assert not any(
        a.split(":")[0] in ("events", "cloudwatch", "sts", "iam")
        for s in roles.statements[roles.job_role]
        for a in _listify(s["Action"])
    )


def test_the_agent_on_the_host_holds_the_key_and_puts_the_jobs_metrics(roles: Roles) -> None:
    """What the container may not do, the instance role (the agent's, on the host) does: it
    reads its run's node key and puts the job's metrics, in the agent's namespaces only."""
    instance = Session(roles.statements[roles.instance_role], {})
    assert instance.allows("s3:GetObject", f"{roles.bucket}/{node_key_object(MINE)}")
    jobs_namespace = {"cloudwatch:namespace": topology.METRICS_NAMESPACE}
    assert instance.allows("cloudwatch:PutMetricData", "*", jobs_namespace)
    assert not instance.allows("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "AWS/EC2"})
    assert not instance.allows("s3:PutObject", f"{roles.bucket}/{node_key_object(MINE)}")


def test_only_launch_nodereport_and_the_instances_read_a_runs_key(roles: Roles) -> None:
    """Every role of the stack, judged on a job's node key: Launch makes it, NodeReport
    verifies with it, the instance's agent signs with it; no other role reads it."""
    by_role: dict[str, list[dict[str, Any]]] = {}
    for resource in roles.doc["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for role in resource["Properties"]["Roles"]:
            for statement in _listify(resource["Properties"]["PolicyDocument"]["Statement"]):
                rendered = [_render(r) for r in _listify(statement["Resource"])]
                by_role.setdefault(role["Ref"], []).append({**statement, "Resource": rendered})
    key = f"{roles.bucket}/{node_key_object(THEIRS)}"
    readers = sorted(
        name
        for name, statements in by_role.items()
        if Session(statements, {}).allows("s3:GetObject", key)
    )
    launch, report = topology.LAUNCH.construct_id, topology.NODE_REPORT.construct_id
    assert len(readers) == 3
    assert roles.instance_role in readers
    assert sum(name.startswith(f"Functions{launch}") for name in readers) == 1, readers
    assert sum(name.startswith(f"Functions{report}") for name in readers) == 1, readers


def test_the_embedded_account_judges_job_sessions_by_the_deployed_policy(roles: Roles) -> None:
    """The stack's job role and the embedded account's judge read one definition."""
    deployed = [{**s, "Action": _listify(s["Action"])} for s in roles.statements[roles.job_role]]
    defined = [
        {**s, "Action": sorted(_listify(s["Action"])), "Resource": _listify(s["Resource"])}
        for s in job_session_statements(roles.bucket, CKPT, "gpufleet")
    ]
    assert deployed == defined


def test_a_session_without_its_tags_reaches_nothing(roles: Roles) -> None:
    untagged = Session(roles.statements[roles.job_role], {})
    assert not untagged.allows("s3:GetObject", _stage_object(roles, MINE))
    assert not untagged.allows("s3:GetObject", f"{CKPT}/gpufleet//x")


def test_only_the_instance_role_opens_a_session_and_only_with_both_tags(roles: Roles) -> None:
    trust = roles.doc["Resources"][roles.job_role]["Properties"]["AssumeRolePolicyDocument"]
    [statement] = trust["Statement"]
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Principal"] == {"AWS": {"Fn::GetAtt": [roles.instance_role, "Arn"]}}
    assert statement["Condition"] == {
        "StringLike": {"aws:RequestTag/gpufleet-job": "?*", "aws:RequestTag/gpufleet-team": "?*"},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["gpufleet-job", "gpufleet-team"]},
    }
    sessions = [s for s in roles.statements[roles.instance_role] if s.get("Sid") == "JobSessions"]
    assert [s["Resource"] for s in sessions] == [[f"<{roles.job_role}.Arn>"]]
    # The instance role itself writes no stage data or checkpoints: only its usage samples.
    writes = [
        r
        for s in roles.statements[roles.instance_role]
        if "s3:PutObject" in _listify(s["Action"])
        for r in s["Resource"]
    ]
    assert writes == [f"{roles.bucket}/{topology.RUNS_PREFIX}*/usage/*"]


def _team_policies(roles: Roles) -> dict[str, list[dict[str, Any]]]:
    """Each team's submit policy (infra/constructs/submitters.py), by team, resources rendered."""
    policies = {}
    for resource in roles.doc["Resources"].values():
        name = resource["Properties"].get("ManagedPolicyName", "")
        if resource["Type"] == "AWS::IAM::ManagedPolicy" and "-submit-" in name:
            policies[name.rsplit("-submit-", 1)[1]] = [
                {**s, "Resource": [_render(r) for r in _listify(s["Resource"])]}
                for s in _listify(resource["Properties"]["PolicyDocument"]["Statement"])
            ]
    return policies


def _submission_event(team: str) -> dict[str, str]:
    return {"events:source": team_source(team), "events:detail-type": "Job Submitted"}


def test_each_team_of_the_config_gets_a_submit_policy(roles: Roles) -> None:
    assert sorted(_team_policies(roles)) == submitting_teams(config_from_yaml(CONFIG.read_text()))


def test_a_team_submits_as_itself_only(roles: Roles) -> None:
    """Submit as another team: neither its folder of the intake bucket nor its event source."""
    policies = _team_policies(roles)
    bus = _render(_bus_arn(roles))
    for team, statements in policies.items():
        holder = Session(statements, {})
        assert holder.allows("s3:PutObject", f"{roles.bucket}/{upload_key(team, 'a.yaml')}")
        assert holder.allows("events:PutEvents", bus, _submission_event(team))
        for other in set(policies) - {team}:
            assert not holder.allows("s3:PutObject", f"{roles.bucket}/{upload_key(other, 'a')}")
            assert not holder.allows("events:PutEvents", bus, _submission_event(other))
        assert not holder.allows("s3:PutObject", f"{roles.bucket}/{topology.INTAKE_PREFIX}a.yaml")
        assert not holder.allows("s3:GetObject", f"{roles.bucket}/{run_manifest_key(MINE)}")
        agent_event = {"events:source": topology.AGENT_SOURCE, "events:detail-type": "Node Started"}
        assert not holder.allows("events:PutEvents", bus, agent_event)


def _bus_arn(roles: Roles) -> Any:
    [bus] = [k for k, r in roles.doc["Resources"].items() if r["Type"] == "AWS::Events::EventBus"]
    return {"Fn::GetAtt": [bus, "Arn"]}
