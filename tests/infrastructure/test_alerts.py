"""Every alarm can really notify: CloudWatch must be able to publish to the topics it targets.

CloudWatch publishes an alarm's notification as the `cloudwatch.amazonaws.com` service. To a
topic encrypted with the AWS-managed key `alias/aws/sns` it cannot (that key's policy is AWS's
and names no other service); to a topic under a customer-managed key only if the key policy
lets CloudWatch `kms:Decrypt` and `kms:GenerateDataKey*`; and to a topic with an access policy
of its own only if that policy allows it `sns:Publish`. moto checks none of this: the check is
made here, on the template, for every action of every alarm.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from gpufleet import topology

if TYPE_CHECKING:
    from conftest import Synth

CLOUDWATCH = "cloudwatch.amazonaws.com"
# What CloudWatch asks KMS for when it publishes to an encrypted topic.
KEY_ACTIONS_FOR_PUBLISHING = ("kms:Decrypt", "kms:GenerateDataKey")
AWS_MANAGED_SNS_KEY = "alias/aws/sns"
ALARM_ACTION_PROPERTIES = ("AlarmActions", "OKActions", "InsufficientDataActions")

Doc = dict[str, Any]


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _logical_id(value: Any) -> str | None:
    """The resource a `Ref` or `Fn::GetAtt` points to."""
    if isinstance(value, dict) and "Ref" in value:
        return str(value["Ref"])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return str(value["Fn::GetAtt"][0])
    return None


def _allows_service(statement: dict[str, Any], service: str, action: str) -> bool:
    """An unconditional-on-the-principal Allow of `action` to the service principal."""
    if statement.get("Effect") != "Allow":
        return False
    principal = statement.get("Principal", {})
    services = _listify(principal.get("Service", [])) if isinstance(principal, dict) else []
    if service not in services and principal != "*":
        return False
    return any(fnmatchcase(action, str(a)) for a in _listify(statement.get("Action", [])))


def _key_problem(key: Any, resources: dict[str, Any]) -> str | None:
    if key is None:
        return None  # not encrypted: CloudWatch needs no key
    key_id = _logical_id(key)
    if key_id is None:  # an id, ARN or alias, maybe joined from pseudo parameters
        text = json.dumps(key)
        if f'{AWS_MANAGED_SNS_KEY}"' in text:
            return f"encrypted with the AWS-managed key {AWS_MANAGED_SNS_KEY}"
        return f"encrypted with {text}, a key whose policy is not in the template"
    resource = resources[key_id]
    if resource["Type"] != "AWS::KMS::Key":
        return f"encrypted with {key_id}, a {resource['Type']} whose policy cannot be read"
    statements = _listify(resource["Properties"]["KeyPolicy"]["Statement"])
    missing = [
        action
        for action in KEY_ACTIONS_FOR_PUBLISHING
        if not any(_allows_service(s, CLOUDWATCH, action) for s in statements)
    ]
    if missing:
        return f"encrypted with {key_id}, whose policy does not let {CLOUDWATCH} {missing}"
    return None


def _topic_policy_problem(topic_id: str, resources: dict[str, Any]) -> str | None:
    """A topic policy replaces the default one: it must allow CloudWatch to publish itself."""
    policies = [
        r["Properties"]["PolicyDocument"]
        for r in resources.values()
        if r["Type"] == "AWS::SNS::TopicPolicy" and {"Ref": topic_id} in r["Properties"]["Topics"]
    ]
    if not policies:
        return None
    statements = [s for policy in policies for s in _listify(policy["Statement"])]
    if any(_allows_service(s, CLOUDWATCH, "sns:Publish") for s in statements):
        return None
    return f"its access policy does not allow {CLOUDWATCH} to sns:Publish"


def alarm_notification_problems(doc: Doc) -> list[str]:
    """Why CloudWatch could not publish each alarm action of the template that names a topic."""
    resources: dict[str, Any] = doc["Resources"]
    problems: list[str] = []
    for alarm_id, alarm in resources.items():
        if alarm["Type"] != "AWS::CloudWatch::Alarm":
            continue
        for kind in ALARM_ACTION_PROPERTIES:
            for action in alarm["Properties"].get(kind, []):
                topic_id = _logical_id(action)
                if topic_id is None:
                    if ":sns:" in json.dumps(action):
                        problems.append(f"{alarm_id} {kind}: a topic outside the template")
                    continue
                topic = resources[topic_id]
                if topic["Type"] != "AWS::SNS::Topic":
                    continue
                for problem in (
                    _key_problem(topic["Properties"].get("KmsMasterKeyId"), resources),
                    _topic_policy_problem(topic_id, resources),
                ):
                    if problem:
                        problems.append(f"{alarm_id} {kind} -> {topic_id}: {problem}")
    return problems


# -- the stack ---------------------------------------------------------------------------------


def test_cloudwatch_can_publish_every_alarm_of_the_stack(synth: Synth) -> None:
    assert synth.of_type("AWS::CloudWatch::Alarm")
    assert alarm_notification_problems(synth.doc) == []


def _alerts_topic(synth: Synth) -> tuple[str, dict[str, Any]]:
    topic_id: str = synth.doc["Outputs"]["AlertsTopicArn"]["Value"]["Ref"]
    return topic_id, synth.props(topic_id)


def test_the_alerts_key_is_customer_managed_rotated_and_only_for_the_topic(synth: Synth) -> None:
    _, topic = _alerts_topic(synth)
    key_id = _logical_id(topic["KmsMasterKeyId"])
    assert key_id is not None and synth.resources[key_id]["Type"] == "AWS::KMS::Key"
    key = synth.props(key_id)
    assert key["EnableKeyRotation"] is True
    services = {
        service
        for statement in _listify(key["KeyPolicy"]["Statement"])
        for service in _listify(statement.get("Principal", {}).get("Service", []))
    }
    # CloudWatch is the only service publishing to the topic (no EventBridge rule targets it).
    assert services == {CLOUDWATCH}
    rule_targets = [
        target["Arn"]
        for rule in synth.of_type("AWS::Events::Rule").values()
        for target in rule["Properties"].get("Targets", [])
    ]
    assert {"Ref": _alerts_topic(synth)[0]} not in rule_targets


def test_cloudwatch_may_publish_only_for_this_accounts_alarms_and_only_over_tls(
    synth: Synth,
) -> None:
    topic_id, _ = _alerts_topic(synth)
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for r in synth.of_type("AWS::SNS::TopicPolicy").values()
        if {"Ref": topic_id} in r["Properties"]["Topics"]
    ]
    statements = _listify(policy["Statement"])
    (allow,) = [s for s in statements if _allows_service(s, CLOUDWATCH, "sns:Publish")]
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    source = synth.render(allow["Condition"]["ArnLike"]["aws:SourceArn"])
    assert source == "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:*"
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )


def test_every_role_that_publishes_alerts_may_use_the_topics_key(synth: Synth) -> None:
    """SNS encrypts what a publisher sends with the publisher's own KMS permissions."""
    topic_id, topic = _alerts_topic(synth)
    key_arn = {"Fn::GetAtt": [_logical_id(topic["KmsMasterKeyId"]), "Arn"]}
    publishers = [
        policy["Properties"]["Roles"]
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if any(
            "sns:Publish" in synth.actions_of(s) and {"Ref": topic_id} in synth.resources_of(s)
            for s in _listify(policy["Properties"]["PolicyDocument"]["Statement"])
        )
    ]
    notifying = [
        f.construct_id
        for f in topology.FUNCTIONS
        if topology.ENV_NOTIFY_TOPIC in synth.function_env(f.construct_id)
    ]
    assert len(publishers) == len(notifying) > 0
    for function in notifying:
        statements = synth.statements_of_role(synth.role_of_function(function))
        (key_statement,) = [s for s in statements if key_arn in synth.resources_of(s)]
        assert sorted(synth.actions_of(key_statement)) == ["kms:Decrypt", "kms:GenerateDataKey"]


# -- the check itself --------------------------------------------------------------------------


def _doc(topic: dict[str, Any], *extra: tuple[str, dict[str, Any]]) -> Doc:
    return {
        "Resources": {
            "Topic": {"Type": "AWS::SNS::Topic", "Properties": topic},
            "Alarm": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {"AlarmActions": [{"Ref": "Topic"}]},
            },
            **dict(extra),
        }
    }


def _key(*statements: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return (
        "Key",
        {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": list(statements)}}},
    )


GRANT_TO_CLOUDWATCH = {
    "Effect": "Allow",
    "Principal": {"Service": CLOUDWATCH},
    "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
    "Resource": "*",
}


def test_the_check_refuses_the_aws_managed_sns_key() -> None:
    managed = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":kms:x:y:alias/aws/sns"]]}
    for key in ("alias/aws/sns", managed):
        (problem,) = alarm_notification_problems(_doc({"KmsMasterKeyId": key}))
        assert "AWS-managed key alias/aws/sns" in problem


def test_the_check_refuses_a_key_cloudwatch_may_not_use() -> None:
    account_only = {
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
        "Action": "kms:*",
        "Resource": "*",
    }
    decrypt_only = {**GRANT_TO_CLOUDWATCH, "Action": "kms:Decrypt"}
    for statements in ([account_only], [account_only, decrypt_only]):
        doc = _doc({"KmsMasterKeyId": {"Fn::GetAtt": ["Key", "Arn"]}}, _key(*statements))
        (problem,) = alarm_notification_problems(doc)
        assert "kms:GenerateDataKey" in problem
    elsewhere = _doc({"KmsMasterKeyId": "arn:aws:kms:us-east-1:123456789012:key/abc"})
    (problem,) = alarm_notification_problems(elsewhere)
    assert "not in the template" in problem


def test_the_check_refuses_a_topic_policy_without_cloudwatch() -> None:
    tls_only = {
        "Type": "AWS::SNS::TopicPolicy",
        "Properties": {
            "Topics": [{"Ref": "Topic"}],
            "PolicyDocument": {
                "Statement": [
                    {
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "sns:Publish",
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ]
            },
        },
    }
    doc = _doc({"KmsMasterKeyId": {"Fn::GetAtt": ["Key", "Arn"]}}, _key(GRANT_TO_CLOUDWATCH))
    assert alarm_notification_problems(doc) == []
    doc["Resources"]["Policy"] = tls_only
    (problem,) = alarm_notification_problems(doc)
    assert "access policy" in problem
