"""Control-plane overhead per job: Lambda invocations, DynamoDB requests and Step Functions
state transitions of the happy path, counted on the embedded AWS account, and what they cost.

A job's own work is counted: the schedules do not run here. Their passes (one admission pass a
minute, one reconcile every five, whatever the load) are a fixed cost per month, reported
apart in the README.

    python scripts/bench_overhead.py [--jobs N] [--max-gpus G]

With --max-gpus smaller than the jobs need at once, jobs wait in the queue and are admitted by
passes woken as others release: the cost of a busy fleet rather than an idle one.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain.config import FleetConfig, config_from_yaml
from gpufleet.emulator.demo import DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.emulator.scheduler import ScheduleRunner

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "events" / "jobs" / "resnet-baseline.yaml"

# US East (N. Virginia) list prices, USD.
LAMBDA_PER_REQUEST = 0.20 / 1e6
LAMBDA_PER_GB_SECOND = 0.0000166667
LAMBDA_GB = 0.25  # the functions' memory (infra/constructs/functions.py)
TRANSITION = 0.025 / 1000  # Step Functions standard workflows
DYNAMODB_WRITE_UNIT = 0.625 / 1e6  # on-demand; a transactional write costs two units per item
DYNAMODB_READ_UNIT = 0.125 / 1e6
EVENT = 1.00 / 1e6  # EventBridge custom events
S3_PUT = 0.005 / 1000
S3_GET = 0.0004 / 1000

_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


@dataclass
class Counts:
    invocations: Counter[str]
    calls: Counter[str]  # "service.Operation"
    dynamodb_by_function: Counter[str]
    seconds: float
    transitions: int


def _config(max_gpus: int | None) -> FleetConfig | None:
    """The repository's config; with `max_gpus`, a fleet that small, so that jobs wait."""
    if max_gpus is None:
        return None
    document = config_from_yaml((ROOT / "gpufleet.yaml").read_text()).model_dump()
    queue = document["queue"]
    queue.update(max_gpus=max_gpus, reserve_share=0.0)
    for quota in [*queue["teams"].values(), queue["default_team"]]:
        quota.update(gpus=min(quota["gpus"], max_gpus), borrow=0)
    return FleetConfig.model_validate(document)


def _count(jobs: int, max_gpus: int | None = None) -> Counts:
    original_tick = ScheduleRunner.tick

    def tick(self: ScheduleRunner) -> None:
        """The schedules stay quiet: the happy path needs none of their passes."""

    ScheduleRunner.tick = tick  # type: ignore[method-assign]
    try:
        scenario = DemoScenario(
            name="overhead",
            submissions=[Submission("s3", SPEC, copy_as=f"job-{i}.yaml") for i in range(jobs)],
            nodes=NodeScenario(boot_seconds=1.0, behaviours={"resnet-baseline": Behaviour(3.0, 0)}),
            config=_config(max_gpus),
            timeout_seconds=180.0 + 10.0 * jobs,
        )
        result = run_demo(scenario)
    finally:
        ScheduleRunner.tick = original_tick  # type: ignore[method-assign]
    if not result.completed or any(j["status"] != "SUCCEEDED" for j in result.jobs):
        raise SystemExit(f"the happy path did not complete: {result.to_json()}")
    return Counts(
        invocations=Counter(i.function_name.removeprefix("gpufleet-") for i in result.invocations),
        calls=Counter(f"{c.service}.{c.operation}" for c in result.calls),
        dynamodb_by_function=Counter(
            f"{c.function or '?'}:{c.operation}" for c in result.calls if c.service == "dynamodb"
        ),
        seconds=sum(i.seconds for i in result.invocations),
        transitions=result.state_transitions,
    )


def _dollars_per_1000(counts: Counts, jobs: int) -> dict[str, float]:
    dynamo = {k.split(".")[1]: v for k, v in counts.calls.items() if k.startswith("dynamodb.")}
    writes = sum(v for k, v in dynamo.items() if k in _WRITES)
    # A transaction's items cost two units each, its condition checks included: the happy
    # path's three (the admission on arrival, the launch, the release and its hold checks)
    # hold about five items each.
    transactions = dynamo.get("TransactWriteItems", 0)
    write_units = writes - transactions + transactions * 2 * 5
    read_units = sum(v for k, v in dynamo.items() if k not in _WRITES)
    per_job = {
        "lambda": sum(counts.invocations.values()) * LAMBDA_PER_REQUEST
        + counts.seconds * LAMBDA_GB * LAMBDA_PER_GB_SECOND,
        "step_functions": counts.transitions * TRANSITION,
        "dynamodb": write_units * DYNAMODB_WRITE_UNIT + read_units * DYNAMODB_READ_UNIT,
        "eventbridge": counts.calls.get("eventbridge.PutEvents", 0) * EVENT,
        "s3": counts.calls.get("s3.PutObject", 0) * S3_PUT
        + counts.calls.get("s3.GetObject", 0) * S3_GET,
    }
    return {k: round(v / jobs * 1000, 4) for k, v in per_job.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1, help="jobs submitted at once (default 1)")
    parser.add_argument(
        "--max-gpus",
        type=int,
        default=None,
        help="cap the fleet's GPUs, so that jobs wait in the queue (default: gpufleet.yaml)",
    )
    args = parser.parse_args()
    counts = _count(args.jobs, args.max_gpus)
    n = args.jobs
    dynamo = sum(v for k, v in counts.calls.items() if k.startswith("dynamodb."))
    lambdas = sum(counts.invocations.values())
    cap = "" if args.max_gpus is None else f", a fleet of {args.max_gpus} GPU(s)"
    print(f"control-plane overhead per job, happy path, {n} job(s) at once{cap} (schedules apart)")
    print(f"  lambda invocations   {lambdas / n:6.1f}   (target <= 8)")
    print(f"  dynamodb requests    {dynamo / n:6.1f}   (target <= 10)")
    print(f"  state transitions    {counts.transitions / n:6.1f}   (target <= 20)")
    print(
        "  invocations by function: "
        + ", ".join(f"{k} {v / n:g}" for k, v in sorted(counts.invocations.items()))
    )
    print(
        "  requests by API: "
        + ", ".join(
            f"{k} {v / n:g}" for k, v in sorted(counts.calls.items()) if not k.startswith("lambda.")
        )
    )
    print(
        "  dynamodb by function: "
        + ", ".join(f"{k} {v / n:g}" for k, v in sorted(counts.dynamodb_by_function.items()))
    )
    dollars = _dollars_per_1000(counts, n)
    print(
        f"  $ per 1,000 jobs at list prices: {sum(dollars.values()):.4f} = "
        + ", ".join(f"{k} {v:.4f}" for k, v in dollars.items())
    )


if __name__ == "__main__":
    main()
