"""`gpufleet demo`: run the sample jobs on the embedded AWS account."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo", help="run sample jobs end to end on an embedded (moto) AWS account"
    )
    parser.add_argument(
        "--scenario",
        choices=(
            "basic",
            "preemption",
            "spot",
            "stages",
            "distributed",
            "distributed-node-loss",
            "sweep",
        ),
        default="basic",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (progress goes to stderr)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the emulator pulls in moto, which the other commands do not need.
    from gpufleet.emulator.demo import SCENARIOS, run_demo

    scenario = SCENARIOS[args.scenario]()
    result = run_demo(scenario, progress=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_summary(result.to_json())
    return 0 if result.completed and result.instances_running == 0 else 1


def _print_summary(summary: dict[str, Any]) -> None:
    print()
    header = (
        f"{'job':<24}{'name':<18}{'status':<11}{'instance':<16}{'capacity':<11}"
        f"{'$/h':>9}{'held s':>9}{'cost $':>11}"
    )
    print(header)
    print("-" * len(header))
    for job in summary["jobs"]:
        hourly = f"{job['hourly_usd']:.4f}" if job["hourly_usd"] is not None else "-"
        print(
            f"{job['id']:<24}{job['name']:<18}{job['status']:<11}"
            f"{job['instance_type'] or '-':<16}{job['capacity_type'] or '-':<11}"
            f"{hourly:>9}{job['held_seconds']:>9.1f}{(job['cost_usd'] or 0):>11.6f}"
        )
        for stage in job.get("stages", []):  # a multi-stage job: one line per stage
            held = stage["held_seconds"]
            print(
                f"{'':<24}{'- ' + stage['name']:<18}{stage['status']:<11}"
                f"{stage['instance_type'] or '-':<16}{stage['capacity_type'] or '-':<11}"
                f"{'':>9}{(held or 0):>9.1f}{(stage['cost_usd'] or 0):>11.6f}"
            )
    print()
    print(f"rejected submissions: {summary['rejected']}")
    print(f"instances running:    {summary['instances_running']}")
    print(f"state transitions:    {summary['state_transitions']}")
    calls = ", ".join(f"{k}={v}" for k, v in summary["api_calls"].items())
    print(f"control-plane calls:  {calls}")
    print(f"finished:             {'yes' if summary['completed'] else 'NO (timed out)'}")
