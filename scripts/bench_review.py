"""`gpufleet review` at scale: the review of a simulated month of Philly, timed (budget 30 s),
and the forecast's backtest error.

1. Backtest on the whole trace: every Philly job's GPUs from its submission for its duration
   (no queueing), per virtual cluster (the team), hour by hour; each week after the first is
   forecast from the weeks before it (domain/forecast.py) and compared: WAPE printed.
2. A month of Philly (days 30 to 60, as `make simulate` starts at day 30) run by the simulator
   under the gpufleet policy, on the default market, with its records written in a temporary
   folder (`gpufleet simulate --records DIR --days 30`: the job store's items and the nodes'
   usage documents as they stood at the month's end); not timed. Then `gpufleet review
   --records DIR --since 30d --json`, timed as a user runs it (reading the records included),
   and its figures printed: jobs, spend, right-size, waste, commitments, the forecast's
   backtest over the month.

Exit 1 when the review takes longer than the budget, 2 when the trace is missing.

Usage: python scripts/bench_review.py [--data DIR] [--trace PATH] [--budget-s 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.cli import main as gpufleet
from gpufleet.cli.review import backtest_line
from gpufleet.domain.forecast import backtest, hourly_gpu_hours
from gpufleet.sim.mapping import sanitize_name
from gpufleet.sim.traces import TraceError, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
PHILLY = Path("traces") / "philly-2017-pollux-derived"
START_DAYS, DAYS = 30, 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="%(default)s")
    parser.add_argument("--trace", type=Path, help="default: DATA/" + str(PHILLY))
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--keep", type=Path, help="write the records here, and keep them")
    args = parser.parse_args(argv)
    path = args.trace or args.data / PHILLY
    try:
        whole = load_trace(path, "philly")
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
        f"forecast backtest, whole trace without queueing: {checked.cuts} weeks, "
        f"{checked.team_days} team-days, {checked.actual_gpu_hours:,.0f} GPU-hours: "
        + (f"WAPE {checked.wape:.1%}" if checked.wape is not None else "under two weeks")
    )

    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        records = folder / "records"
        started = time.perf_counter()
        simulate = [
            "simulate", "--format", "philly", "--trace", str(path), "--data", str(args.data),
            "--start-days", str(START_DAYS), "--days", str(DAYS), "--compare", "none",
            "--records", str(records), "--json",
        ]  # fmt: skip
        code, _ = _quietly(simulate)
        if code != 0:
            print(f"bench_review: gpufleet simulate exited {code}", file=sys.stderr)
            return code
        print(
            f"a month of Philly (days {START_DAYS}-{START_DAYS + DAYS}) simulated, records in "
            f"{time.perf_counter() - started:.0f} s (not timed)"
        )
        started = time.perf_counter()
        code, out = _quietly(["review", "--records", str(records), "--since", f"{DAYS}d", "--json"])
        took = time.perf_counter() - started
    if code != 0:
        print(f"bench_review: gpufleet review exited {code}", file=sys.stderr)
        return code
    document = json.loads(out)
    spent, waste = document["spend"], document["waste"]
    print(
        f"review: {took:.1f} s (budget {args.budget_s:g} s) for {document['jobs']} jobs "
        f"({document['with_usage']} with usage): ${spent['cost_usd']:,.0f} for "
        f"{spent['gpu_hours']:,.0f} GPU-hours; {len(document['right_size'])} families to "
        f"right-size (saving ${sum(r['saving_usd'] for r in document['right_size']):,.0f}), "
        f"{len(waste)} with waste ({sum(w['idle_gpu_hours'] for w in waste):,.0f} idle GPU-h, "
        f"${sum(w['idle_usd'] + w['held_after_usd'] + w['rework_usd'] for w in waste):,.0f}), "
        f"{len(document['commitments'])} commitment lines, "
        f"{len(document['forecast_gpu_hours'])} teams forecast"
    )
    print(f"the month's {backtest_line(document['forecast_backtest'])}")
    return 0 if took <= args.budget_s else 1


def _quietly(argv: list[str]) -> tuple[int, str]:
    """`gpufleet ARGV`: its exit code and what it printed (its progress on stderr dropped)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = gpufleet(argv)
    return code, out.getvalue()


if __name__ == "__main__":
    sys.exit(main())
