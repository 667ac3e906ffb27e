"""The warm pool's bookkeeping in DynamoDB: who took which warm instance, and when a launch last
asked for the pool's type. Items live in the queue table under a partition of their own:

    pk      sk                  what
    warm    demand              demand_at: when a launch last asked for the pool's type
    warm    claim#<instance>    job_id, claimed_at: the launch that took the instance

A claim is one conditional write (the item must not exist, or already name the same job), so
two launches can never take the same instance; EC2's tags follow the claim, not the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.adapters.aws.transactions import write
from gpufleet.domain.config import WarmPool
from gpufleet.errors import ConditionFailed
from gpufleet.ports import Clock
from gpufleet.topology import WARM_POOL_PARTITION as PARTITION

_DEMAND = "demand"
_CLAIM = "claim#"


@dataclass(frozen=True)
class Claim:
    job_id: str
    claimed_at: float


class DynamoWarmPool:
    def __init__(self, client: Any, table_name: str, pool: WarmPool, clock: Clock) -> None:
        self._client = client
        self._table = table_name
        self.pool = pool
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    def demand_at(self) -> float:
        """When a launch last asked for the pool's type; a pool never asked for starts now."""
        try:
            write(
                self._client.put_item,
                TableName=self._table,
                Item={**_key(_DEMAND), "demand_at": _n(self.now())},
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ConditionFailed:  # asked for before: when it last was
            item = self._client.get_item(
                TableName=self._table, Key=_key(_DEMAND), ConsistentRead=True
            )
            return float(item["Item"]["demand_at"]["N"])
        return self.now()

    def note_demand(self) -> None:
        write(
            self._client.put_item,
            TableName=self._table,
            Item={**_key(_DEMAND), "demand_at": _n(self.now())},
        )

    def claim(self, instance_id: str, job_id: str) -> bool:
        """Take the instance for the job; False when another job took it first."""
        try:
            write(
                self._client.put_item,
                TableName=self._table,
                Item={
                    **_key(_CLAIM + instance_id),
                    "job_id": {"S": job_id},
                    "claimed_at": _n(self.now()),
                },
                # The same job claiming again (a retried launch) keeps its instance.
                ConditionExpression="attribute_not_exists(pk) OR job_id = :job",
                ExpressionAttributeValues={":job": {"S": job_id}},
            )
        except ConditionFailed:
            return False
        return True

    def claims(self) -> dict[str, Claim]:
        """Every claim on record, by instance id."""
        claims: dict[str, Claim] = {}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :claim)",
            "ExpressionAttributeValues": {":pk": {"S": PARTITION}, ":claim": {"S": _CLAIM}},
            "ConsistentRead": True,
        }
        while True:
            page = self._client.query(**kwargs)
            for item in page.get("Items", []):
                claims[item["sk"]["S"][len(_CLAIM) :]] = Claim(
                    item["job_id"]["S"], float(item["claimed_at"]["N"])
                )
            if "LastEvaluatedKey" not in page:
                return claims
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def forget(self, instance_ids: list[str]) -> None:
        """Drop the claims of instances that are gone."""
        for instance_id in instance_ids:
            write(self._client.delete_item, TableName=self._table, Key=_key(_CLAIM + instance_id))


def _key(sort_key: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": PARTITION}, "sk": {"S": sort_key}}


def _n(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}
