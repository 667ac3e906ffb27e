"""Metric actions at sweep scale: CloudWatch calls per job launched, and per minute at 10,000
running jobs, counted on the embedded AWS account (the control plane's own calls).

1. Launch: jobs go through the happy path (intake, launch, run, release) with the schedules
   quiet: every CloudWatch call the control plane makes for them, per job launched. Per-job
   alarms made 3 to 5 `PutMetricAlarm` per launch (and a `DeleteAlarms` per release), at
   CloudWatch's 3 a second for the whole account: hours to arm a sweep of 10,000.
2. A minute at 10,000 running jobs: one MetricWatch pass (the real handler, invoked as its
   schedule invokes it every minute) over 10,000 RUNNING jobs in the jobs table: its
   `GetMetricData` calls (at most 500 queries each) and its seconds.

    python scripts/bench_metric_actions.py [--launches N] [--running N]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path

from gpufleet.adapters.aws.job_store import job_to_item
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.scaling import job_alarm_rules
from gpufleet.domain.spec import JobSpec, parse_spec
from gpufleet.emulator.account import ACCOUNT_ID, embedded_account
from gpufleet.emulator.demo import DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.emulator.patches import CONTROL_PLANE, acting_as, invoke_async
from gpufleet.emulator.scheduler import ScheduleRunner
from gpufleet.topology import JOBS_TABLE, METRIC_WATCH

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = ROOT / "events" / "jobs" / "resnet-baseline.yaml"
NOW = time.time()
PUT_METRIC_ALARM_RATE = 3.0  # a second, per account and region (CloudWatch service quotas)


def cloudwatch_per_launch(jobs: int) -> Counter[str]:
    """The control plane's CloudWatch calls over `jobs` happy-path jobs, by operation."""
    original_tick = ScheduleRunner.tick

    def tick(self: ScheduleRunner) -> None:
        """The schedules stay quiet: MetricWatch's passes are counted per minute, below."""

    ScheduleRunner.tick = tick  # type: ignore[method-assign]
    try:
        result = run_demo(
            DemoScenario(
                name="metric-actions",
                submissions=[
                    Submission("s3", SPEC_FILE, copy_as=f"job-{i}.yaml") for i in range(jobs)
                ],
                nodes=NodeScenario(
                    boot_seconds=1.0, behaviours={"resnet-baseline": Behaviour(3.0, 0)}
                ),
                timeout_seconds=180.0 + 10.0 * jobs,
            )
        )
    finally:
        ScheduleRunner.tick = original_tick  # type: ignore[method-assign]
    launched = [j for j in result.jobs if j["status"] == "SUCCEEDED"]
    if not result.completed or len(launched) != jobs:
        raise SystemExit(f"the happy path did not complete: {result.to_json()}")
    return Counter(c.operation for c in result.calls if c.service == "cloudwatch")


def _running(index: int, spec: JobSpec) -> Job:
    placement = Placement(
        instance_ids=[f"i-{index:017x}"],
        instance_type="g5.xlarge",
        capacity_type="spot",
        hourly_usd=0.5,
        launched_at=NOW,
    )
    return Job(
        job_id=f"j-{index:020x}",
        status=JobStatus.RUNNING,
        spec=spec,
        source="bench",
        created_at=NOW - index,
        updated_at=NOW,
        placement=placement,
    )


def one_pass(running: int) -> tuple[Counter[str], float]:
    """One MetricWatch pass over `running` RUNNING jobs: the control plane's CloudWatch calls
    by operation, and the pass's seconds."""
    spec = parse_spec(SPEC_FILE.read_text())
    with embedded_account() as account:
        dynamodb = account.client("dynamodb")
        table = account.table_names[JOBS_TABLE.construct_id]
        jobs = [_running(index, spec) for index in range(running)]
        for start in range(0, running, 25):
            requests = [{"PutRequest": {"Item": job_to_item(j)}} for j in jobs[start : start + 25]]
            dynamodb.batch_write_item(RequestItems={table: requests})
        account.recorder.reset()
        account.recorder.calls.clear()
        arn = account.function_arns[METRIC_WATCH.construct_id]
        began = time.perf_counter()
        with acting_as(CONTROL_PLANE):
            assert invoke_async(ACCOUNT_ID, arn, {"source": "aws.scheduler"})
        seconds = time.perf_counter() - began
        [watch] = [
            i for i in account.recorder.invocations if i.function_name.endswith("MetricWatch")
        ]
        if watch.errored:
            raise SystemExit("the MetricWatch pass failed")
        calls = Counter(c.operation for c in account.recorder.calls if c.service == "cloudwatch")
        return calls, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=3, help="jobs launched (default 3)")
    parser.add_argument("--running", type=int, default=10_000, help="running jobs (10,000)")
    args = parser.parse_args()

    launched = cloudwatch_per_launch(args.launches)
    print(f"metric actions: CloudWatch calls of the control plane ({args.launches} launches)")
    print(f"  per job launched       {sum(launched.values()) / args.launches:6.1f}   (target 0)")
    print(f"    by API: {dict(launched) or 'none'}")

    calls, seconds = one_pass(args.running)
    per_minute = sum(calls.values())
    print(f"  per minute at {args.running:,} running jobs (one MetricWatch pass)")
    print(f"    calls                {per_minute:6d}   (bounded: 500 series a GetMetricData)")
    print(f"    by API: {dict(calls)}")
    print(f"    pass seconds         {seconds:6.1f}   (embedded account, in-process)")
    alarms = len(job_alarm_rules(parse_spec(SPEC_FILE.read_text()), MetricPolicy()))
    arm = math.ceil(args.running * alarms / PUT_METRIC_ALARM_RATE)
    print(
        f"  per-job alarms instead: {alarms} PutMetricAlarm a launch, {arm:,} s "
        f"({arm / 3600:.1f} h) to arm {args.running:,} jobs at 3 a second"
    )


if __name__ == "__main__":
    main()
