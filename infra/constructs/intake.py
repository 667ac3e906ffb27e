"""Where jobs come in: the intake bucket, the gpufleet event bus and the topology's rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sqs as sqs

from constructs import Construct
from gpufleet import topology
from infra.config import GpuFleetConfig
from infra.constructs import nag


def dead_letter_queue(scope: Construct, construct_id: str) -> sqs.Queue:
    """An encrypted, SSL-only queue that keeps failed deliveries for the maximum 14 days."""
    return sqs.Queue(
        scope,
        construct_id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.days(14),
    )


class Intake(Construct):
    """Intake bucket (+ its access-log bucket), the custom bus, and the rules on it."""

    def __init__(self, scope: Construct, construct_id: str, *, config: GpuFleetConfig) -> None:
        super().__init__(scope, construct_id)
        self._config = config

        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # the only SSE access logging supports
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireAccessLogs",
                    expiration=Duration.days(config.access_log_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )

        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="intake/",
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireOldVersions",
                    noncurrent_version_expiration=Duration.days(config.noncurrent_version_days),
                    expired_object_delete_marker=True,
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
        )

        self.bus = events.EventBus(self, "Bus", event_bus_name=config.bus_name)
        self.rules: dict[str, events.Rule] = {}
        self.rule_dead_letter_queues: dict[str, sqs.Queue] = {}

    def connect(
        self, functions: Mapping[str, lambda_.IFunction], rules: Sequence[topology.Rule]
    ) -> None:
        """S3 uploads under `jobs/` and the topology's `rules` -> their functions."""
        self.bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(functions[topology.INTAKE_FROM_S3.construct_id]),
            s3.NotificationKeyFilter(prefix=topology.INTAKE_PREFIX),
        )
        self._acknowledge_notifications_handler()
        for spec in rules:
            dlq = dead_letter_queue(self, f"{spec.construct_id}DeadLetters")
            # cdk-nag recognizes a Lambda's DLQ but not an EventBridge target's.
            nag.acknowledge(
                dlq,
                "AwsSolutions-SQS3",
                "This queue is the dead-letter queue of the rule's target; a DLQ of a DLQ "
                "would only move the problem.",
            )
            bus = None if spec.on_default_bus else self.bus
            rule = events.Rule(
                self,
                spec.construct_id,
                description=spec.description,
                event_bus=bus,
                event_pattern=_event_pattern(spec.pattern),
            )
            rule.add_target(
                targets.LambdaFunction(
                    functions[spec.target_function],
                    dead_letter_queue=dlq,
                    retry_attempts=self._config.event_retry_attempts,
                    max_event_age=Duration.hours(self._config.event_max_age_hours),
                )
            )
            self.rules[spec.construct_id] = rule
            self.rule_dead_letter_queues[spec.construct_id] = dlq

    def _acknowledge_notifications_handler(self) -> None:
        """CDK manages bucket notifications with a singleton function at the stack's root."""
        stack = Stack.of(self)
        handlers = [
            child
            for child in stack.node.children
            if child.node.id.startswith("BucketNotificationsHandler")
        ]
        for handler in handlers:
            nag.acknowledge(
                handler,
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole]",
                "CDK's own BucketNotificationsHandler (runs only during deployments to set the "
                "bucket's notification configuration); its role only writes its own logs.",
            )


def _event_pattern(pattern: Mapping[str, object]) -> events.EventPattern:
    """The topology's pattern, verbatim: keys that EventPattern does not model go in as-is."""
    known = {
        "source": "source",
        "detail-type": "detail_type",
        "detail": "detail",
        "account": "account",
        "region": "region",
        "resources": "resources",
        "id": "id",
        "time": "time",
        "version": "version",
    }
    unknown = set(pattern) - set(known)
    if unknown:
        raise ValueError(f"event pattern keys not supported: {sorted(unknown)}")
    return events.EventPattern(**{known[key]: _matcher(value) for key, value in pattern.items()})


def _matcher(value: object) -> object:
    """A field's values, with a prefix matcher (`[{"prefix": P}]`) as EventPattern takes one."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        [(operator, operand)] = value[0].items()
        if operator != "prefix":
            raise ValueError(f"event pattern matcher not supported: {operator}")
        return events.Match.prefix(operand)
    return value
