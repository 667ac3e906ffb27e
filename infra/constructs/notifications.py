"""Alerts for the people who run the fleet: one SNS topic (subscribe your e-mail or pager).

The topic is encrypted with a key of its own: CloudWatch alarms cannot publish to a topic under
the AWS-managed key `alias/aws/sns`, whose policy names no service. CloudWatch is the one AWS
service that publishes to it; the functions that alert are granted `PUBLISH_KEY_ACTIONS` on the
key with the topic (functions.py).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

from constructs import Construct

CLOUDWATCH = iam.ServicePrincipal("cloudwatch.amazonaws.com")
# What SNS asks KMS for, with the publisher's permissions, to encrypt a message.
PUBLISH_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
# What the SNS documentation has a key policy grant an AWS service that publishes to the topic.
SERVICE_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey*")


class Notifications(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "AlertsKey",
            description="gpufleet: encrypts the alerts topic",
            enable_key_rotation=True,
            # The topic holds messages only until they are delivered: nothing to keep the key
            # for once the stack is gone.
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[CLOUDWATCH],
                actions=list(SERVICE_KEY_ACTIONS),
                resources=["*"],
            )
        )
        self.topic = sns.Topic(
            self,
            "Alerts",
            display_name="gpufleet alerts",
            master_key=self.key,
            enforce_ssl=True,
        )
        # A topic policy replaces the default one, which let the account's services publish.
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[CLOUDWATCH],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                },
            )
        )
