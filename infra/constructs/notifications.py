"""Alerts for the people who run the fleet: one SNS topic (subscribe your e-mail or pager); and
a topic per team whose gpufleet.yaml entry names e-mail addresses (`teams.<team>.notify`), each
address subscribed to it, where the Notify function tells the team of its jobs' status changes
(docs/notifications.md).

The topic is encrypted with a key of its own: CloudWatch alarms cannot publish to a topic under
the AWS-managed key `alias/aws/sns`, whose policy names no service. CloudWatch is the one AWS
service that publishes to it; the functions that alert are granted `PUBLISH_KEY_ACTIONS` on the
key with the topic (functions.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.notify import TeamNotify, named_topics, teams_with_emails, topics_outside

CLOUDWATCH = iam.ServicePrincipal("cloudwatch.amazonaws.com")
# What SNS asks KMS for, with the publisher's permissions, to encrypt a message.
PUBLISH_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
# What the SNS documentation has a key policy grant an AWS service that publishes to the topic.
SERVICE_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey*")


class Notifications(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, teams: Mapping[str, TeamNotify]
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        if not Token.is_unresolved(stack.account) and not Token.is_unresolved(stack.region):
            outside = topics_outside(teams, stack.account, stack.region)
            if outside:
                raise ValueError(
                    f"gpufleet.yaml teams name SNS topics of another account or region: "
                    f"{outside}; the Notify function publishes in {stack.account} "
                    f"{stack.region} only"
                )
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
        # The teams' own topics: under the same key (the Notify function is granted its use),
        # TLS only (the topic policy denies the rest); the account's principals publish as IAM
        # allows them, and only the Notify function's role is granted sns:Publish on them.
        self.team_topics: dict[str, sns.Topic] = {}
        for team in teams_with_emails(teams):
            topic = sns.Topic(
                self,
                topology.team_topic_id(team),
                display_name=f"gpufleet {team}"[:100],
                master_key=self.key,
                enforce_ssl=True,
            )
            for address in teams[team].emails:
                topic.add_subscription(subscriptions.EmailSubscription(address))
            self.team_topics[team] = topic
        # What Notify may publish to: the teams' own topics and those gpufleet.yaml names.
        self.notify_topic_arns: list[str] = [
            *(topic.topic_arn for topic in self.team_topics.values()),
            *named_topics(teams),
        ]

    def team_topics_value(self) -> str:
        """topology.ENV_TEAM_TOPICS's value."""
        return topology.pairs_value({t: topic.topic_arn for t, topic in self.team_topics.items()})
