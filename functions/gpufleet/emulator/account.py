"""An embedded AWS account: moto in-process, holding the same resources as the CDK stack.

Everything is created from `gpufleet.topology`, the description the stack is synthesized from,
and the state machine runs the very ASL file CDK deploys. Handlers run in-process (`patches`
holds every place where moto is patched, and why), so a job goes through real boto3 calls, real
DynamoDB conditional writes, the real Step Functions interpreter and real CreateFleet calls,
offline.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import warnings
import zipfile
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet import topology
from gpufleet.adapters.aws.runtime import new_session
from gpufleet.domain.boot import BootTarget, network_interfaces, template_keys
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import ConfigFileError, FleetConfig, config_from_yaml, config_to_env
from gpufleet.domain.notify import notified_teams, teams_with_emails, topics_outside
from gpufleet.domain.tenancy import job_session_statements
from gpufleet.emulator import account_baseline
from gpufleet.emulator.clock import EmulatorClock, WallClock
from gpufleet.emulator.ec2_rules import Ec2Rules
from gpufleet.emulator.patches import (
    EMULATOR,
    EXECUTION_ENDED,
    EXECUTION_STOPPED,
    Installed,
    Recorder,
    acting_as,
    install,
)
from gpufleet.emulator.throttling import BucketQuota, StepFunctionsRateLimits, start_execution_quota

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
BUS_NAME = "gpufleet"
BUCKET_NAME = "gpufleet-intake-123456789012"
# The embedded deployment's checkpoint location (the stack's `checkpoint_uri`): the samples
# keep their checkpoints under its team folders. The bucket is the operator's (the stack makes
# none), made here with the account.
CHECKPOINT_BUCKET = "gpufleet-checkpoints"
CHECKPOINT_URI = f"s3://{CHECKPOINT_BUCKET}"
# The role the node agent opens each job's session of (the stack's job role), held to the
# stack's own policy for it (`job_sessions`).
JOB_ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/gpufleet-job"
CONFIG_FILE = Path(__file__).resolve().parents[3] / "gpufleet.yaml"
# moto ships real AMI ids (and their architectures): one per architecture stands for every
# image of that architecture (the stack's BOOT_IMAGES).
AMI_BY_ARCH = {"x86_64": "ami-12c6146b", "arm64": "ami-0e9271c829888680e"}

# The emulator's own settings: short waits so a demo finishes in seconds.
EMULATOR_ENV = {
    "GPUFLEET_RETRY_WAIT_SECONDS": "2",
    "GPUFLEET_MAX_LAUNCH_ATTEMPTS": "6",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_SERVICE_NAME": "gpufleet",
    "POWERTOOLS_METRICS_NAMESPACE": "GpuFleet",
    "POWERTOOLS_DEV": "false",
}


@dataclass
class Account:
    """Handles on the resources of the running account."""

    region: str
    recorder: Recorder
    # EC2's rules the account holds (its capacity reservations among them).
    ec2_rules: Ec2Rules
    # Step Functions' StartExecution bucket, with the calls it let through and throttled.
    start_executions: StepFunctionsRateLimits
    table_names: dict[str, str] = field(default_factory=dict)
    function_arns: dict[str, str] = field(default_factory=dict)
    state_machine_arns: dict[str, str] = field(default_factory=dict)
    bucket: str = BUCKET_NAME
    bus: str = BUS_NAME
    # Launch template id by template key, as the stack's ENV_LAUNCH_TEMPLATES.
    launch_templates: dict[str, str] = field(default_factory=dict)
    subnet_ids: list[str] = field(default_factory=list)
    config: FleetConfig = field(default_factory=FleetConfig)
    notify_topic_arn: str = ""
    # The topic of each team with e-mail addresses in the config (topology.ENV_TEAM_TOPICS).
    team_topics: dict[str, str] = field(default_factory=dict)
    # What the account's nodes, loops and heartbeat timeouts wait on (`clock`).
    clock: EmulatorClock = field(default_factory=WallClock)

    def client(self, service: str) -> Any:
        return new_session().client(service, region_name=self.region)

    def function_environment(self, function: topology.Function) -> dict[str, str]:
        """The deployment variables of one function, as the stack sets them."""
        everything = self.environment()
        return {name: everything[name] for name in topology.environment_of(function)}

    def environment(self) -> dict[str, str]:
        """Every deployment variable: the handlers run in this one process, so it holds the
        union of what the functions get."""
        env = {table.env_var: self.table_names[table.construct_id] for table in topology.TABLES}
        env.update(
            {
                topology.ENV_EVENT_BUS: self.bus,
                topology.ENV_INTAKE_BUCKET: self.bucket,
                topology.ENV_STATE_MACHINE: self.state_machine_arns.get(
                    topology.JOB_LIFECYCLE.construct_id, ""
                ),
                topology.ENV_LAUNCH_TEMPLATES: topology.launch_templates_value(
                    self.launch_templates
                ),
                topology.ENV_SUBNETS: ",".join(self.subnet_ids),
                topology.ENV_CONFIG: config_to_env(self.config),
                topology.ENV_NOTIFY_TOPIC: self.notify_topic_arn,
                topology.ENV_TEAM_TOPICS: topology.pairs_value(self.team_topics),
                topology.ENV_ACCOUNT: ACCOUNT_ID,
                topology.ENV_CHECKPOINT_URI: CHECKPOINT_URI,
                topology.ENV_ROOT_VOLUME: str(ROOT_VOLUME_GIB),
                "AWS_REGION": self.region,
            }
        )
        return env


# The stack's default root volume (infra/config.py `root_volume_gib`).
ROOT_VOLUME_GIB = 200


def _write_log(log_group: str, text: str) -> None:
    """Store a handler's output in its CloudWatch log group (through the backend: not an API
    call of the control plane)."""
    if not text:
        return
    from moto.core.utils import unix_time_millis
    from moto.logs.models import logs_backends

    backend = logs_backends[ACCOUNT_ID][REGION]
    if log_group not in backend.groups:
        backend.create_log_group(log_group, {})
    stream = "emulator"
    if stream not in backend.groups[log_group].streams:
        backend.create_log_stream(log_group, stream)
    lines = [line for line in text.splitlines() if line.strip()]
    backend.put_log_events(
        log_group,
        stream,
        [{"timestamp": int(unix_time_millis()), "message": line} for line in lines],
    )


def repository_config() -> FleetConfig:
    """The policy config the demo runs with: the repository's gpufleet.yaml."""
    return config_from_yaml(CONFIG_FILE.read_text(encoding="utf-8"))


@contextmanager
def embedded_account(
    extra_env: Mapping[str, str] | None = None,
    config: FleetConfig | None = None,
    clock: EmulatorClock | None = None,
    start_execution: BucketQuota | None = None,
    lost_block_warnings: Collection[str] = (),
) -> Iterator[Account]:
    """Start moto, create the stack's resources, and patch in the real handlers. The account's
    timers run on `clock` (the wall clock when not given); StartExecution is throttled at
    `start_execution` (Step Functions' bucket of the region when not given); the expiration
    warnings of the Capacity Blocks in `lost_block_warnings` are lost on their way."""
    from moto import mock_aws

    from gpufleet.emulator.capacity_blocks import CapacityBlockEnds

    saved_env = dict(os.environ)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
            "MOTO_ACCOUNT_ID": ACCOUNT_ID,
            **EMULATOR_ENV,
            **(extra_env or {}),
        }
    )
    # The interpreter logs every Fail state as an error; the execution history already says it.
    logging.getLogger("moto.stepfunctions.parser").setLevel(logging.CRITICAL)
    # Powertools warns when a function flushes no metrics; in the emulator that is noise.
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    recorder = Recorder()
    mock = mock_aws(config={"stepfunctions": {"execute_state_machine": True}})
    mock.start()
    patches: Installed | None = None
    block_ends: CapacityBlockEnds | None = None
    try:
        clock = clock or WallClock()
        # All or nothing: it undoes itself if it fails.
        patches = install(
            recorder, _write_log, clock, start_execution or start_execution_quota(REGION)
        )
        with acting_as(EMULATOR):
            account = _create_resources(patches, config or repository_config(), clock)
            patches.ec2_rules.hold(account.config.reservations)  # the account's own
            patches.job_sessions.govern(
                JOB_ROLE_ARN,
                job_session_statements(
                    f"arn:aws:s3:::{account.bucket}", f"arn:aws:s3:::{CHECKPOINT_BUCKET}"
                ),
            )
            # Handlers read their settings from the environment at cold start, as in Lambda.
            os.environ.update(account.environment())
        # EC2 ends the Capacity Blocks' instances on its own, as it does in AWS.
        block_ends = CapacityBlockEnds(account, lost_warnings=lost_block_warnings)
        block_ends.start()
        yield account
        # The workflows stopped below are the account's end, no job's: moto's own stop, and
        # no event of it.
        patches.remove(EXECUTION_ENDED, EXECUTION_STOPPED)
        with acting_as(EMULATOR):
            _stop_executions(account)
    finally:
        if block_ends is not None:
            block_ends.stop()
        if patches is not None:
            patches.remove()
        mock.stop()
        _forget_cold_starts()
        os.environ.clear()
        os.environ.update(saved_env)


# A just-started execution's thread gets its environment in far less than 50 x 0.05 s.
_STOP_TRIES = 50


def _stop_executions(account: Account) -> None:
    """Workflows still running (waiting for a task token, in a Wait state) run on moto's
    interpreter threads: stopped here, none outlives the account and calls AWS for real."""
    sfn = account.client("stepfunctions")
    for arn in account.state_machine_arns.values():
        for page in sfn.get_paginator("list_executions").paginate(
            stateMachineArn=arn, statusFilter="RUNNING"
        ):
            for execution in page["executions"]:
                _stop_execution(sfn, execution["executionArn"])


def _stop_execution(sfn: Any, arn: str) -> None:
    """Stop one execution. moto (5.2) sets an execution's interpreter environment on the
    execution's own thread once it runs: a stop that comes first raises AttributeError from
    inside moto (`ExecutionWorker.stop`), so it is tried again once that thread is under way."""
    for _ in range(_STOP_TRIES):
        try:
            sfn.stop_execution(executionArn=arn)
            return
        except AttributeError:
            time.sleep(0.05)
    sfn.stop_execution(executionArn=arn)


def _forget_cold_starts() -> None:
    """Services are cached per cold start; a new account is a new cold start. The handler
    modules keep nothing of an account: what holds a client (the ports, the idempotency layer)
    is built by the first event, and forgotten here."""
    from gpufleet.handlers import common

    for cached in (
        common.settings,
        common.ports,
        common.intake,
        common.lifecycle,
        common.dispatcher,
        common.reconciler,
        common.backstop,
        common.metric_watch,
        common.status_notifications,
        common.idempotency_store,
    ):
        cached.cache_clear()


def _create_resources(patches: Installed, config: FleetConfig, clock: EmulatorClock) -> Account:
    account = Account(
        region=REGION,
        recorder=patches.recorder,
        ec2_rules=patches.ec2_rules,
        start_executions=patches.start_executions,
        config=config,
        clock=clock,
    )
    dynamodb = account.client("dynamodb")
    for table in topology.TABLES:
        name = f"gpufleet-{table.construct_id}"
        dynamodb.create_table(**table_definition(table, name))
        if table.ttl_attribute:
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": table.ttl_attribute},
            )
        account.table_names[table.construct_id] = name

    ec2 = account.client("ec2")
    account.subnet_ids = _default_subnets(ec2)
    # What the launch tags, as the stack's templates do (EC2 holds a launch to them).
    tagged = [
        {"ResourceType": kind, "Tags": [{"Key": topology.TAG_MANAGED, "Value": "true"}]}
        for kind in topology.TAGGED_AT_LAUNCH
    ]
    account.launch_templates = _launch_templates(ec2, tagged)

    role_arn = account.client("iam").create_role(
        RoleName="gpufleet-emulator",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]

    events = account.client("events")
    events.create_event_bus(Name=account.bus)
    sns = account.client("sns")
    account.notify_topic_arn = sns.create_topic(Name="gpufleet-alerts")["TopicArn"]
    outside = topics_outside(config.teams, ACCOUNT_ID, REGION)
    if outside:  # as the stack's synth: the notifier could not publish there
        raise ConfigFileError(f"teams' notify topics outside the account: {outside}")
    # As the stack: a topic per team with e-mail addresses, each address subscribed to it.
    for team in teams_with_emails(config.teams):
        name = f"gpufleet-{topology.team_topic_id(team)}"
        topic = sns.create_topic(Name=name)["TopicArn"]
        for address in config.teams[team].emails:
            sns.subscribe(TopicArn=topic, Protocol="email", Endpoint=address)
        account.team_topics[team] = topic

    lambda_client = account.client("lambda")
    placeholder_code = _placeholder_zip()
    for function in topology.FUNCTIONS:
        account.function_arns[function.construct_id] = lambda_client.create_function(
            FunctionName=f"gpufleet-{function.construct_id}",
            Runtime="python3.12",
            Role=role_arn,
            Handler=function.handler,
            Code={"ZipFile": placeholder_code},
            Timeout=function.timeout_seconds,
            MemorySize=function.memory_mb,
        )["FunctionArn"]

    sfn = account.client("stepfunctions")
    for machine in topology.STATE_MACHINES:
        account.state_machine_arns[machine.construct_id] = sfn.create_state_machine(
            name=f"gpufleet-{machine.construct_id}",
            definition=substitute(machine, account.function_arns),
            roleArn=role_arn,
            type="STANDARD",
        )["stateMachineArn"]

    for function in topology.FUNCTIONS:
        lambda_client.update_function_configuration(
            FunctionName=account.function_arns[function.construct_id],
            Environment={"Variables": account.function_environment(function)},
        )

    for rule in topology.rules(notified_teams(config.teams)):
        bus = "default" if rule.on_default_bus else account.bus
        events.put_rule(
            Name=rule.construct_id,
            EventBusName=bus,
            EventPattern=json.dumps(rule.pattern),
            Description=rule.description,
        )
        events.put_targets(
            Rule=rule.construct_id,
            EventBusName=bus,
            Targets=[{"Id": "target", "Arn": account.function_arns[rule.target_function]}],
        )

    s3 = account.client("s3")
    s3.create_bucket(Bucket=account.bucket)
    s3.create_bucket(Bucket=CHECKPOINT_BUCKET)
    s3.put_bucket_versioning(Bucket=account.bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_notification_configuration(
        Bucket=account.bucket,
        NotificationConfiguration={
            "LambdaFunctionConfigurations": [
                {
                    "Id": "intake",
                    "LambdaFunctionArn": account.function_arns[
                        topology.INTAKE_FROM_S3.construct_id
                    ],
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {
                        "Key": {
                            "FilterRules": [{"Name": "prefix", "Value": topology.INTAKE_PREFIX}]
                        }
                    },
                }
            ]
        },
    )
    account_baseline.populate(account, AMI_BY_ARCH)
    return account


def _launch_templates(ec2: Any, tagged: list[dict[str, Any]]) -> dict[str, str]:
    """One launch template per template key of the stack's boot images, as the stack makes
    them: the image of the target's architecture, the EFA interfaces of its width."""
    group = ec2.describe_security_groups(GroupNames=["default"])["SecurityGroups"][0]["GroupId"]
    targets = frozenset(BootTarget.parse(image.target) for image in topology.BOOT_IMAGES)
    templates = {}
    for key in template_keys(load_bundled().instance_types(), targets):
        data: dict[str, Any] = {
            "ImageId": AMI_BY_ARCH[key.target.arch],
            "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"},
            "TagSpecifications": tagged,
        }
        if key.efa is not None:
            data["NetworkInterfaces"] = network_interfaces(key.efa, group)
        templates[key.name] = ec2.create_launch_template(
            LaunchTemplateName=f"gpufleet-node-{key.name}", LaunchTemplateData=data
        )["LaunchTemplate"]["LaunchTemplateId"]
    return templates


def table_definition(table: topology.Table, name: str) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": attribute, "AttributeType": kind}
            for attribute, kind in sorted(table.key_attributes().items())
        ],
        "KeySchema": _key_schema(table.partition_key, table.sort_key),
    }
    if table.indexes:
        definition["GlobalSecondaryIndexes"] = [
            {
                "IndexName": index.name,
                "KeySchema": _key_schema(index.partition_key, index.sort_key),
                "Projection": {"ProjectionType": "ALL"},
            }
            for index in table.indexes
        ]
    return definition


def _key_schema(partition_key: str, sort_key: str | None) -> list[dict[str, str]]:
    schema = [{"AttributeName": partition_key, "KeyType": "HASH"}]
    if sort_key:
        schema.append({"AttributeName": sort_key, "KeyType": "RANGE"})
    return schema


def substitute(machine: topology.StateMachine, function_arns: Mapping[str, str]) -> str:
    definition = machine.definition()
    for placeholder, construct_id in machine.function_substitutions.items():
        definition = definition.replace("${" + placeholder + "}", function_arns[construct_id])
    return definition


def _default_subnets(ec2: Any) -> list[str]:
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets["Subnets"]}
    return [by_zone[zone] for zone in sorted(by_zone)]


def _placeholder_zip() -> bytes:
    """moto wants a code bundle; the handler itself is imported from this package."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("README.txt", "gpufleet handlers run in-process in the emulator\n")
    return buffer.getvalue()
