"""Alerts for the people who run the fleet: one SNS topic (subscribe your e-mail or pager)."""

from __future__ import annotations

from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

from constructs import Construct


class Notifications(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.topic = sns.Topic(
            self,
            "Alerts",
            display_name="gpufleet alerts",
            # Encrypted with the AWS-managed SNS key; publishers need no key grant.
            master_key=kms.Alias.from_alias_name(self, "SnsKey", "alias/aws/sns"),
            enforce_ssl=True,
        )
