"""Capacity Blocks and time windows on the embedded account, through the real functions: a job
goes to a block only when its expected run fits the time left, a run on a block that ends soon
checkpoints and requeues (no retry used) even when EC2's expiration warning is lost, a reserved
run is costed at the block's price and shown apart in `gpufleet cost`, and a time window's quota
and paused class hold in the dispatcher's passes and in `gpufleet queue`."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.cli import main
from gpufleet.domain.config import FleetConfig, Reservation, ReservationKind
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.queueing import QueuePolicy, QuotaOverride, TeamQuota, TimeWindow
from gpufleet.domain.reserved import drain_at, drain_lead_seconds
from gpufleet.domain.settlement import RESERVATION_ENDING
from gpufleet.domain.spec import Priority
from gpufleet.emulator.account import CHECKPOINT_URI, Account, embedded_account
from gpufleet.emulator.clock import paced_clock
from gpufleet.emulator.nodes import Behaviour, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.topology import INTAKE_PREFIX, JOBS_TABLE, RECONCILE, RECONCILE_PERIOD_SECONDS
from tests.helpers import stop_running_executions, with_passes

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

GRACE_SECONDS = 10
LEAD = drain_lead_seconds(RECONCILE_PERIOD_SECONDS, GRACE_SECONDS)
# A run on the short block has about a minute before its drain: enough for a 10 s job.
SHORT_LEFT_SECONDS = 60


def _hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def _config(now: datetime) -> FleetConfig:
    def block(
        suffix: str, end: datetime, start: datetime | None = None, instance_type: str = "g5.xlarge"
    ) -> Reservation:
        return Reservation(
            id=f"cr-0{suffix * 16}",
            kind=ReservationKind.CAPACITY_BLOCK,
            instance_type=instance_type,
            zone="us-east-1a",
            count=1,
            start=start or now - timedelta(hours=1),
            end=end,
            hourly_usd=0.5,
        )

    # The short block's id sorts first: without the fit rule it would take every job.
    short_end = now + timedelta(seconds=1800 + LEAD + SHORT_LEFT_SECONDS)
    window = TimeWindow(
        name="now",
        start=_hhmm(now - timedelta(minutes=1)),
        end=_hhmm(now + timedelta(hours=3)),
        pause=[Priority.LOW],
        teams={"nlp": QuotaOverride(gpus=8)},
    )
    return FleetConfig(
        reservations=[
            block("a", short_end),
            block("b", now + timedelta(hours=6)),
            # Tomorrow's, of L4 GPUs: a job that asks waits for it.
            block("c", now + timedelta(days=2), now + timedelta(days=1), "g6.xlarge"),
        ],
        queue=QueuePolicy(
            max_gpus=16,
            max_instances=8,
            reserve_share=0.0,
            preemption_grace_seconds=GRACE_SECONDS,
            teams={"vision": TeamQuota(gpus=4), "nlp": TeamQuota(gpus=4)},
            windows=[window],
        ),
    )


@pytest.fixture(scope="module")
def config() -> FleetConfig:
    """The blocks and the window, timed from when the module's account starts (not from when
    the module was collected: the short block has only a minute to spare)."""
    return _config(datetime.now(UTC))


@pytest.fixture(scope="module")
def account(config: FleetConfig) -> Iterator[Account]:
    scenario = NodeScenario(
        boot_seconds=0.2,
        default=Behaviour(duration_seconds=1.0),
        # Ends only by checkpointing, as its drain asks.
        behaviours={"on-short": Behaviour(duration_seconds=600.0)},
    )
    # The short block ends within EC2's 40 minutes of warning: were it delivered, it would drain
    # the block before any run lands (tests/integration/test_block_warning.py). Lost, as an
    # EventBridge event can be, it leaves the reconciler's own drain to move the run.
    short = config.reservations[0]
    with account_with_nodes(config, scenario, lost_block_warnings=[short.id]) as created:
        yield created


@contextmanager
def account_with_nodes(
    config: FleetConfig, scenario: NodeScenario, lost_block_warnings: Collection[str] = ()
) -> Iterator[Account]:
    """An embedded account on the paced clock whose nodes act out `scenario`."""
    with (
        paced_clock() as clock,
        embedded_account(
            config=config, clock=clock, lost_block_warnings=lost_block_warnings
        ) as created,
        acting_as(EMULATOR),
    ):
        nodes = NodeSimulator(created, scenario)
        nodes.start()
        yield created
        nodes.stop()
        stop_running_executions(created)


@pytest.fixture(scope="module")
def config_file(config: FleetConfig, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("config") / "gpufleet.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")))  # JSON is YAML
    return str(path)


def submit(
    account: Account, name: str, team: str, extra: str = "", resources: str = "{gpus: 1}"
) -> None:
    body = (
        f"name: {name}\nteam: {team}\nimage: img\ncommand: [x]\n"
        f"resources: {resources}\ncheckpoint: {CHECKPOINT_URI}/{team}/{name}/\n{extra}"
    )
    account.client("s3").put_object(
        Bucket=account.bucket, Key=f"{INTAKE_PREFIX}{team}/{name}.yaml", Body=body
    )


def job_named(account: Account, name: str) -> Job | None:
    store = DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])
    return next((job for job in store.list_jobs() if job.spec.name == name), None)


def placed(account: Account, name: str, status: JobStatus = JobStatus.RUNNING) -> Job:
    def look() -> Job | None:
        job = job_named(account, name)
        return job if job and job.status is status and job.placement else None

    return with_passes(account, look, f"{name} {status.value}")


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_blocks_fit_drain_and_price_and_a_windows_rules_hold(
    config: FleetConfig, account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    short, long, tomorrow = config.reservations
    submit(account, "on-short", "vision", "expected_duration: 10s\n")
    submit(account, "hour-long", "vision")  # the default estimate: an hour
    submit(account, "etl", "vision", "priority: low\n")
    # nlp's own quota is 4 GPUs: only the window's 8 holds this job (intake accepts it too).
    submit(account, "wide", "nlp", resources="{gpus: 8}")
    submit(account, "on-l4", "nlp", "wait_for_block: true\n", "{gpus: 1, gpu_models: [L4]}")

    short_run = placed(account, "on-short")
    assert short_run.placement is not None and short_run.placement.reservation_id == short.id
    # An hour does not fit the short block's minute: it goes to the long one, at its price.
    long_run = placed(account, "hour-long", JobStatus.SUCCEEDED)
    assert long_run.placement is not None
    assert (long_run.placement.reservation_id, long_run.placement.capacity_type) == (
        long.id,
        "reserved",
    )
    assert long_run.placement.hourly_usd == 0.5
    rows = cli_json(capsys, "cost", "--by", "job", "--config", config_file)["rows"]
    [line] = [row for row in rows if row["name"] == "hour-long"]
    assert line["reserved_usd"] > 0 and line["spot_usd"] == line["on_demand_usd"] == 0.0
    # Each amount is rounded to the micro-dollar on its own: the sum may be one off.
    assert line["cost_usd"] == pytest.approx(line["reserved_usd"] + line["storage_usd"], abs=2e-6)

    wide = placed(account, "wide", JobStatus.SUCCEEDED)
    assert wide.spec.resources.total_gpus == 8
    waiting = cli_json(capsys, "queue", "--config", config_file)["waiting"]
    reasons = {w["job_id"]: w["reason"] for w in waiting}
    assert reasons == {
        job_named(account, "etl").job_id: "paused",  # type: ignore[union-attr]
        job_named(account, "on-l4").job_id: "block",  # type: ignore[union-attr]
    }
    # EC2's side: tomorrow's block is scheduled, with no room before it starts.
    ec2 = account.client("ec2")
    [scheduled] = ec2.describe_capacity_reservations(CapacityReservationIds=[tomorrow.id])[
        "CapacityReservations"
    ]
    assert (scheduled["State"], scheduled["AvailableInstanceCount"]) == ("scheduled", 0)
    assert scheduled["EndDateType"] == "limited" and scheduled["StartDate"] == tomorrow.start
    [in_zone] = [
        subnet["SubnetId"]
        for subnet in ec2.describe_subnets(SubnetIds=account.subnet_ids)["Subnets"]
        if subnet["AvailabilityZone"] == tomorrow.zone
    ]
    with pytest.raises(ClientError, match="ReservationCapacityExceeded"):
        ec2.run_instances(
            LaunchTemplate={"LaunchTemplateId": account.launch_templates["x86_64-nvidia"]},
            InstanceType="g6.xlarge",
            SubnetId=in_zone,
            MinCount=1,
            MaxCount=1,
            InstanceMarketOptions={"MarketType": "capacity-block"},
            CapacityReservationSpecification={
                "CapacityReservationTarget": {"CapacityReservationId": tomorrow.id}
            },
        )

    # The short block's end comes: the reconciler asks its run to checkpoint.
    due = drain_at(short, LEAD)
    assert due is not None
    time.sleep(max(0.0, due - time.time()) + 1)
    answer = account.client("lambda").invoke(
        FunctionName=account.function_arns[RECONCILE.construct_id]
    )
    drained = json.loads(answer["Payload"].read())["reservation_drains"]
    assert drained == [short_run.job_id]

    def moved() -> Job | None:
        job = job_named(account, "on-short")
        if job is None or job.placement is None or job.placement.reservation_id == short.id:
            return None
        return job

    again = with_passes(account, moved, "the drained run's relaunch")
    # Back in the queue and relaunched off the ending block: no retry, no preemption used.
    assert again.placement is not None and again.placement.reservation_id == long.id
    assert (again.retries, again.preemptions, again.interruptions) == (0, 0, 0)
    assert again.drain_reason != RESERVATION_ENDING
    assert again.prior_capacity_usd.get("reserved", 0.0) > 0
