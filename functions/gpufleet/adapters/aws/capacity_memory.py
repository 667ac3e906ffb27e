"""Capacity memory on DynamoDB, shared by every Lambda.

One item per offering that failed for capacity, under the region's partition, with an expiry
time. DynamoDB's TTL deletes expired items lazily (hours later), so expiry is checked here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.adapters.aws.transactions import write


class DynamoCapacityMemory:
    def __init__(self, client: Any, table_name: str, region: str) -> None:
        self._client = client
        self._table = table_name
        self._region = region

    def remember(self, keys: Iterable[str], until: float) -> None:
        for key in sorted(set(keys)):
            write(
                self._client.put_item,
                TableName=self._table,
                Item={
                    "region": {"S": self._region},
                    "offering": {"S": key},
                    "expires_at": {"N": str(int(until))},
                },
            )

    def unavailable(self, now: float) -> frozenset[str]:
        keys: set[str] = set()
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#region = :region",
            "FilterExpression": "expires_at > :now",
            "ExpressionAttributeNames": {"#region": "region"},
            "ExpressionAttributeValues": {
                ":region": {"S": self._region},
                ":now": {"N": str(int(now))},
            },
        }
        while True:
            page = self._client.query(**kwargs)
            keys.update(
                item["offering"]["S"]
                for item in page.get("Items", [])
                if float(item["expires_at"]["N"]) > now  # expiry checked here, not by TTL
            )
            if "LastEvaluatedKey" not in page:
                return frozenset(keys)
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
