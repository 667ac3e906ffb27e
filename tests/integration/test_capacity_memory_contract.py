"""Capacity memory: DynamoDB (moto, which never expires items) and in-memory behave the same."""

from __future__ import annotations

import uuid

import pytest

from gpufleet.adapters.aws.capacity_memory import DynamoCapacityMemory
from gpufleet.adapters.local.memory import InMemoryCapacityMemory
from gpufleet.emulator.account import Account
from gpufleet.ports import CapacityMemory
from gpufleet.topology import CAPACITY_TABLE


@pytest.fixture(params=["dynamodb", "memory"])
def memory(request: pytest.FixtureRequest, account: Account) -> CapacityMemory:
    if request.param == "dynamodb":
        # A region of its own per test: the table is shared by the module.
        region = f"test-{uuid.uuid4().hex[:8]}"
        return DynamoCapacityMemory(
            account.client("dynamodb"), account.table_names[CAPACITY_TABLE.construct_id], region
        )
    return InMemoryCapacityMemory()


def test_remembered_offerings_are_unavailable_until_they_expire(memory: CapacityMemory) -> None:
    memory.remember(["spot:g5.xlarge:us-east-1a", "spot:p5.48xlarge:use1-az6"], until=1000.0)
    assert memory.unavailable(999.0) == {"spot:g5.xlarge:us-east-1a", "spot:p5.48xlarge:use1-az6"}
    # Expired entries are ignored even though the table still holds them (TTL is lazy).
    assert memory.unavailable(1000.0) == frozenset()


def test_remembering_again_extends_the_memory(memory: CapacityMemory) -> None:
    memory.remember(["spot:g5.xlarge:us-east-1a"], until=100.0)
    memory.remember(["spot:g5.xlarge:us-east-1a"], until=200.0)
    assert memory.unavailable(150.0) == {"spot:g5.xlarge:us-east-1a"}


def test_nothing_remembered_means_everything_is_available(memory: CapacityMemory) -> None:
    memory.remember([], until=100.0)
    assert memory.unavailable(0.0) == frozenset()
