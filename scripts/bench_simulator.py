#!/usr/bin/env python3
"""Time the simulator on the whole Philly trace, one policy, on the default market.

The default market is `SimSettings()`, what `gpufleet simulate` runs by default: measured
interruptions, finite spot capacity, durations from history (it reads the measured spot traces
under `--data`). Loads the trace, maps it to job specs, builds the policy, simulates, and prints
the time of each phase and the jobs simulated per second. Exits 1 when the whole run (load +
map + simulate) takes longer than the budget (60 s), 2 when the trace or the measured data is
missing.

Usage: python scripts/bench_simulator.py [--data DIR] [--trace PATH] [--policy gpufleet]
                                         [--seed N] [--budget-s 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpufleet.domain.catalog import load_bundled
from gpufleet.sim.engine import Workload, simulate
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.measured import MeasuredDataMissing
from gpufleet.sim.policies import GPUFLEET, POLICY_NAMES, build_policies
from gpufleet.sim.settings import SimSettings
from gpufleet.sim.traces import TraceError, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
PHILLY = Path("traces") / "philly-2017-pollux-derived"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="%(default)s")
    parser.add_argument("--trace", type=Path, help="default: DATA/" + str(PHILLY))
    parser.add_argument("--policy", default=GPUFLEET, choices=POLICY_NAMES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    settings = SimSettings()

    started = time.perf_counter()
    cpu_started = time.process_time()
    try:
        trace = load_trace(args.trace or args.data / PHILLY, "philly")
        measured = settings.load(args.data)
    except (TraceError, MeasuredDataMissing) as exc:
        print(f"bench_simulator: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    workload = Workload.from_trace(trace, TraceMapping())
    (policy,) = build_policies([args.policy], workload)
    market = settings.market(load_bundled(), workload.mapping.region, args.seed, measured)
    mapped = time.perf_counter()
    result = simulate(
        workload, policy, seed=args.seed, market=market, config=settings.engine_config()
    )
    done = time.perf_counter()
    cpu = time.process_time() - cpu_started

    total = done - started
    sim = done - mapped
    load1, load5, _ = os.getloadavg()
    print(f"trace: {trace.source} ({len(workload)} jobs)")
    print(f"policy: {policy.name} (cap {policy.queue.max_gpus} GPUs), seed {args.seed}")
    print(f"market: {settings.describe()}")
    print(
        f"load {loaded - started:.2f} s, map + policy {mapped - loaded:.2f} s, simulate {sim:.2f} s"
    )
    print(
        f"  {result.dispatch_passes} dispatch passes, decide {result.decide_seconds:.2f} s; "
        f"{result.info.get('plans', 0)} plans, {result.info.get('plan_cache_misses', 0)} "
        f"computed; {result.launches} launches, {result.interruptions} interruptions"
    )
    print(f"completed {result.completed}/{result.jobs}, failed {result.failed}")
    print(f"simulate: {len(workload) / sim:,.0f} jobs/s")
    print(f"wall: {total:.2f} s for {len(workload)} jobs ({len(workload) / total:,.0f} jobs/s)")
    print(f"CPU time: {cpu:.2f} s (this process; wall time above includes waiting for a core)")
    print(f"machine load average: {load1:.2f} (1 min), {load5:.2f} (5 min), {os.cpu_count()} CPUs")
    if total > args.budget_s:
        print(f"over budget: {total:.2f} s > {args.budget_s:g} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
