"""`gpufleet chaos`: many jobs on the embedded AWS account under injected faults, and the
invariants that must hold anyway (docs/chaos.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

INVARIANTS = ("lost", "double_launches", "leaked_instances", "wrong_status", "duplicate_jobs")


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "chaos",
        help="run many jobs on the embedded account under injected faults; check the invariants",
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs to submit (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload and the faults")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before the run is judged as it is"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (progress goes to stderr)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the emulator pulls in moto, which the other commands do not need.
    from gpufleet.emulator.chaos import ChaosConfig, run_chaos

    if args.jobs < 1:
        print("--jobs must be at least 1", file=sys.stderr)
        return 2
    config = ChaosConfig(jobs=args.jobs, seed=args.seed, timeout_seconds=args.timeout)
    result = run_chaos(config, progress=sys.stderr if args.json else sys.stdout)
    summary = result.to_json()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0 if result.completed and result.holds else 1


def _print_summary(summary: dict[str, Any]) -> None:
    print()
    finished = "yes" if summary["completed"] else "NO (timed out)"
    print(f"seed {summary['seed']}: {summary['jobs']} jobs, {summary['terminal']} terminal")
    print(f"{summary['wall_seconds']} s, finished: {finished}")
    print("faults: " + ", ".join(f"{k}={v}" for k, v in summary["faults"].items()))
    for name in INVARIANTS:
        verdict = "ok" if summary[name] == 0 else "VIOLATED"
        print(f"  {name:<18}{summary[name]:>5}  {verdict}")
    for name in INVARIANTS:
        violations = summary["violations"][name]
        # Double launches are keyed by job; the other invariants list their cases.
        cases = (
            [{job: v} for job, v in violations.items()]
            if isinstance(violations, dict)
            else violations
        )
        for case in cases:
            print(f"{name}: {json.dumps(case)[:400]}")
