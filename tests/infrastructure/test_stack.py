"""The synthesized template against gpufleet.topology and the security rules of the stack."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk.assertions import Template
from infra.app import build_app
from infra.config import (
    PLACEHOLDER_SUBNET_IDS,
    ConfigError,
    GpuFleetConfig,
)
from infra.constructs.functions import PERMISSIONS, STARTS_WORKFLOW, Permission
from infra.stack import STACK_NAME

from gpufleet import topology
from gpufleet.domain.boot import STOCK_TARGETS, BootTarget, template_keys
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import config_from_env
from gpufleet.emulator.account import repository_config

if TYPE_CHECKING:
    from conftest import Synth

ROOT = Path(__file__).resolve().parents[2]
MANAGED = topology.TAG_MANAGED
# Actions AWS offers no resource-level permissions for: the only ones allowed on Resource "*".
RESOURCE_STAR_ACTIONS = {
    "ec2:Describe*",
    "ecr:GetAuthorizationToken",
    "ec2:DescribeInstances",
    "ec2:DescribePlacementGroups",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "cloudwatch:PutMetricData",
    "cloudwatch:GetMetricData",  # MetricWatch: no resource-level permissions
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
    # The catalog refresh's reads: neither the Price List nor these EC2 calls have resources.
    "pricing:GetProducts",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeAvailabilityZones",
    "ec2:DescribeSpotPriceHistory",
}


def _ids(logical_ids: dict[str, Any]) -> list[str]:
    return sorted(logical_ids)


# -- the assembly ------------------------------------------------------------------------------


def test_synth_writes_the_stack_template(synth: Synth) -> None:
    assert synth.template_path.name == f"{STACK_NAME}.template.json"
    assert synth.template_path.stat().st_size > 0
    assert (synth.outdir / "manifest.json").exists()


def test_every_topology_function_has_written_permissions() -> None:
    assert set(PERMISSIONS) == {f.construct_id for f in topology.FUNCTIONS}


# -- tables ------------------------------------------------------------------------------------


def test_one_table_per_topology_entry(synth: Synth) -> None:
    synth.template.resource_count_is("AWS::DynamoDB::Table", len(topology.TABLES))


@pytest.mark.parametrize("spec", topology.TABLES, ids=lambda t: t.construct_id)
def test_table_matches_topology(synth: Synth, spec: topology.Table) -> None:
    props = synth.props(synth.ref_target(spec.env_var))
    key_schema = [{"AttributeName": spec.partition_key, "KeyType": "HASH"}]
    if spec.sort_key:
        key_schema.append({"AttributeName": spec.sort_key, "KeyType": "RANGE"})
    assert props["KeySchema"] == key_schema
    attributes = {a["AttributeName"]: a["AttributeType"] for a in props["AttributeDefinitions"]}
    assert attributes == spec.key_attributes()
    assert set(attributes.values()) == {"S"}
    expected_indexes = []
    for index in spec.indexes:
        schema = [{"AttributeName": index.partition_key, "KeyType": "HASH"}]
        if index.sort_key:
            schema.append({"AttributeName": index.sort_key, "KeyType": "RANGE"})
        expected_indexes.append(
            {"IndexName": index.name, "KeySchema": schema, "Projection": {"ProjectionType": "ALL"}}
        )
    assert props.get("GlobalSecondaryIndexes", []) == expected_indexes
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True
    if spec.ttl_attribute:
        assert props["TimeToLiveSpecification"] == {
            "AttributeName": spec.ttl_attribute,
            "Enabled": True,
        }
    else:
        assert "TimeToLiveSpecification" not in props


# -- functions ---------------------------------------------------------------------------------


def test_one_function_per_topology_entry(synth: Synth) -> None:
    handlers = [
        r["Properties"]["Handler"]
        for r in synth.of_type("AWS::Lambda::Function").values()
        if r["Properties"]["Handler"].startswith("gpufleet.")
    ]
    assert sorted(handlers) == sorted(f.handler for f in topology.FUNCTIONS)


@pytest.mark.parametrize("spec", topology.FUNCTIONS, ids=lambda f: f.construct_id)
def test_function_matches_topology(synth: Synth, spec: topology.Function) -> None:
    props = synth.props(synth.function_id(spec.construct_id))
    assert props["Runtime"] == "python3.12"
    assert props["Timeout"] == spec.timeout_seconds
    assert props["MemorySize"] == spec.memory_mb
    assert props["Description"] == spec.description
    assert props["TracingConfig"] == {"Mode": "Active"}
    assert "TargetArn" in props["DeadLetterConfig"]
    log_group = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert synth.props(log_group)["RetentionInDays"] == 30
    # Powertools v3 for python3.12 on x86_64, as its public SSM parameter names it at deploy.
    (layer,) = props["Layers"]
    assert synth.doc["Parameters"][layer["Ref"]] == {
        "Type": "AWS::SSM::Parameter::Value<String>",
        "Default": "/aws/service/powertools/python/x86_64/python3.12/latest",
    }


@pytest.mark.parametrize("spec", topology.FUNCTIONS, ids=lambda f: f.construct_id)
def test_function_environment(synth: Synth, spec: topology.Function) -> None:
    env = synth.function_env(spec.construct_id)
    expected = {table.env_var for table in topology.TABLES} | {
        topology.ENV_EVENT_BUS,
        topology.ENV_INTAKE_BUCKET,
        topology.ENV_CONFIG,
        topology.ENV_LAUNCH_TEMPLATES,
        "POWERTOOLS_SERVICE_NAME",
        "POWERTOOLS_METRICS_NAMESPACE",
        "LOG_LEVEL",
    }
    if spec.construct_id in STARTS_WORKFLOW:
        expected.add(topology.ENV_STATE_MACHINE)
    # Launch (templates, subnets), Reconcile (the warm pool's launches), MetricWatch (alerts).
    expected |= set(topology.EXTRA_ENV.get(spec.construct_id, ()))
    assert set(env) == expected
    for table in topology.TABLES:
        assert synth.resources[env[table.env_var]["Ref"]]["Type"] == "AWS::DynamoDB::Table"
    assert synth.resources[env[topology.ENV_EVENT_BUS]["Ref"]]["Type"] == "AWS::Events::EventBus"
    assert synth.resources[env[topology.ENV_INTAKE_BUCKET]["Ref"]]["Type"] == "AWS::S3::Bucket"
    assert env["POWERTOOLS_SERVICE_NAME"] == "gpufleet"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "GpuFleet"
    assert env["LOG_LEVEL"] == "INFO"
    # The repository's gpufleet.yaml, validated at synth, as compact JSON.
    assert config_from_env(env[topology.ENV_CONFIG]) == repository_config()
    if topology.ENV_STATE_MACHINE in env:
        # The ARN built from the state machine's name (a Ref would be a dependency cycle for
        # Requeue, which the definition names and which starts executions).
        [machine] = synth.of_type("AWS::StepFunctions::StateMachine").values()
        parts = env[topology.ENV_STATE_MACHINE]["Fn::Join"][1]
        assert parts[-1] == f":stateMachine:{machine['Properties']['StateMachineName']}"
    if topology.ENV_SUBNETS in env:
        assert env[topology.ENV_SUBNETS] == ",".join(PLACEHOLDER_SUBNET_IDS)


def test_each_function_has_its_own_role(synth: Synth) -> None:
    roles = [synth.role_of_function(f.construct_id) for f in topology.FUNCTIONS]
    assert len(set(roles)) == len(roles)
    for role in roles:
        assert synth.props(role).get("ManagedPolicyArns", []) == []
        assert synth.overflow_policies_of_role(role) == []


# -- intake: bucket, bus, rules ------------------------------------------------------------------


def test_intake_bucket_is_hardened(synth: Synth) -> None:
    bucket = synth.ref_target(topology.ENV_INTAKE_BUCKET)
    props = synth.props(bucket)
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    (sse,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    log_bucket = props["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    assert synth.resources[log_bucket]["Type"] == "AWS::S3::Bucket"
    (rule,) = props["LifecycleConfiguration"]["Rules"]
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 30
    assert rule["Status"] == "Enabled"


@pytest.mark.parametrize("kind", ["intake", "access-logs"])
def test_buckets_enforce_ssl(synth: Synth, kind: str) -> None:
    bucket = synth.ref_target(topology.ENV_INTAKE_BUCKET)
    if kind == "access-logs":
        bucket = synth.props(bucket)["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    policies = [
        p
        for p in synth.of_type("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": bucket}
    ]
    (policy,) = policies
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )


def test_upload_notification_invokes_intake_function(synth: Synth) -> None:
    (notifications,) = synth.of_type("Custom::S3BucketNotifications").values()
    props = notifications["Properties"]
    assert props["BucketName"] == {"Ref": synth.ref_target(topology.ENV_INTAKE_BUCKET)}
    assert props["NotificationConfiguration"] == {
        "LambdaFunctionConfigurations": [
            {
                "Events": ["s3:ObjectCreated:*"],
                "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "jobs/"}]}},
                "LambdaFunctionArn": {
                    "Fn::GetAtt": [synth.function_id(topology.INTAKE_FROM_S3.construct_id), "Arn"]
                },
            }
        ]
    }


def test_event_bus_is_named_from_context(synth: Synth) -> None:
    bus = synth.ref_target(topology.ENV_EVENT_BUS)
    assert synth.props(bus)["Name"] == "gpufleet"


def test_one_rule_per_topology_entry(synth: Synth) -> None:
    synth.template.resource_count_is("AWS::Events::Rule", len(topology.RULES))


@pytest.mark.parametrize("spec", topology.RULES, ids=lambda r: r.construct_id)
def test_rule_matches_topology(synth: Synth, spec: topology.Rule) -> None:
    (rule_id,) = [
        k
        for k, r in synth.of_type("AWS::Events::Rule").items()
        if r["Properties"]["Description"] == spec.description
    ]
    props = synth.props(rule_id)
    assert props["EventPattern"] == spec.pattern
    if spec.on_default_bus:
        assert "EventBusName" not in props
    else:
        assert props["EventBusName"] == {"Ref": synth.ref_target(topology.ENV_EVENT_BUS)}
    (target,) = props["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [synth.function_id(spec.target_function), "Arn"]}
    queue = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
    assert synth.resources[queue]["Type"] == "AWS::SQS::Queue"
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 4, "MaximumEventAgeInSeconds": 21600}


def test_queues_are_encrypted_and_ssl_only(synth: Synth) -> None:
    queues = synth.of_type("AWS::SQS::Queue")
    # One dead-letter queue per function, per rule target, and one for the schedules.
    assert len(queues) == len(topology.FUNCTIONS) + len(topology.RULES) + 1
    policies = synth.of_type("AWS::SQS::QueuePolicy").values()
    for queue_id, queue in queues.items():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
        denies = [
            s
            for p in policies
            if {"Ref": queue_id} in p["Properties"]["Queues"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if s["Effect"] == "Deny"
        ]
        assert any(
            s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} for s in denies
        ), queue_id


# -- workflow ----------------------------------------------------------------------------------


def _state_machine(synth: Synth, spec: topology.StateMachine) -> dict[str, Any]:
    (logical_id,) = [
        k
        for k, r in synth.of_type("AWS::StepFunctions::StateMachine").items()
        if r["Properties"]["StateMachineName"] == f"{STACK_NAME}-{spec.construct_id}"
    ]
    return synth.props(logical_id)


@pytest.mark.parametrize("spec", topology.STATE_MACHINES, ids=lambda s: s.construct_id)
def test_state_machine_is_the_asl_file(synth: Synth, spec: topology.StateMachine) -> None:
    props = _state_machine(synth, spec)
    assert props["DefinitionString"] == spec.definition()
    assert props["DefinitionSubstitutions"] == {
        placeholder: {"Fn::GetAtt": [synth.function_id(function_id), "Arn"]}
        for placeholder, function_id in spec.function_substitutions.items()
    }
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    logging = props["LoggingConfiguration"]
    assert logging["Level"] == "ALL"
    assert logging["IncludeExecutionData"] is True


def _task_resources(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("Type") == "Task":
            found.append(node["Resource"])
        for value in node.values():
            found += _task_resources(value)
    elif isinstance(node, list):
        for value in node:
            found += _task_resources(value)
    return found


# Service integrations the state machine role is allowed to use (see workflow.py).
ALLOWED_INTEGRATIONS = {
    "arn:aws:states:::lambda:invoke",
    "arn:aws:states:::lambda:invoke.waitForTaskToken",
}


@pytest.mark.parametrize("spec", topology.STATE_MACHINES, ids=lambda s: s.construct_id)
def test_asl_uses_only_what_the_role_grants(spec: topology.StateMachine) -> None:
    text = spec.definition()
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    substitutions = set(spec.function_substitutions) | set(spec.value_substitutions)
    assert placeholders == substitutions
    for resource in _task_resources(json.loads(text)):
        if resource.startswith("${"):
            assert resource[2:-1] in spec.function_substitutions
        else:
            assert resource in ALLOWED_INTEGRATIONS, (
                f"{resource}: the state machine role grants no such integration"
            )


@pytest.mark.parametrize("spec", topology.STATE_MACHINES, ids=lambda s: s.construct_id)
def test_state_machine_role_invokes_exactly_its_functions(
    synth: Synth, spec: topology.StateMachine
) -> None:
    role = _state_machine(synth, spec)["RoleArn"]["Fn::GetAtt"][0]
    statements = synth.statements_of_role(role)
    invoked = {
        synth.render(r)
        for s in statements
        if "lambda:InvokeFunction" in synth.actions_of(s)
        for r in synth.resources_of(s)
    }
    assert invoked == {
        f"<{synth.function_id(cid)}.Arn>" for cid in set(spec.function_substitutions.values())
    }
    # Nothing beyond invoking its tasks (and the logging and tracing AWS grants only on *): a
    # grant no state uses is a permission an attacker could use.
    granted = {a for s in statements for a in synth.actions_of(s)}
    assert granted - RESOURCE_STAR_ACTIONS == {"lambda:InvokeFunction"}


# -- IAM: least privilege ----------------------------------------------------------------------


def test_no_wildcard_actions(synth: Synth) -> None:
    for logical_id, statement in synth.all_statements():
        for action in synth.actions_of(statement):
            assert action != "*", logical_id
            assert not action.endswith(":*"), (logical_id, action)
            if "*" in action:
                assert action == "ec2:Describe*", (logical_id, action)


def test_resource_star_only_for_actions_without_resource_permissions(synth: Synth) -> None:
    for logical_id, statement in synth.all_statements():
        if statement["Effect"] != "Allow" or "*" not in synth.resources_of(statement):
            continue
        assert synth.resources_of(statement) == ["*"], logical_id
        assert set(synth.actions_of(statement)) <= RESOURCE_STAR_ACTIONS, (logical_id, statement)
        if "cloudwatch:PutMetricData" in synth.actions_of(statement):
            assert "cloudwatch:namespace" in statement["Condition"]["StringEquals"]


def test_terminate_is_always_conditioned_on_the_managed_tag(synth: Synth) -> None:
    seen = 0
    for logical_id, statement in synth.all_statements():
        if "ec2:TerminateInstances" in synth.actions_of(statement):
            seen += 1
            assert statement["Condition"] == {
                "StringEquals": {f"aws:ResourceTag/{MANAGED}": "true"}
            }, logical_id
            assert [synth.render(r).rsplit(":", 1)[-1] for r in synth.resources_of(statement)] == [
                "instance/*"
            ]
    # Launch (partial launches), Release, Dispatch (overdue checkpoints), Reconcile and
    # WorkflowEnded (what a dead workflow left).
    assert seen == 5


def test_instances_and_fleets_are_created_only_with_the_managed_tag(synth: Synth) -> None:
    launch_statements = synth.statements_of_role(
        synth.role_of_function(topology.LAUNCH.construct_id)
    )
    for _, statement in synth.all_statements():
        actions = set(synth.actions_of(statement))
        if actions & {"ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateTags"}:
            assert statement in launch_statements
        if actions & {"ec2:RunInstances", "ec2:CreateFleet"}:
            kinds = {
                synth.render(r).rsplit(":", 1)[-1].split("/")[0]
                for r in synth.resources_of(statement)
            }
            if kinds & {"instance", "fleet"}:
                assert statement["Condition"] == {
                    "StringEquals": {f"aws:RequestTag/{MANAGED}": "true"}
                }
        if "ec2:CreateTags" in actions:
            condition = statement["Condition"]["StringEquals"]
            assert condition[f"aws:RequestTag/{MANAGED}"] == "true"
            assert sorted(condition["ec2:CreateAction"]) == [
                "CreateFleet",
                "CreatePlacementGroup",
                "RunInstances",
            ]


def test_pass_role_only_for_the_instance_role(synth: Synth) -> None:
    (profile,) = synth.of_type("AWS::IAM::InstanceProfile").values()
    (instance_role,) = profile["Properties"]["Roles"]
    passes = [s for _, s in synth.all_statements() if "iam:PassRole" in synth.actions_of(s)]
    assert len(passes) == 1
    assert synth.resources_of(passes[0]) == [{"Fn::GetAtt": [instance_role["Ref"], "Arn"]}]
    assert passes[0]["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def _actions_of_function(synth: Synth, construct_id: str) -> set[str]:
    role = synth.role_of_function(construct_id)
    return {a for s in synth.statements_of_role(role) for a in synth.actions_of(s)}


CATALOG_READERS = {
    "IntakeFromS3",
    "IntakeFromEvent",
    "Launch",
    "Requeue",
    "MetricWatch",
    "Release",
    "Dispatch",  # plans an array's child it admits (docs/arrays.md)
}
NODE_KEY_READERS = {"Launch", "NodeReport"}

# Distinctive actions and which functions hold them; everything else must not.
EXCLUSIVE_ACTIONS = {
    # Requeue: a job past its execution's budget continues in a new one (domain/history.py);
    # Dispatch: an array's child starts its execution when admitted (docs/arrays.md).
    "states:StartExecution": {"IntakeFromS3", "IntakeFromEvent", "Requeue", "Dispatch"},
    # The reconciler ends the run of an instance that went away unheard.
    "states:SendTaskSuccess": {
        "Launch",
        "NodeReport",
        "Enqueue",
        "Dispatch",
        "InstanceEvent",
        "Reconcile",
    },
    # The idempotency table (intake) and the admission queue (admit, release).
    # MetricWatch rewrites a resized job's queue entry.
    "dynamodb:DeleteItem": {
        "IntakeFromS3",
        "IntakeFromEvent",
        "Dispatch",
        "Release",
        "MetricWatch",
        # Ending a job its lifecycle left: its wait in the queue and its share.
        "WorkflowEnded",
        "Reconcile",
    },
    "states:SendTaskHeartbeat": {"NodeReport"},
    # MetricWatch reads the running jobs' metrics; no function writes an alarm.
    "cloudwatch:GetMetricData": {"MetricWatch"},
    "sns:Publish": {"Dispatch", "MetricWatch"},
    # Only the S3 path reads a spec object (the notified version); a spec in an event is
    # refused in an event. No function reads whatever version of an object is latest.
    "s3:GetObjectVersion": {"IntakeFromS3"},
    # The refreshed catalog, read by the functions that plan (never a spec: see above), and the
    # runs' node keys, read by the two functions that make and check their signatures.
    "s3:GetObject": CATALOG_READERS | NODE_KEY_READERS,
    "pricing:GetProducts": {"CatalogRefresh"},
    "ec2:DescribeSpotPriceHistory": {"CatalogRefresh"},
    "ec2:CreateFleet": {"Launch"},
    "ec2:RunInstances": {"Launch"},
    "iam:PassRole": {"Launch"},
    "ec2:TerminateInstances": {"Launch", "Release", "Dispatch", "Reconcile", "WorkflowEnded"},
    "events:PutEvents": {
        "IntakeFromS3",
        "IntakeFromEvent",
        "Enqueue",
        "Launch",
        "NodeReport",
        "MetricWatch",
        "Requeue",
        "Release",
        "WorkflowEnded",
        "Reconcile",
    },
    # Only the functions that look for lifecycles that ended.
    "states:ListExecutions": {"Reconcile"},
    "states:DescribeExecution": {"Reconcile"},
}


@pytest.mark.parametrize("action", sorted(EXCLUSIVE_ACTIONS))
def test_actions_belong_to_the_functions_that_need_them(synth: Synth, action: str) -> None:
    holders = {
        f.construct_id
        for f in topology.FUNCTIONS
        if action in _actions_of_function(synth, f.construct_id)
    }
    assert holders == EXCLUSIVE_ACTIONS[action]


def test_no_function_scans_or_deletes_jobs(synth: Synth) -> None:
    jobs_table = synth.ref_target(topology.JOBS_TABLE.env_var)
    for _, statement in synth.all_statements():
        names = {synth.render(r) for r in synth.resources_of(statement)}
        if any(jobs_table in name for name in names):
            assert not set(synth.actions_of(statement)) & {
                "dynamodb:Scan",
                "dynamodb:DeleteItem",
                "dynamodb:DeleteTable",
            }


def test_only_intake_creates_jobs(synth: Synth) -> None:
    """Every other function updates jobs that exist, under conditions; none can write a whole
    item over one."""
    jobs_table = synth.ref_target(topology.JOBS_TABLE.env_var)
    creators = set()
    for f in topology.FUNCTIONS:
        role = synth.role_of_function(f.construct_id)
        for statement in synth.statements_of_role(role):
            names = {synth.render(r) for r in synth.resources_of(statement)}
            on_jobs = any(jobs_table in name for name in names)
            if on_jobs and "dynamodb:PutItem" in synth.actions_of(statement):
                creators.add(f.construct_id)
    assert creators == {"IntakeFromS3", "IntakeFromEvent"}


def test_control_plane_events_carry_the_control_plane_source(synth: Synth) -> None:
    for f in topology.FUNCTIONS:
        role = synth.role_of_function(f.construct_id)
        for statement in synth.statements_of_role(role):
            if "events:PutEvents" in synth.actions_of(statement):
                assert statement["Condition"] == {
                    "StringEquals": {"events:source": topology.CONTROL_PLANE_SOURCE}
                }


def test_the_functions_that_may_alert_are_given_the_topic_and_only_they(synth: Synth) -> None:
    """The emulator gives every function the whole environment; a deployed function has only
    its own, so one that may publish an alert must be given the topic (and the grant)."""
    with_topic = {
        f.construct_id
        for f in topology.FUNCTIONS
        if topology.ENV_NOTIFY_TOPIC in synth.function_env(f.construct_id)
    }
    notifying = {cid for cid, grants in PERMISSIONS.items() if Permission.NOTIFY in grants}
    assert with_topic == notifying == {"Dispatch", "MetricWatch"}


def _statements_with(synth: Synth, construct_id: str, action: str) -> list[dict[str, Any]]:
    role = synth.role_of_function(construct_id)
    return [s for s in synth.statements_of_role(role) if action in synth.actions_of(s)]


def test_the_refreshed_catalog_is_written_and_read_under_its_one_key(synth: Synth) -> None:
    bucket = synth.ref_target(topology.ENV_INTAKE_BUCKET)
    key = {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, f"/{topology.CATALOG_KEY}"]]}
    (write,) = _statements_with(synth, topology.CATALOG_REFRESH.construct_id, "s3:PutObject")
    assert (synth.actions_of(write), synth.resources_of(write)) == (["s3:PutObject"], [key])
    node_keys = {
        "Fn::Join": [
            "",
            [{"Fn::GetAtt": [bucket, "Arn"]}, f"/{topology.RUNS_PREFIX}*/{topology.NODE_KEY_NAME}"],
        ]
    }
    for reader in CATALOG_READERS | NODE_KEY_READERS:
        reads = _statements_with(synth, reader, "s3:GetObject")
        expected = [[key]] * (reader in CATALOG_READERS) + [[node_keys]] * (
            reader in NODE_KEY_READERS
        )
        assert sorted(map(synth.resources_of, reads), key=str) == sorted(expected, key=str)
        assert all(synth.actions_of(read) == ["s3:GetObject"] for read in reads)
    # The refresh reads the APIs and writes its object, nothing else of the stack's.
    refresh = synth.role_of_function(topology.CATALOG_REFRESH.construct_id)
    actions = {a for st in synth.statements_of_role(refresh) for a in synth.actions_of(st)}
    assert actions == {
        "s3:PutObject",
        "pricing:GetProducts",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeAvailabilityZones",
        "ec2:DescribeSpotPriceHistory",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "sqs:SendMessage",
    }


def test_permission_table_matches_handlers() -> None:
    assert set(STARTS_WORKFLOW) == {
        topology.INTAKE_FROM_S3.construct_id,
        topology.INTAKE_FROM_EVENT.construct_id,
        topology.REQUEUE.construct_id,  # continues a job in a new execution
        topology.DISPATCH.construct_id,  # starts an array's child it admits
    }
    assert Permission.TERMINATE in PERMISSIONS[topology.RELEASE.construct_id]


# -- fleet ---------------------------------------------------------------------------------------


def _launch_template(synth: Synth, key: str = "x86_64-nvidia") -> dict[str, Any]:
    """The data of the launch template of `key` (a boot.TemplateKey name)."""
    data: dict[str, Any] = synth.props(synth.launch_template_ids()[key])["LaunchTemplateData"]
    return data


TEMPLATES = ("x86_64-nvidia", "x86_64-nvidia-efa32", "arm64-cpu", "x86_64-neuron-efa8")


def test_every_function_gets_one_template_per_boot_target_and_efa_width(synth: Synth) -> None:
    templates = synth.launch_template_ids()
    assert set(templates.values()) == set(synth.of_type("AWS::EC2::LaunchTemplate"))
    expected = template_keys(load_bundled().instance_types(), STOCK_TARGETS)
    assert sorted(templates) == sorted(k.name for k in expected)
    for function in topology.FUNCTIONS:
        env = synth.function_env(function.construct_id)
        assert (
            env[topology.ENV_LAUNCH_TEMPLATES]
            == synth.function_env(topology.LAUNCH.construct_id)[topology.ENV_LAUNCH_TEMPLATES]
        )


@pytest.mark.parametrize(
    ("key", "cards", "primary"),
    [
        ("x86_64-nvidia-efa1", 1, "efa"),
        ("x86_64-nvidia-efa4", 4, "efa"),
        ("x86_64-nvidia-efa32", 32, "efa"),
        ("x86_64-nvidia-efa16of17", 17, "interface"),
        ("x86_64-neuron-efa16", 16, "efa"),
    ],
)
def test_an_efa_template_is_the_plain_one_with_one_interface_per_network_card(
    synth: Synth, key: str, cards: int, primary: str
) -> None:
    plain = _launch_template(synth, key.rsplit("-", 1)[0])
    efa = _launch_template(synth, key)
    interfaces = efa["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(cards))
    assert {i["DeviceIndex"] for i in interfaces} == {0}
    assert interfaces[0]["InterfaceType"] == primary
    assert {i["InterfaceType"] for i in interfaces[1:]} <= {"efa-only"}
    for interface in interfaces:
        assert "SubnetId" not in interface  # each CreateFleet override names the subnet
        # Security groups go on the interfaces: EC2 refuses them at the top level as well.
        assert interface["Groups"] == plain["SecurityGroupIds"]
    assert "SecurityGroupIds" not in efa
    assert {k: v for k, v in efa.items() if k != "NetworkInterfaces"} == {
        k: v for k, v in plain.items() if k != "SecurityGroupIds"
    }


@pytest.mark.parametrize(
    ("key", "parameter", "root_device"),
    [
        (
            "x86_64-nvidia",
            "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/"
            "latest/ami-id",
            "/dev/sda1",
        ),
        (
            "arm64-nvidia",
            "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-22.04/"
            "latest/ami-id",
            "/dev/sda1",
        ),
        (
            "x86_64-neuron",
            "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id",
            "/dev/sda1",
        ),
        (
            "x86_64-cpu",
            "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
            "/dev/xvda",
        ),
        (
            "arm64-cpu",
            "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
            "/dev/xvda",
        ),
    ],
)
def test_each_boot_target_boots_its_image_from_a_public_ssm_parameter(
    synth: Synth, key: str, parameter: str, root_device: str
) -> None:
    data = _launch_template(synth, key)
    image = synth.doc["Parameters"][data["ImageId"]["Ref"]]
    assert image["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert image["Default"] == parameter
    (root,) = data["BlockDeviceMappings"]
    assert root["DeviceName"] == root_device


def test_an_image_overridden_at_deploy_or_none_changes_the_templates(tmp_path: Path) -> None:
    custom = "/my/images/arm-gpu"
    _, stack = build_app({"ami_arm64_nvidia": custom, "ami_x86_64_neuron": "none"}, str(tmp_path))
    doc = Template.from_stack(stack).to_json()
    images = {p["Default"] for p in doc["Parameters"].values() if "Image::Id" in p["Type"]}
    assert custom in images and not any("/neuron/" in i for i in images)
    without_neuron = STOCK_TARGETS - {BootTarget("x86_64", "neuron")}
    expected = template_keys(load_bundled().instance_types(), without_neuron)
    templates = [r for r in doc["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert len(templates) == len(expected)
    with pytest.raises(ConfigError, match="ami_arm64_cpu must be an SSM parameter path"):
        GpuFleetConfig.from_context({"ami_arm64_cpu": "ami-0123"})
    nothing = {f"ami_{image.target.replace('-', '_')}": "none" for image in topology.BOOT_IMAGES}
    with pytest.raises(ConfigError, match="would boot no instance type"):
        GpuFleetConfig.from_context(nothing)


@pytest.mark.parametrize("key", TEMPLATES)
def test_launch_template_hardening(synth: Synth, key: str) -> None:
    data = _launch_template(synth, key)
    assert data["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
        "InstanceMetadataTags": "enabled",
    }
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"] == {
        "DeleteOnTermination": True,
        "Encrypted": True,
        "VolumeSize": 200,
        "VolumeType": "gp3",
    }
    assert data["Monitoring"] == {"Enabled": True}
    assert "InstanceType" not in data  # CreateFleet chooses
    kinds = set()
    for spec in data["TagSpecifications"]:
        assert {"Key": MANAGED, "Value": "true"} in spec["Tags"]
        kinds.add(spec["ResourceType"])
    assert kinds >= {"instance", "volume"}


def test_the_launch_role_tags_at_creation_exactly_what_launches_tag(synth: Synth) -> None:
    statements = synth.statements_of_role(synth.role_of_function(topology.LAUNCH.construct_id))
    [tag_at_launch] = [s for s in statements if s.get("Sid") == "TagAtLaunchOnly"]
    kinds = {
        synth.render(arn).rsplit(":", 1)[1].split("/")[0]
        for arn in synth.resources_of(tag_at_launch)
    }
    templates = {s["ResourceType"] for s in _launch_template(synth)["TagSpecifications"]}
    # CreateFleet tags the fleet and its instances, CreatePlacementGroup the job's group.
    assert kinds == {"fleet", "instance", "placement-group"} | templates
    # A template tagging spot requests fails every launch that makes none (on-demand, reserved).
    assert "spot-instances-request" not in kinds


def test_user_data_is_fixed_per_deployment(synth: Synth) -> None:
    join = _launch_template(synth)["UserData"]["Fn::Base64"]["Fn::Join"]
    text = synth.render(_launch_template(synth)["UserData"]["Fn::Base64"])
    assert "-m gpufleet.agent" in text
    # The CloudWatch agent is set up with its NVIDIA GPU metrics (CWAgent nvidia_smi_*).
    assert '"nvidia_gpu"' in text and "utilization_gpu" in text and "temperature_gpu" in text
    # Only deployment-wide values are interpolated: region, bus, bucket, log group, code zip,
    # the job role.
    (job_role,) = [k for k in synth.of_type("AWS::IAM::Role") if k.startswith("FleetJobRole")]
    allowed = {
        "AWS::Region",
        synth.ref_target(topology.ENV_EVENT_BUS),
        synth.ref_target(topology.ENV_INTAKE_BUCKET),
        _agent_log_group(synth),
    }
    for part in join[1]:
        if isinstance(part, dict):
            if "Ref" in part:
                assert part["Ref"] in allowed, part
            elif "Fn::GetAtt" in part:
                assert part == {"Fn::GetAtt": [job_role, "Arn"]}
            else:
                assert part == {"Fn::Sub": "cdk-hnb659fds-assets-${AWS::AccountId}-${AWS::Region}"}
    fixed = " ".join(p for p in join[1] if isinstance(p, str)).replace("jobs/", "")
    # The words of the deployment's own names (the job role, the containers' slice), no job's.
    for name in (topology.ENV_JOB_ROLE, "--job-role", topology.JOBS_SLICE, "job containers"):
        fixed = fixed.replace(name, "")
    assert "job" not in fixed
    # The containers' slice is kept from the metadata service before the agent starts.
    assert text.index(f"--path {topology.JOBS_SLICE} -d 169.254.169.254 -j REJECT") < text.index(
        "systemctl enable --now gpufleet-agent.service"
    )


def _agent_unit(text: str) -> dict[str, dict[str, str]]:
    """The agent's systemd unit from the user data: section -> setting -> value."""
    body = text.split("gpufleet-agent.service <<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0]
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif "=" in line:
            name, value = line.split("=", 1)
            assert name not in current, f"{name} set twice"
            current[name] = value
    return sections


def test_the_agent_unit_restarts_only_the_agent_and_gives_up(synth: Synth) -> None:
    """The agent exited 1 when the job failed and the unit restarted it on failure: the job ran
    again on the same node, every 10 s. Now the exit status is the agent's own (see
    gpufleet.agent's __main__), the restarts are bounded, and the agent keeps its run ledger
    in a state directory that a restart keeps."""
    unit = _agent_unit(synth.render(_launch_template(synth)["UserData"]["Fn::Base64"]))
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # bad arguments: no restart fixes that
    # Start limits live in [Unit] (systemd >= 230; the DLAMI has 249): 5 starts in 10 minutes.
    assert (unit["Unit"]["StartLimitIntervalSec"], unit["Unit"]["StartLimitBurst"]) == ("600", "5")
    assert "StartLimitBurst" not in service and "StartLimitInterval" not in service
    assert service["StateDirectory"] == "gpufleet"
    assert "--state-dir /var/lib/gpufleet" in service["ExecStart"]
    assert unit["Install"] == {"WantedBy": "multi-user.target"}


def _agent_log_group(synth: Synth) -> str:
    value = synth.doc["Outputs"]["AgentLogGroupName"]["Value"]
    logical_id: str = value["Ref"]
    return logical_id


def test_security_group_has_no_inbound_from_outside(synth: Synth) -> None:
    (group_id,) = synth.of_type("AWS::EC2::SecurityGroup")
    group = synth.props(group_id)
    assert "SecurityGroupIngress" not in group
    (egress_rule,) = group["SecurityGroupEgress"]
    assert {k: v for k, v in egress_rule.items() if k != "Description"} == {
        "CidrIp": "0.0.0.0/0",
        "FromPort": 443,
        "IpProtocol": "tcp",
        "ToPort": 443,
    }
    self_ref = {"Fn::GetAtt": [group_id, "GroupId"]}
    for ingress in synth.of_type("AWS::EC2::SecurityGroupIngress").values():
        assert ingress["Properties"]["SourceSecurityGroupId"] == self_ref
        assert "CidrIp" not in ingress["Properties"]
    for egress in synth.of_type("AWS::EC2::SecurityGroupEgress").values():
        assert egress["Properties"]["DestinationSecurityGroupId"] == self_ref


def test_instance_role(synth: Synth) -> None:
    (profile,) = synth.of_type("AWS::IAM::InstanceProfile").values()
    (role,) = profile["Properties"]["Roles"]
    statements = synth.statements_of_role(role["Ref"])
    by_sid = {s.get("Sid"): s for s in statements}
    assert by_sid["AgentReports"]["Condition"] == {
        "StringEquals": {"events:source": topology.AGENT_SOURCE}
    }
    assert by_sid["GpuMetrics"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": ["CWAgent", "GpuFleet/Jobs"]}
    }
    assert synth.render(by_sid["ReadRuns"]["Resource"]).endswith("/runs/*")
    # Stage data and checkpoints are the job role's (tests/infrastructure/test_cross_tenant.py):
    # the instance role writes only its usage object, under runs/<job>/usage/, and opens job
    # sessions with their tags.
    assert synth.render(by_sid["UsageData"]["Resource"]).endswith("/runs/*/usage/*")
    assert by_sid["UsageData"]["Action"] == "s3:PutObject"
    assert set(synth.actions_of(by_sid["JobSessions"])) == {"sts:AssumeRole", "sts:TagSession"}
    actions = {a for s in statements for a in synth.actions_of(s)}
    assert actions == {
        "events:PutEvents",
        "cloudwatch:PutMetricData",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "logs:DescribeLogStreams",
        "s3:GetObject",
        "s3:PutObject",
        "sts:AssumeRole",
        "sts:TagSession",
        # Private images and secrets (infra/constructs/node_access.py).
        "ecr:GetAuthorizationToken",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "secretsmanager:GetSecretValue",
        "ssm:GetParameter",
        "ssm:GetParameters",
    }
    managed = [synth.render(arn) for arn in synth.props(role["Ref"])["ManagedPolicyArns"]]
    assert managed == ["arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore"]


def test_outputs(synth: Synth) -> None:
    outputs = set(synth.doc["Outputs"])
    assert {"IntakeBucketName", "EventBusName", "LaunchTemplates"} <= outputs
    assert {f"{t.construct_id}Name" for t in topology.TABLES} <= outputs
    assert {f"{s.construct_id}Arn" for s in topology.STATE_MACHINES} <= outputs


# -- context -----------------------------------------------------------------------------------


LAYER_ARN = (
    "arn:aws:lambda:eu-west-1:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-x86_64:21"
)


def test_config_parses_cli_strings() -> None:
    config = GpuFleetConfig.from_context(
        {
            "vpc_id": "vpc-0a1b2c3d4e5f60718",
            "subnet_ids": "subnet-0a1b2c3d4e5f60718, subnet-1a1b2c3d4e5f60718",
            "root_volume_gib": "500",
            "intra_fleet_traffic": "false",
            "checkpoint_uri": "s3://my-ckpt/team-a/",
            "powertools_layer_arn": LAYER_ARN,
        }
    )
    assert config.subnet_ids == ("subnet-0a1b2c3d4e5f60718", "subnet-1a1b2c3d4e5f60718")
    assert config.root_volume_gib == 500
    assert config.intra_fleet_traffic is False
    assert config.powertools_layer_arn == LAYER_ARN
    assert config.checkpoints is not None
    assert (config.checkpoints.bucket, config.checkpoints.prefix) == ("my-ckpt", "team-a")
    assert not config.uses_placeholder_network
    assert GpuFleetConfig.from_context({}).uses_placeholder_network


@pytest.mark.parametrize(
    "context",
    [
        {"vpc_id": "vpc-xyz"},
        {"subnet_ids": "subnet-0a1b2c3d4e5f60718,sg-123"},
        {"log_retention_days": "31"},
        {"root_volume_gib": "big"},
        {"intra_fleet_traffic": "maybe"},
        {"checkpoint_uri": "https://example.com/x"},
        {"bus_name": "default"},
        {"powertools_layer_arn": "arn:aws:lambda:eu-west-1:017000801446:function:f"},
        {"powertools_layer_arn": "AWSLambdaPowertoolsPythonV3-python312-x86_64:21"},
        {"stack_name": "1gpufleet"},
        {"stack_name": "gpu_fleet"},
        {"stack_name": "G" * 80},
    ],
)
def test_config_rejects_bad_values(context: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        GpuFleetConfig.from_context(context)


def test_a_stack_name_for_each_trust_domain() -> None:
    assert GpuFleetConfig.from_context({"stack_name": "GpuFleet-Vision"}).stack_name == (
        "GpuFleet-Vision"
    )
    assert GpuFleetConfig.from_context({}).stack_name == STACK_NAME


def test_an_unknown_context_key_is_refused_naming_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown context key 'subnet_id'.*'subnet_ids'"):
        GpuFleetConfig.check_keys(["vpc_id", "subnet_id"])
    # the CDK's own: feature flags, cached lookups, its CLI's settings
    GpuFleetConfig.check_keys(["@aws-cdk/core:checkSecretUsage", "availability-zones:1:r"])


def test_synth_refuses_an_unknown_key_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from infra.app import main

    assert main(["-c", "subnet_id=subnet-0a1b2c3d4e5f60718"]) == 2
    assert "did you mean 'subnet_ids'?" in capsys.readouterr().err


def test_every_context_key_is_in_the_deploy_guide() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text()
    # A row's first cell names one key or several: `a` / `b` / ...
    first_cells = re.findall(r"^\| (`\w+`(?: / `\w+`)*) \|", guide, flags=re.MULTILINE)
    table = {key for cell in first_cells for key in re.findall(r"`(\w+)`", cell)}
    assert {f.name for f in fields(GpuFleetConfig)} <= table


def test_the_dispatcher_runs_on_a_schedule_and_at_every_window_edge(synth: Synth) -> None:
    schedules = synth.of_type("AWS::Scheduler::Schedule")
    expressions = sorted(s["Properties"]["ScheduleExpression"] for s in schedules.values())
    # gpufleet.yaml's night window: 22:00-06:00 UTC.
    assert expressions == [
        "cron(0 22 * * ? *)",
        "cron(0 6 * * ? *)",
        "rate(1 day)",
        "rate(1 minute)",  # Dispatch
        "rate(1 minute)",  # MetricWatch
        "rate(5 minutes)",
    ]
    other_targets = {
        "rate(5 minutes)": synth.function_id(topology.RECONCILE.construct_id),
        "rate(1 day)": synth.function_id(topology.CATALOG_REFRESH.construct_id),
    }
    dispatch = synth.function_id(topology.DISPATCH.construct_id)
    watch = synth.function_id(topology.METRIC_WATCH.construct_id)
    every_minute = []
    for schedule in schedules.values():
        target = schedule["Properties"]["Target"]
        expression = schedule["Properties"]["ScheduleExpression"]
        if expression == "rate(1 minute)":
            every_minute.append(target["Arn"]["Fn::GetAtt"][0])
        else:
            expected = other_targets.get(expression, dispatch)
            assert target["Arn"] == {"Fn::GetAtt": [expected, "Arn"]}
        assert "DeadLetterConfig" in target
    assert sorted(every_minute) == sorted([dispatch, watch])


def test_placement_groups_are_created_tagged_and_deleted_only_when_tagged(synth: Synth) -> None:
    for _, statement in synth.all_statements():
        actions = set(synth.actions_of(statement))
        if actions & {"ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup"}:
            condition = statement["Condition"]["StringEquals"]
            assert condition in (
                {f"aws:RequestTag/{MANAGED}": "true"},
                {f"aws:ResourceTag/{MANAGED}": "true"},
            )
