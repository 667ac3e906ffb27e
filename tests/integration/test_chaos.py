"""Chaos on the embedded account (docs/chaos.md): jobs under duplicated and reordered events,
spot capacity errors and interruptions, crashing handlers, DynamoDB throttling and racing
dispatchers. The invariants are judged from the outside; the fault injectors are tested too."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.retries.standard import ExponentialBackoff

from gpufleet.adapters.aws.runtime import client as control_plane_client
from gpufleet.emulator.chaos import (
    ChaosConfig,
    ChaosResult,
    ChaoticDelivery,
    Ec2Ledger,
    plan_workload,
    run_chaos,
)
from gpufleet.emulator.faults import (
    CrashAfterWrites,
    DynamoThrottling,
    HandlerCrashed,
    LostEvents,
    injected,
)
from gpufleet.emulator.patches import CONTROL_PLANE, acting_as
from gpufleet.topology import DETAIL_NODE_FINISHED

SEEDS = (1, 2)
JOBS = 10


# Whole chaos runs on the embedded account, against the wall clock (the account's handlers,
# timers and simulated nodes run in real time): opt-in (`make realtime`), outside `make test`.
@pytest.fixture(scope="module")
def runs() -> dict[int, ChaosResult]:
    return {
        seed: run_chaos(ChaosConfig(jobs=JOBS, seed=seed, timeout_seconds=120)) for seed in SEEDS
    }


@pytest.mark.realtime
def test_every_run_settles_with_every_job_terminal(runs: dict[int, ChaosResult]) -> None:
    for result in runs.values():
        assert result.completed
        assert result.terminal == JOBS


@pytest.mark.realtime
def test_no_submission_is_lost(runs: dict[int, ChaosResult]) -> None:
    assert {seed: r.lost for seed, r in runs.items()} == {seed: [] for seed in SEEDS}


@pytest.mark.realtime
def test_no_job_ever_has_instances_of_two_launches_alive(runs: dict[int, ChaosResult]) -> None:
    assert {seed: r.double_launches for seed, r in runs.items()} == {seed: {} for seed in SEEDS}


@pytest.mark.realtime
def test_no_instance_is_left_running(runs: dict[int, ChaosResult]) -> None:
    assert {seed: r.leaked_instances for seed, r in runs.items()} == {seed: [] for seed in SEEDS}


@pytest.mark.realtime
def test_every_job_ends_as_its_behaviour_implies(runs: dict[int, ChaosResult]) -> None:
    assert {seed: r.wrong_status for seed, r in runs.items()} == {seed: [] for seed in SEEDS}


@pytest.mark.realtime
def test_no_submission_makes_two_jobs(runs: dict[int, ChaosResult]) -> None:
    assert {seed: r.duplicate_jobs for seed, r in runs.items()} == {seed: [] for seed in SEEDS}


@pytest.mark.realtime
def test_every_fault_was_injected(runs: dict[int, ChaosResult]) -> None:
    for result in runs.values():
        faults = result.faults
        assert faults["deliveries"] > 0 and faults["delayed_deliveries"] > 0
        assert faults["retried_deliveries"] > 0
        assert faults["spot_capacity_errors"] > 0 and faults["spot_interruptions"] > 0
        assert faults["handler_crashes"] > 0 and faults["dynamodb_throttles"] > 0
        assert faults["rival_dispatch_passes"] > 0
        # Lost events, every copy: each job still ended right (the invariants above).
        assert faults["lost_finish_reports"] > 0 and faults["lost_spot_warnings"] > 0
        assert faults["lost_state_changes"] >= 2  # an interrupted job's, an unwarned reclaim's
        # The sweep crashed Launch right after a fleet was launched, in every run.
        assert any(c.startswith("gpufleet-Launch after CreateFleet") for c in result.crashes)


# -- the parts of the harness ------------------------------------------------------------------


def test_the_workload_is_drawn_from_the_seed_alone() -> None:
    first = plan_workload(ChaosConfig(jobs=50, seed=7))
    assert first == plan_workload(ChaosConfig(jobs=50, seed=7))
    assert first != plan_workload(ChaosConfig(jobs=50, seed=8))
    outcomes = {job.expected() for job in first}
    assert ("SUCCEEDED", 0) in outcomes and len(outcomes) > 1


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _launch(ledger: Ec2Ledger, job_id: str, fleet: str, instances: list[str]) -> None:
    ledger._fleet(  # the after-call hook, as botocore calls it
        parsed={"FleetId": fleet, "Instances": [{"InstanceIds": instances}]},
        context={"chaos_job_id": job_id},
    )


def test_the_ledger_finds_two_launches_of_one_job_alive_at_once() -> None:
    clock = _Clock()
    ledger = Ec2Ledger(clock)
    _launch(ledger, "j-a", "fleet-1", ["i-1"])
    clock.now = 1.0
    ledger._termination(parsed={"TerminatingInstances": [{"InstanceId": "i-1"}]})
    _launch(ledger, "j-a", "fleet-2", ["i-2"])  # a relaunch after the release: fine
    clock.now = 2.0
    _launch(ledger, "j-b", "fleet-3", ["i-3", "i-4"])  # one launch of two nodes: fine
    _launch(ledger, "j-c", "fleet-4", ["i-5"])
    clock.now = 3.0
    _launch(ledger, "j-c", "fleet-5", ["i-6"])  # i-5 still runs: a double launch
    assert list(ledger.double_launches()) == ["j-c"]
    assert [launch["launch"] for launch in ledger.double_launches()["j-c"]] == [
        "fleet-4",
        "fleet-5",
    ]


def test_a_late_copy_and_the_retries_of_a_failed_delivery_all_run() -> None:
    config = ChaosConfig(jobs=1, seed=1, delayed_share=1.0, schedule_period_seconds=60.0)
    scheduled: list[tuple[float, Callable[[], None]]] = []  # run by hand, earliest first
    delivery = ChaoticDelivery(
        config,
        random.Random(1),
        CrashAfterWrites(0.0, 1, random.Random()),
        later=lambda delay, run: scheduled.append((delay, run)),
    )
    runs: list[int] = []

    def attempt() -> bool:
        runs.append(1)
        return False  # always fails: each copy is tried three times, then dropped

    delivery.deliver(attempt)
    assert runs == [] and len(scheduled) == config.copies_per_event  # every copy late
    waits = []
    while scheduled:
        delay, run = scheduled.pop(0)
        waits.append(delay)
        run()
    assert len(runs) == config.copies_per_event * 3
    assert delivery.dropped == config.copies_per_event and delivery.pending == 0
    # Lambda's retries: one "minute" after the first failure, two after the second.
    assert waits.count(60.0) == waits.count(120.0) == config.copies_per_event


def _crash_points(crashes: CrashAfterWrites, function: str, operations: list[str]) -> list[str]:
    """Run `function` once, making the writes named, as the after-call hook sees them."""
    ok = type("Http", (), {"status_code": 200})()
    with acting_as(CONTROL_PLANE), crashes.invocation(function):
        for operation in operations:
            try:
                crashes._after_call(
                    event_name=f"after-call.x.{operation}",
                    http_response=ok,
                    parsed={"Instances": ["i-1"]},
                    context={},
                )
            except HandlerCrashed as crash:
                return [str(crash)]
    return []


def test_the_sweep_crashes_after_every_kind_of_write_of_a_function_once() -> None:
    crashes = CrashAfterWrites(0.0, 6, random.Random(1), sweep_every=2)
    writes = ["PutObject", "CreateFleet", "UpdateItem"]
    died = [_crash_points(crashes, "Launch", writes) for _ in range(8)]
    # Runs 0, 2, 4 are the sweep's: each dies after the next kind of write; the rest live.
    assert died == [
        ["injected crash: Launch after PutObject (write 1)"],
        [],
        ["injected crash: Launch after CreateFleet (write 2)"],
        [],
        ["injected crash: Launch after UpdateItem (write 3)"],
        [],
        [],
        [],
    ]


@pytest.fixture
def dynamodb(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from moto import mock_aws

    # The SDK's backoff between attempts, not its retry decisions, is what the test skips.
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda _self, _context: 0.0)
    with mock_aws():
        boto3.client("dynamodb", region_name="us-east-1").create_table(
            TableName="t",
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield


class _Dice(random.Random):
    """Throttles the first `throttled` requests, then none."""

    def __init__(self, throttled: int) -> None:
        super().__init__(0)
        self.left = throttled

    def random(self) -> float:
        self.left -= 1
        return 0.0 if self.left >= 0 else 1.0


@pytest.mark.usefixtures("dynamodb")
def test_throttled_requests_never_reach_the_table_and_the_sdk_retries_them() -> None:
    throttling = DynamoThrottling(1.0, _Dice(throttled=2))
    with injected(throttling), acting_as(CONTROL_PLANE):
        table = control_plane_client("dynamodb", "us-east-1")  # the control plane's retry policy
        response = table.put_item(
            TableName="t",
            Item={"k": {"S": "a"}, "n": {"N": "1"}},
            ConditionExpression="attribute_not_exists(k)",  # would fail had a throttle written
        )
    assert response["ResponseMetadata"]["RetryAttempts"] == 2
    assert throttling.injected == 2


@pytest.mark.usefixtures("dynamodb")
def test_throttling_that_outlasts_the_retries_surfaces_as_dynamodbs_error() -> None:
    throttling = DynamoThrottling(1.0, _Dice(throttled=100))
    with injected(throttling), acting_as(CONTROL_PLANE):
        table = control_plane_client("dynamodb", "us-east-1")
        with pytest.raises(ClientError) as caught:
            table.put_item(TableName="t", Item={"k": {"S": "a"}})
    assert caught.value.response["Error"]["Code"] in (
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
    )
    assert throttling.injected == 6  # standard retry mode: the first attempt and 5 retries
    with acting_as(CONTROL_PLANE):
        assert "Item" not in boto3.client("dynamodb", region_name="us-east-1").get_item(
            TableName="t", Key={"k": {"S": "a"}}
        )


@pytest.mark.usefixtures("aws_env")
def test_a_lost_event_is_taken_and_delivered_nowhere_and_a_later_one_gets_through() -> None:
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runs-bucket")
        chosen, other = "j-" + "1" * 20, "j-" + "2" * 20
        for job_id, name in ((chosen, "loses-its-report"), (other, "keeps-it")):
            s3.put_object(
                Bucket="runs-bucket", Key=f"runs/{job_id}/run.json", Body=json.dumps({"name": name})
            )
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        lost = LostEvents(
            "runs-bucket",
            frozenset({DETAIL_NODE_FINISHED}),
            lambda _kind, name: name == "loses-its-report",
        )
        with injected(lost):
            # A new session: one made earlier (boto3.client's default) has no hooks.
            events = boto3.session.Session().client("events", region_name="us-east-1")
            events.put_rule(Name="r", EventPattern=json.dumps({"source": ["gpufleet.agent"]}))
            events.put_targets(Rule="r", Targets=[{"Id": "q", "Arn": arn}])
            answers = [
                events.put_events(
                    Entries=[
                        {
                            "Source": "gpufleet.agent",
                            "DetailType": DETAIL_NODE_FINISHED,
                            "Detail": json.dumps({"job_id": job_id, "copy": copy}),
                        }
                    ]
                )
                for job_id, copy in ((chosen, 1), (chosen, 2), (other, 1))
            ]
        # Every put was taken, as EventBridge answers (the agent cannot tell).
        assert [a["FailedEntryCount"] for a in answers] == [0, 0, 0]
        assert all(a["Entries"][0]["EventId"] for a in answers)
        delivered = [
            json.loads(m["Body"])["detail"]
            for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        ]
        assert sorted((d["job_id"], d["copy"]) for d in delivered) == [(chosen, 2), (other, 1)]
        assert lost.lost == {DETAIL_NODE_FINISHED: 1}


def test_the_command_takes_jobs_seed_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet.cli import build_parser, main

    args = build_parser().parse_args(["chaos", "--jobs", "300", "--seed", "7", "--json"])
    assert (args.jobs, args.seed, args.json) == (300, 7, True)
    assert main(["chaos", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
