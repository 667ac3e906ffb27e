#!/usr/bin/env python3
"""Time instance selection over the full bundled catalog.

Runs a few hundred mixed requests (CPU-only, 1..16 GPUs, model allow-lists, multi-node, every
spot policy, the big regions and the rest, some with unavailable offerings) after a warm-up,
prints median and p95 per selection, and exits 1 if the median is over the budget (2 ms).

Usage: python scripts/bench_selection.py [--requests N] [--budget-ms MS] [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.selection import NoFeasibleOffering, select
from gpufleet.domain.spec import Resources, SpotPolicy


def requests(n: int, seed: int) -> list[tuple[Resources, SpotPolicy, str, frozenset[str]]]:
    catalog = load_bundled()
    rng = random.Random(seed)
    regions = catalog.regions()
    models = [[], [], ["H100"], ["A100", "H100"], ["L4", "A10G"], ["T4"], ["L40S"]]
    out = []
    for _ in range(n):
        gpus = rng.choice([0, 0, 1, 1, 2, 4, 8, 8])
        region = rng.choice(["us-east-1", "us-east-1", "us-west-2", rng.choice(regions)])
        resources = Resources(
            gpus=gpus,
            gpu_memory_gib=rng.choice([0, 16, 24, 40, 80]) if gpus else 0,
            gpu_models=rng.choice(models) if gpus else [],
            vcpus=rng.choice([1, 4, 8, 32]),
            memory_gib=rng.choice([1, 16, 64]),
            nodes=rng.choice([1, 1, 1, 2, 4]) if gpus else 1,
            arch=rng.choice(["x86_64", "x86_64", "x86_64", "arm64"]) if not gpus else "x86_64",
        )
        keys = [o.key for o in catalog.offerings(region)]
        unavailable = frozenset(rng.sample(keys, min(len(keys), rng.choice([0, 0, 5, 20]))))
        out.append((resources, rng.choice(list(SpotPolicy)), region, unavailable))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--budget-ms", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    catalog = load_bundled()
    load_ms = (time.perf_counter() - t0) * 1000
    work = requests(args.requests, args.seed)
    for resources, policy, region, unavailable in work[:50]:  # warm-up
        with contextlib.suppress(NoFeasibleOffering):
            select(resources, policy, catalog, region, unavailable=unavailable)

    times: list[float] = []
    infeasible = 0
    for resources, policy, region, unavailable in work:
        start = time.perf_counter()
        try:
            select(resources, policy, catalog, region, expected_hours=8.0, unavailable=unavailable)
        except NoFeasibleOffering:
            infeasible += 1
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    median = statistics.median(times)
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(
        f"catalog: {len(catalog.instance_types())} types, {len(catalog)} offerings, "
        f"{len(catalog.regions())} regions; load {load_ms:.0f} ms (once per process)"
    )
    print(
        f"selection over {len(times)} requests ({infeasible} infeasible): "
        f"median {median:.3f} ms, p95 {p95:.3f} ms, max {times[-1]:.3f} ms "
        f"(budget: median <= {args.budget_ms:g} ms)"
    )
    if median > args.budget_ms:
        print("FAIL: median over budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
