"""Teams' notifications in the stack: a topic per team with e-mail addresses (KMS, TLS only,
each address subscribed), the Notify function on the bus's status changes, allowed to publish
to those topics and the ones gpufleet.yaml names, and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from gpufleet import topology

if TYPE_CHECKING:
    from conftest import Synth

NAMED = "arn:aws:sns:us-east-1:123456789012:nlp-jobs"
TEAMS = f"""
teams:
  vision: {{notify: [vision-oncall@example.com, ml-leads@example.com]}}
  nlp: {{notify: ["{NAMED}"], notify_on: [RUNNING, SUCCEEDED, FAILED, CANCELLED]}}
"""


@pytest.fixture(scope="module")
def teams(synth_with_config: Callable[[str], Synth]) -> Synth:
    return synth_with_config(TEAMS)


def _publish_statements(synth: Synth) -> list[dict[str, Any]]:
    role = synth.role_of_function(topology.NOTIFY.construct_id)
    return [s for s in synth.statements_of_role(role) if "sns:Publish" in synth.actions_of(s)]


def test_a_team_with_addresses_gets_an_encrypted_topic_they_are_subscribed_to(
    teams: Synth,
) -> None:
    [topic_id] = [
        logical_id
        for logical_id, r in teams.of_type("AWS::SNS::Topic").items()
        if r["Properties"].get("DisplayName") == "gpufleet vision"
    ]
    props = teams.props(topic_id)
    assert "KmsMasterKeyId" in props
    subscriptions = [
        s["Properties"]
        for s in teams.of_type("AWS::SNS::Subscription").values()
        if s["Properties"]["TopicArn"] == {"Ref": topic_id}
    ]
    assert sorted((s["Protocol"], s["Endpoint"]) for s in subscriptions) == [
        ("email", "ml-leads@example.com"),
        ("email", "vision-oncall@example.com"),
    ]
    # TLS only: the topic policy denies any request without it.
    [policy] = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in teams.of_type("AWS::SNS::TopicPolicy").values()
        if {"Ref": topic_id} in p["Properties"]["Topics"]
    ]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for s in policy
    )
    # No topic for a team that names only existing topics.
    names = [r["Properties"].get("DisplayName") for r in teams.of_type("AWS::SNS::Topic").values()]
    assert "gpufleet nlp" not in names


def test_notify_publishes_only_to_the_teams_topics_and_is_told_which_is_whose(
    teams: Synth,
) -> None:
    [statement] = _publish_statements(teams)
    resources = [teams.render(r) for r in teams.resources_of(statement)]
    [vision] = [r for r in resources if r.startswith("<NotificationsTeamvision")]
    assert sorted(resources) == sorted([vision, NAMED])
    env = teams.function_env(topology.NOTIFY.construct_id)
    assert teams.render(env[topology.ENV_TEAM_TOPICS]) == f"vision={vision}"
    # It reads no table and puts no event: the event says all it tells.
    role = teams.role_of_function(topology.NOTIFY.construct_id)
    actions = {a for s in teams.statements_of_role(role) for a in teams.actions_of(s)}
    assert not any(a.startswith(("dynamodb:", "events:", "s3:")) for a in actions)
    assert {"sns:Publish", "kms:Decrypt", "kms:GenerateDataKey"} <= actions


def _notify_rules(synth: Synth) -> list[dict[str, Any]]:
    notify = synth.function_id(topology.NOTIFY.construct_id)
    return [
        rule["Properties"]
        for rule in synth.of_type("AWS::Events::Rule").values()
        if rule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [notify, "Arn"]}
    ]


def test_notify_hears_the_status_changes_of_the_teams_told_of_them_alone(teams: Synth) -> None:
    [rule] = _notify_rules(teams)
    assert rule["EventPattern"] == {
        "source": [topology.CONTROL_PLANE_SOURCE],
        "detail-type": [topology.DETAIL_JOB_STATUS_CHANGED],
        "detail": {"team": ["nlp", "vision"]},
    }


def test_without_teams_notify_may_publish_nowhere_and_is_never_invoked(synth: Synth) -> None:
    assert _publish_statements(synth) == []
    assert synth.function_env(topology.NOTIFY.construct_id)[topology.ENV_TEAM_TOPICS] == ""
    # No rule targets it: a job's status changes cost no invocation of it.
    assert _notify_rules(synth) == []


def test_intake_is_told_the_deployments_account(synth: Synth) -> None:
    for function in (topology.INTAKE_FROM_S3, topology.INTAKE_FROM_EVENT):
        env = synth.function_env(function.construct_id)
        assert env[topology.ENV_ACCOUNT] == {"Ref": "AWS::AccountId"}
