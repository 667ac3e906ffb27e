"""The DynamoDB tables of `gpufleet.topology.TABLES`."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam

from constructs import Construct
from gpufleet import topology


def _string(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


class JobStore(Construct):
    """One on-demand table per topology entry: PITR, KMS encryption, TTL, the topology's GSIs."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.tables: dict[str, dynamodb.Table] = {}
        self._specs: dict[str, topology.Table] = {}
        for spec in topology.TABLES:
            table = dynamodb.Table(
                self,
                spec.construct_id,
                partition_key=_string(spec.partition_key),
                sort_key=_string(spec.sort_key) if spec.sort_key else None,
                billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
                point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True
                ),
                encryption=dynamodb.TableEncryption.AWS_MANAGED,
                time_to_live_attribute=spec.ttl_attribute,
                deletion_protection=True,
            )
            for index in spec.indexes:
                table.add_global_secondary_index(
                    index_name=index.name,
                    partition_key=_string(index.partition_key),
                    sort_key=_string(index.sort_key) if index.sort_key else None,
                    projection_type=dynamodb.ProjectionType.ALL,
                )
            self.tables[spec.construct_id] = table
            self._specs[spec.construct_id] = spec

    def environment(self) -> dict[str, str]:
        """Each table's environment variable -> its name, for every function."""
        return {self._specs[cid].env_var: table.table_name for cid, table in self.tables.items()}

    def table_and_index_arns(self, construct_id: str) -> list[str]:
        """The table ARN and one ARN per index, by name: no `index/*` wildcard."""
        table = self.tables[construct_id]
        spec = self._specs[construct_id]
        return [table.table_arn] + [f"{table.table_arn}/index/{i.name}" for i in spec.indexes]

    def items_statement(
        self,
        sid: str,
        construct_id: str,
        actions: Collection[str],
        leading_keys: Sequence[str] = (),
    ) -> iam.PolicyStatement:
        """Some DynamoDB item operations (`GetItem`, `UpdateItem`, ...) on one table, and `Query`
        on its indexes (on the table itself when it has none); `leading_keys` limits them to
        those partitions."""
        table = self.tables[construct_id]
        indexes = self.table_and_index_arns(construct_id)[1:]
        resources = [table.table_arn] if set(actions) - {"Query"} or not indexes else []
        if "Query" in actions:
            resources += indexes
        conditions = (
            {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": list(leading_keys)}}
            if leading_keys
            else None
        )
        return iam.PolicyStatement(
            sid=sid,
            actions=[f"dynamodb:{action}" for action in sorted(actions)],
            resources=resources,
            conditions=conditions,
        )

    def idempotency_statement(self, construct_id: str) -> iam.PolicyStatement:
        """What the Powertools idempotency persistence layer calls, on that table only."""
        return iam.PolicyStatement(
            sid=f"Idempotency{construct_id}",
            actions=[
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
            ],
            resources=[self.tables[construct_id].table_arn],
        )
