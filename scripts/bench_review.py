"""`gpufleet review` at scale, on the Philly trace: the forecast's backtest error and the time
the review of a month takes (budget 30 s).

1. Backtest: every Philly job's GPUs from its submission for its duration (no queueing), per
   virtual cluster (the team), hour by hour; each week after the first is forecast from the
   weeks before it (domain/forecast.py) and compared: WAPE printed.
2. A month of Philly (days 30 to 60, as `make simulate` starts at day 30) as job records: the
   simulator's trace mapping makes each job's spec (sim/mapping.py:to_spec), selection's
   feasibility and the catalog its instance type (the cheapest on-demand type that holds a node),
   every other job (by a hash of its id) on spot; each run's node usage is made up from a hash
   of the job id (utilization, GPU memory share, an hour a sample). Then the review of them
   all (right-size, waste, commitments, forecast and its backtest) is timed.

Exit 1 when the review takes longer than the budget, 2 when the trace is missing.

Usage: python scripts/bench_review.py [--data DIR] [--trace PATH] [--budget-s 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import cache
from pathlib import Path

from gpufleet.cli.review import review_document
from gpufleet.domain.boot import STOCK_TARGETS
from gpufleet.domain.catalog import Catalog, load_bundled
from gpufleet.domain.forecast import backtest, hourly_gpu_hours
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.review import ReviewedJob
from gpufleet.domain.selection import is_feasible
from gpufleet.domain.spec import Resources
from gpufleet.domain.usage_layout import NodeUsage, Sample
from gpufleet.sim.mapping import hash_fraction, sanitize_name, to_spec
from gpufleet.sim.traces import TraceError, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
PHILLY = Path("traces") / "philly-2017-pollux-derived"
ORIGIN = 1_764_633_600.0  # the month's records start here (epoch seconds, on an hour)
HOUR = 3600.0
REGION = "us-east-1"  # the trace mapping's default region
MAX_SAMPLES = 48  # per run: an hour a sample, at most two days' worth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="%(default)s")
    parser.add_argument("--trace", type=Path, help="default: DATA/" + str(PHILLY))
    parser.add_argument("--budget-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    path = args.trace or args.data / PHILLY
    try:
        whole = load_trace(path, "philly")
        month = load_trace(path, "philly", start_days=30, days=30)
    except TraceError as exc:
        print(f"bench_review: {exc}", file=sys.stderr)
        return 2

    intervals = [
        (sanitize_name(j.team, "default"), j.submit_seconds, j.end_seconds, j.gpus) for j in whole
    ]
    end = max(j.end_seconds for j in whole)
    checked = backtest(hourly_gpu_hours(intervals, 0.0, end))
    print(f"trace: {whole.source} ({len(whole)} jobs, {whole.gpu_hours:,.0f} GPU-hours)")
    print(
        f"forecast backtest: {checked.cuts} weeks x teams = {checked.team_days} team-days, "
        f"{checked.actual_gpu_hours:,.0f} GPU-hours: WAPE {checked.wape:.1%}"
        if checked.wape is not None
        else "forecast backtest: the trace is shorter than two weeks"
    )

    started = time.perf_counter()
    reviewed = [history_of(job) for job in month]
    reviewed = [r for r in reviewed if r is not None]
    built = time.perf_counter()
    start = ORIGIN + month.window_start_seconds
    document = review_document(
        reviewed, _catalog(), REGION, STOCK_TARGETS, start, start + 30 * 86400
    )
    took = time.perf_counter() - built
    print(f"a month of Philly: {len(reviewed)} job records built in {built - started:.2f} s")
    print(
        f"review: {took:.2f} s (budget {args.budget_s:g} s): {len(document['right_size'])} "
        f"families to right-size, {len(document['waste'])} with waste, "
        f"{len(document['commitments'])} commitment lines, "
        f"{len(document['forecast_gpu_hours'])} teams forecast"
    )
    return 0 if took <= args.budget_s else 1


_CHEAPEST: dict[str, tuple[str, float] | None] = {}


def _cheapest_on_demand(resources: Resources, region: str) -> tuple[str, float] | None:
    key = resources.model_dump_json()
    if key not in _CHEAPEST:
        _CHEAPEST[key] = _cheapest(resources, region)
    return _CHEAPEST[key]


@cache
def _catalog() -> Catalog:
    return load_bundled()


def _cheapest(resources: Resources, region: str) -> tuple[str, float] | None:
    offers = [
        o
        for o in _catalog().offerings(region)
        if o.capacity_type == "on-demand" and is_feasible(o.instance_type, resources)
    ]
    best = min(offers, key=lambda o: (o.hourly_usd, o.instance_type.name), default=None)
    return None if best is None else (best.instance_type.name, best.hourly_usd)


def history_of(trace_job: object) -> ReviewedJob | None:
    from gpufleet.sim.traces import TraceJob

    assert isinstance(trace_job, TraceJob)
    spec = to_spec(trace_job)
    chosen = _cheapest_on_demand(spec.resources, REGION)
    if chosen is None:
        return None
    instance_type, hourly = chosen
    submitted = ORIGIN + trace_job.submit_seconds
    spot = hash_fraction(trace_job.job_id, "capacity") < 0.5
    nodes = spec.resources.nodes
    instances = [f"i-{trace_job.job_id[-8:]}{n:04d}" for n in range(nodes)]
    job = Job(
        job_id=f"j-{abs(hash(trace_job.job_id)) % 16**20:020x}",
        status=JobStatus.SUCCEEDED,
        spec=spec,
        source="trace",
        created_at=submitted,
        updated_at=submitted + trace_job.duration_seconds,
        first_admitted_at=submitted,
        placement=Placement(
            instance_ids=instances,
            instance_type=instance_type,
            capacity_type="spot" if spot else "on-demand",
            hourly_usd=hourly * (0.4 if spot else 1.0),
            launched_at=submitted,
        ),
        released_at=submitted + trace_job.duration_seconds + 120,
    )
    util = 100 * hash_fraction(trace_job.job_id, "util")
    share = 0.2 + 0.8 * hash_fraction(trace_job.job_id, "mem")
    gpus, memory = spec.resources.gpus, _catalog().instance_type(instance_type).gpu_memory_gib
    samples = min(MAX_SAMPLES, max(1, int(trace_job.duration_seconds // HOUR)))
    usage = [
        NodeUsage(
            job_id=job.job_id,
            instance_id=instance,
            gpu_mem_total_mib=(memory * 1024,) * gpus,
            samples=tuple(
                Sample(submitted + s * HOUR, (util,) * gpus, (share * memory * 1024,) * gpus)
                for s in range(samples)
            ),
            events=(
                (submitted, "started"),
                (submitted + trace_job.duration_seconds, "finished"),
            ),
        )
        for instance in instances
    ]
    return ReviewedJob(job, tuple(usage))


if __name__ == "__main__":
    sys.exit(main())
