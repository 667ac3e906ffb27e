"""The embedded account's DynamoDB transactions are all or nothing: what a failed transaction
wrote before the item that failed is undone, item by item (the emulator's patch to moto, which
would deep-copy each table once per item); and one DynamoDB refuses (over 100 items, two
actions on one item) is refused, nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.emulator.account import Account


def table(client: Any) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    return name


def test_a_failed_transaction_leaves_every_item_as_it_was(account: Account) -> None:
    client = account.client("dynamodb")
    name = table(client)
    client.put_item(TableName=name, Item={"pk": {"S": "kept"}, "n": {"N": "1"}})
    client.put_item(TableName=name, Item={"pk": {"S": "deleted"}, "n": {"N": "2"}})
    with pytest.raises(ClientError) as failed:
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": name,
                        "Key": {"pk": {"S": "kept"}},
                        "UpdateExpression": "SET n = :n",
                        "ExpressionAttributeValues": {":n": {"N": "10"}},
                    }
                },
                {"Put": {"TableName": name, "Item": {"pk": {"S": "new"}}}},
                {"Delete": {"TableName": name, "Key": {"pk": {"S": "deleted"}}}},
                {
                    "ConditionCheck": {
                        "TableName": name,
                        "Key": {"pk": {"S": "absent"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
            ]
        )
    reasons = [r["Code"] for r in failed.value.response["CancellationReasons"]]
    assert reasons == ["None", "None", "None", "ConditionalCheckFailed"]
    items = client.scan(TableName=name)["Items"]
    assert sorted((i["pk"]["S"], i["n"]["N"]) for i in items) == [("deleted", "2"), ("kept", "1")]


def test_a_transaction_that_succeeds_writes_every_item(account: Account) -> None:
    client = account.client("dynamodb")
    name = table(client)
    client.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": name, "Item": {"pk": {"S": "a"}}}},
            {"Put": {"TableName": name, "Item": {"pk": {"S": "b"}}}},
        ]
    )
    assert sorted(i["pk"]["S"] for i in client.scan(TableName=name)["Items"]) == ["a", "b"]


def test_two_actions_on_one_item_refuse_the_transaction_and_write_nothing(
    account: Account,
) -> None:
    client = account.client("dynamodb")
    name = table(client)
    client.put_item(TableName=name, Item={"pk": {"S": "counter"}, "n": {"N": "1"}})
    add = {
        "Update": {
            "TableName": name,
            "Key": {"pk": {"S": "counter"}},
            "UpdateExpression": "ADD n :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }
    }
    with pytest.raises(ClientError) as refused:
        client.transact_write_items(
            TransactItems=[{"Put": {"TableName": name, "Item": {"pk": {"S": "new"}}}}, add, add]
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    items = client.scan(TableName=name)["Items"]
    assert [(i["pk"]["S"], i["n"]["N"]) for i in items] == [("counter", "1")]


def test_a_transaction_of_more_than_100_items_is_refused(account: Account) -> None:
    client = account.client("dynamodb")
    name = table(client)
    puts = [{"Put": {"TableName": name, "Item": {"pk": {"S": f"k{i}"}}}} for i in range(101)]
    with pytest.raises(ClientError) as refused:
        client.transact_write_items(TransactItems=puts)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert client.scan(TableName=name)["Items"] == []
    client.transact_write_items(TransactItems=puts[:100])
    assert client.scan(TableName=name, Select="COUNT")["Count"] == 100
