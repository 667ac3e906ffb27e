"""The embedded account's BatchWriteItem refuses what DynamoDB refuses (more than 25 requests a
call, two requests of one key, an item over 400 KB) and writes nothing then; `batch_put` writes
any number of items, 25 a call."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.adapters.aws.transactions import MAX_BATCH_WRITE, batch_put
from gpufleet.emulator.account import Account
from tests.integration.test_emulator_transactions import table


def put(pk: str, **extra: Any) -> dict[str, Any]:
    return {"PutRequest": {"Item": {"pk": {"S": pk}, **extra}}}


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([put(str(i)) for i in range(MAX_BATCH_WRITE + 1)], "more than 25 requests"),
        ([put("same"), put("same")], "duplicates"),
        ([put("big", blob={"S": "x" * 410_000})], "maximum allowed size"),
    ],
    ids=["26 requests", "duplicate keys", "item over 400 KB"],
)
def test_batch_write_item_refuses_what_dynamodb_refuses(
    account: Account, requests: list[dict[str, Any]], message: str
) -> None:
    client = account.client("dynamodb")
    name = table(client)
    with pytest.raises(ClientError) as refused:
        client.batch_write_item(RequestItems={name: requests})
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert message in refused.value.response["Error"]["Message"]
    assert client.scan(TableName=name)["Items"] == []


def test_batch_put_writes_every_item_in_calls_of_25(account: Account) -> None:
    client = account.client("dynamodb")
    name = table(client)
    batch_put(client, name, [{"pk": {"S": f"k{i}"}} for i in range(60)])
    assert client.scan(TableName=name)["Count"] == 60
    client.batch_write_item(RequestItems={name: [put(str(i)) for i in range(MAX_BATCH_WRITE)]})
    assert client.scan(TableName=name)["Count"] == 60 + MAX_BATCH_WRITE
