#!/usr/bin/env python3
"""Time the simulator on the whole Philly trace under the gpufleet policy.

Loads the trace, maps it to job specs, builds the policy, simulates, and prints the time of each
phase and the jobs simulated per second. Exits 1 when the whole run (load + map + simulate) takes
longer than the budget (60 s), 2 when the trace is missing.

Usage: python scripts/bench_simulator.py [--trace PATH] [--policy gpufleet] [--seed N]
                                         [--budget-s 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpufleet.sim.engine import Workload, simulate
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.policies import GPUFLEET, POLICY_NAMES, build_policies
from gpufleet.sim.traces import TraceError, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO_ROOT.parent / "shared" / "data" / "traces" / "philly-2017-pollux-derived"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="%(default)s")
    parser.add_argument("--policy", default=GPUFLEET, choices=POLICY_NAMES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    try:
        trace = load_trace(args.trace, "philly")
    except TraceError as exc:
        print(f"bench_simulator: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    workload = Workload.from_trace(trace, TraceMapping())
    (policy,) = build_policies([args.policy], workload)
    mapped = time.perf_counter()
    result = simulate(workload, policy, seed=args.seed)
    done = time.perf_counter()

    total = done - started
    sim = done - mapped
    print(f"trace: {args.trace} ({len(workload)} jobs)")
    print(f"policy: {policy.name} (cap {policy.queue.max_gpus} GPUs), seed {args.seed}")
    print(
        f"load {loaded - started:.2f} s, map + policy {mapped - loaded:.2f} s, simulate {sim:.2f} s"
    )
    print(
        f"  {result.dispatch_passes} dispatch passes, decide {result.decide_seconds:.2f} s; "
        f"{result.info.get('plans', 0)} plans, {result.info.get('plan_cache_misses', 0)} "
        "computed"
    )
    print(f"completed {result.completed}/{result.jobs}, failed {result.failed}")
    print(f"simulate: {len(workload) / sim:,.0f} jobs/s")
    print(f"wall: {total:.2f} s for {len(workload)} jobs ({len(workload) / total:,.0f} jobs/s)")
    if total > args.budget_s:
        print(f"over budget: {total:.2f} s > {args.budget_s:g} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
