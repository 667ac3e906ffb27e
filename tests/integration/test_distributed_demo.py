"""Multi-node runs for real: the distributed demos on the embedded account, whose nodes run the
real agent and DockerRuntime on the fake docker, which runs each container's command as a local
process at the node's own loopback address."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.catalog import load_bundled
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import (
    DemoResult,
    DemoScenario,
    distributed_node_loss_scenario,
    distributed_scenario,
    run_demo,
)
from gpufleet.emulator.programs.secret_proof import proof
from gpufleet.topology import JOBS_TABLE
from tests.helpers import everything_stored

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

MEETING = re.compile(r"rank (\d) of 2: meeting at ([0-9.]+):(\d+)")


def jobs_by_name(result: DemoResult) -> dict[str, dict[str, object]]:
    return {job["name"]: job for job in result.to_json()["jobs"]}


def meetings(log: list[str]) -> list[tuple[str, str]]:
    """(rank, main node's address) of each node's run, as its container printed them."""
    return [(m[1], m[2]) for line in log if (m := MEETING.match(line))]


@dataclass
class DistributedRun:
    scenario: DemoScenario
    result: DemoResult
    stored: str = ""  # everything the account held at the end (tests.helpers.everything_stored)


@pytest.fixture(scope="module")
def distributed() -> DistributedRun:
    """The distributed demo, run once for the tests of this module."""
    run = DistributedRun(distributed_scenario(), DemoResult())

    def look(account: Account) -> None:
        store = DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
        [job] = [j for j in store.list_jobs() if j.spec.name == "private-image"]
        run.stored = everything_stored(account, job.job_id)

    run.result = run_demo(run.scenario, before_teardown=look)
    return run


def test_two_nodes_meet_over_tcp_sum_their_ranks_and_a_cpu_job_runs_beside(
    distributed: DistributedRun,
) -> None:
    result = distributed.result
    assert result.completed and result.instances_running == 0
    jobs = jobs_by_name(result)
    ranks = jobs["rank-sum"]
    assert (ranks["status"], ranks["nodes"], ranks["retries"]) == ("SUCCEEDED", 2, 0)
    log = ranks["container_log"]
    assert isinstance(log, list)
    assert sorted(line for line in log if "sum of ranks" in line) == [
        "rank 0 of 2: sum of ranks 1",
        "rank 1 of 2: sum of ranks 1",
    ]
    # Both met at the main node's private IP: a loopback address of its own, not 127.0.0.1.
    (main,) = {address for _, address in meetings(log)}
    assert ipaddress.ip_address(main).is_loopback and main != "127.0.0.1"
    cpu = jobs["cpu-stage"]
    assert cpu["status"] == "SUCCEEDED"
    assert load_bundled().instance_type(str(cpu["instance_type"])).gpus == 0
    assert cpu["container_log"] == ["preprocessed on 1 CPU-only node"]


def test_a_private_ecr_image_runs_with_its_secret_and_the_value_is_stored_nowhere(
    distributed: DistributedRun,
) -> None:
    job = jobs_by_name(distributed.result)["private-image"]
    assert job["status"] == "SUCCEEDED"
    [(name, value)] = distributed.scenario.secrets.items()
    assert name == "gpufleet/demo-token"
    # The container got the value: its length and hash prefix, as the program printed them
    # after the node logged in to the account's ECR (the fake docker refuses the pull without).
    assert job["container_log"] == [proof("DEMO_TOKEN", value)]
    assert "secretsmanager:gpufleet/demo-token" in distributed.stored  # the reference is kept
    assert value not in distributed.stored  # the value in no item, manifest, history or log
    assert distributed.result.instances_running == 0


def test_a_node_lost_mid_run_fails_the_run_for_both_and_it_is_retried_as_one() -> None:
    result = run_demo(distributed_node_loss_scenario())
    assert result.completed and result.instances_running == 0  # every instance released
    ranks = jobs_by_name(result)["rank-sum"]
    assert (ranks["status"], ranks["retries"], ranks["attempts"]) == ("SUCCEEDED", 1, 2)
    log = ranks["container_log"]
    assert isinstance(log, list)
    # The retry ran both nodes again, on new instances: both met at its main node's address
    # (the lost run may have got as far, or not, when its node died).
    runs = meetings(log)
    retry_main = runs[-1][1]
    assert sorted(rank for rank, address in runs if address == retry_main) == ["0", "1"]
