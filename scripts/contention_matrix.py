#!/usr/bin/env python3
"""Run the contention matrix of issue 18 on a trace (Philly by default) and print its table.

Each run is `gpufleet simulate --format F --start-days S --days D --cap-gpus N --seed K
--compare batch-like,fifo-spot` on the default market (measured interruptions, finite spot
capacity, history durations). The default matrix is days 30, 60 and 90 (one day each) at half
and a third of each day's peak (720, 176 and 136 GPUs), seeds 0-2: 18 runs. `--week` adds days
30-37 at the default cap (the window's peak), seed 0, with every peer, for the cost target.

Columns: cost / lower bound; high / normal p95 wait (boot included), s; preemptions per job;
the peak concurrent GPUs of the high jobs alone (does high demand alone fit the cap?);
batch-like's high / normal p95 (its failed jobs) and the normal p95 of batch-like vs gpufleet
on the jobs both complete; fifo-spot's cost and normal p95. The last lines count the runs
that meet each target of issue 18's point 2.

A run's CAP is a GPU count, `peak` (the window's peak concurrent GPU demand, the default cap)
or `peak/N` (that peak divided by N, rounded down). The default matrix and `--week` are
Philly's; the evaluation traces (`--format itp|openb`) are held out from tuning and take
`--runs` only, to report on them (sim/README.md, "Held-out evaluation").

Usage: python scripts/contention_matrix.py [--format philly|itp|openb]
                                           [--runs 60:1:59:0,30:1:peak/2:1] [--week]
                                           [--gpufleet-only] [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.cli.simulate import DEFAULT_TRACE_DIRS
from gpufleet.domain.catalog import load_bundled
from gpufleet.sim.engine import SimResult, Workload, simulate
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.measured import MeasuredDataMissing
from gpufleet.sim.policies import BASELINES, BATCH_LIKE, FIFO_SPOT, GPUFLEET, build_policies
from gpufleet.sim.report import cost_lower_bound_usd, percentile
from gpufleet.sim.settings import SimSettings
from gpufleet.sim.traces import TraceError, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
DAY_PEAKS = {30: 720, 60: 176, 90: 136}  # each day's peak concurrent GPU demand
HIGH_P95_TARGET_S = 600.0
PREEMPTIONS_PER_JOB_TARGET = 0.1
COST_TARGET = 1.3


@dataclass(frozen=True)
class Run:
    start_days: float
    days: float
    cap_gpus: int | None  # None: the window's peak divided by peak_divisor
    seed: int
    peak_divisor: int = 1

    @classmethod
    def parse(cls, text: str) -> Run:
        start, days, cap, seed = text.split(":")
        if cap == "peak" or cap.startswith("peak/"):
            divisor = int(cap.removeprefix("peak/")) if cap != "peak" else 1
            return cls(float(start), float(days), None, int(seed), divisor)
        return cls(float(start), float(days), int(cap), int(seed))

    @property
    def capped(self) -> bool:
        """Below the window's peak, where the contention targets apply."""
        return self.cap_gpus is not None or self.peak_divisor > 1

    def cap_for(self, workload: Workload) -> int | None:
        if self.cap_gpus is None and self.peak_divisor > 1:
            return workload.peak_gpus() // self.peak_divisor
        return self.cap_gpus

    @property
    def label(self) -> str:
        cap = str(self.cap_gpus) if self.cap_gpus is not None else "peak"
        if self.cap_gpus is None and self.peak_divisor > 1:
            cap += f"/{self.peak_divisor}"
        return f"{self.start_days:g}+{self.days:g}, {cap}, {self.seed}"


def default_matrix() -> list[Run]:
    return [
        Run(day, 1, peak // divisor, seed)
        for day, peak in DAY_PEAKS.items()
        for divisor in (2, 3)
        for seed in range(3)
    ]


def _p95(result: SimResult, priority: str, among: set[int] | None = None) -> float:
    waits = sorted(
        w
        for i, (p, w) in enumerate(zip(result.priorities, result.waits, strict=True))
        if p == priority and w is not None and (among is None or i in among)
    )
    return percentile(waits, 95)


def _completed(result: SimResult) -> set[int]:
    return {i for i, jct in enumerate(result.jcts) if jct is not None}


def _high_peak(workload: Workload) -> int:
    high = [
        (job, spec)
        for job, spec in zip(workload.jobs, workload.specs, strict=True)
        if spec.priority.value == "high"
    ]
    jobs = tuple(job for job, _ in high)
    specs = tuple(spec for _, spec in high)
    return Workload(jobs, specs, workload.mapping).peak_gpus()


@dataclass
class Row:
    run: Run
    cap: int
    high_peak: int
    results: dict[str, SimResult]
    lower_bound: float

    def ratio(self, name: str) -> float:
        return self.results[name].cost_usd / self.lower_bound

    def text(self) -> str:
        ours = self.results[GPUFLEET]
        cells = [
            self.run.label + f" (cap {self.cap})",
            f"{self.ratio(GPUFLEET):.3f}; {_p95(ours, 'high'):,.0f} / {_p95(ours, 'normal'):,.0f}; "
            f"{ours.preemptions / ours.jobs:.3f}",
            f"{self.high_peak}",
        ]
        batch = self.results.get(BATCH_LIKE)
        if batch is not None:
            both = _completed(batch) & _completed(ours)
            cells.append(
                f"{_p95(batch, 'high'):,.0f} / {_p95(batch, 'normal'):,.0f} ({batch.failed}); "
                f"{_p95(batch, 'normal', both):,.0f} vs {_p95(ours, 'normal', both):,.0f}"
            )
        fifo = self.results.get(FIFO_SPOT)
        if fifo is not None:
            cells.append(f"{self.ratio(FIFO_SPOT):.3f}; {_p95(fifo, 'normal'):,.0f}")
        for name in BASELINES:
            if name not in (BATCH_LIKE, FIFO_SPOT) and name in self.results:
                cells.append(f"{name} {self.ratio(name):.3f}")
        return "| " + " | ".join(cells) + " |"


def run_one(run: Run, names: list[str], data: Path, fmt: str = "philly") -> Row:
    settings = SimSettings()
    trace_dir = data / "traces" / DEFAULT_TRACE_DIRS[fmt]
    trace = load_trace(trace_dir, fmt, run.start_days, run.days)
    measured = settings.load(data)
    workload = Workload.from_trace(trace, TraceMapping())
    catalog = load_bundled()
    region = workload.mapping.region
    policies = build_policies(
        names, workload, catalog=catalog, region=region, cap_gpus=run.cap_for(workload)
    )
    results = {}
    for policy in policies:
        market = settings.market(catalog, region, run.seed, measured)
        results[policy.name] = simulate(
            workload, policy, seed=run.seed, market=market, config=settings.engine_config()
        )
    return Row(
        run,
        policies[0].queue.max_gpus,
        _high_peak(workload),
        results,
        cost_lower_bound_usd(workload, catalog, region),
    )


def print_totals(rows: list[Row]) -> None:
    if not rows:
        return
    n = len(rows)
    per_job = [r.results[GPUFLEET].preemptions / r.results[GPUFLEET].jobs for r in rows]
    fits = [r for r in rows if r.high_peak <= r.cap]
    high_ok = sum(_p95(r.results[GPUFLEET], "high") <= HIGH_P95_TARGET_S for r in fits)
    print(
        f"preemptions/job < {PREEMPTIONS_PER_JOB_TARGET}: "
        f"{sum(p < PREEMPTIONS_PER_JOB_TARGET for p in per_job)}/{n} "
        f"(mean {sum(per_job) / n:.3f}, worst {max(per_job):.3f})"
    )
    print(
        f"high p95 <= {HIGH_P95_TARGET_S:.0f} s where high demand alone fits the cap: "
        f"{high_ok}/{len(fits)}; on all runs: "
        f"{sum(_p95(r.results[GPUFLEET], 'high') <= HIGH_P95_TARGET_S for r in rows)}/{n}"
    )
    compared = [r for r in rows if BATCH_LIKE in r.results]
    if compared:
        not_worse = sum(
            _p95(r.results[GPUFLEET], "high") <= _p95(r.results[BATCH_LIKE], "high")
            for r in compared
        )
        print(f"high p95 <= batch-like's: {not_worse}/{len(compared)}")


def print_cost(rows: list[Row]) -> None:
    for row in rows:
        peers = {n: row.ratio(n) for n in row.results if n != GPUFLEET}
        below = all(row.ratio(GPUFLEET) < ratio for ratio in peers.values())
        print(
            f"cost {row.run.label}: {row.ratio(GPUFLEET):.3f}x the lower bound "
            f"(target <= {COST_TARGET}); below every peer: {below} "
            + ", ".join(f"{n} {r:.3f}" for n, r in peers.items())
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="%(default)s")
    parser.add_argument("--format", choices=list(DEFAULT_TRACE_DIRS), default="philly")
    parser.add_argument(
        "--runs",
        help="START:DAYS:CAP:SEED,... (CAP N, 'peak' or 'peak/N'); default (Philly): the 18",
    )
    parser.add_argument("--week", action="store_true", help="add Philly days 30-37, every peer")
    parser.add_argument("--gpufleet-only", action="store_true", help="no peers (faster)")
    args = parser.parse_args(argv)
    if args.format != "philly" and (args.week or not args.runs):
        # The defaults are Philly's days and peaks; a held-out trace's windows are named.
        parser.error(f"--format {args.format} takes --runs and no --week")
    runs = [Run.parse(t) for t in args.runs.split(",")] if args.runs else default_matrix()
    peers = [] if args.gpufleet_only else [BATCH_LIKE, FIFO_SPOT]
    print("| day, cap, seed | gpufleet | high peak | batch-like; both complete | fifo-spot |")
    print("|---|---|---|---|---|")
    rows = []
    try:
        for run in runs:
            rows.append(run_one(run, [GPUFLEET, *peers], args.data, args.format))
            print(rows[-1].text(), flush=True)
        if args.week:
            week = Run(30, 7, None, 0)
            rows.append(
                run_one(week, [GPUFLEET, *([] if args.gpufleet_only else BASELINES)], args.data)
            )
            print(rows[-1].text(), flush=True)
    except (TraceError, MeasuredDataMissing) as exc:
        print(f"contention_matrix: {exc}", file=sys.stderr)
        return 2
    print_totals([r for r in rows if r.run.capped])
    print_cost([r for r in rows if not r.run.capped])
    return 0


if __name__ == "__main__":
    sys.exit(main())
