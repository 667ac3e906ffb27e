"""`gpufleet simulate`: replay a real cluster trace through the domain core and compare policies.

    gpufleet simulate --format philly|itp|openb [--trace PATH] [--data DIR]
                      [--start-days S] [--days D] [--price-region us-east-1]
                      [--min-gpu-memory-gib 16] [--high-share 0.1] [--seed N]
                      [--interruptions measured|advisor] [--spot-capacity finite|unlimited]
                      [--durations history|oracle] [--policy gpufleet]
                      [--compare static-ondemand,fifo-spot,batch-like,skypilot-like]
                      [--cap-gpus N] [--json] [--report DIR] [--records DIR]

`--data` is the shared data folder (default: ../shared/data next to the repository); the
measured market (the default: `--interruptions measured --spot-capacity finite`) reads its
spot traces there at run time, and `--trace` defaults to the format's folder under its
`traces/` (Philly: philly-2017-pollux-derived). `--compare none` runs `--policy` alone. With
`--json` one JSON object is printed (see gpufleet/sim/report.py); `--report DIR` also writes PNG
plots and DIR/index.html. `--records DIR` writes the `--policy` run's job records and their
usage in the stack's shapes (gpufleet/sim/records.py, adapters/local/records.py) for
`gpufleet review --records DIR`: as they stood at the window's end with `--days` (jobs still
running then live), else once every job ended.

Without the shared data folder (a fresh clone), `--format philly` runs on the week of Philly
that ships in gpufleet/sim/data/philly-sample (see its SOURCE.md), and a market left at its
defaults runs data-free (`--interruptions advisor --spot-capacity unlimited`: the measured
traces carry no licence to copy them); both are said on stderr and recorded in the JSON
(`trace.sample`, `settings.fallback`). A market asked for by flag that needs the data, or an
ITP or openb trace, is an error naming what is needed and where. Progress (the trace read, each
policy's run) goes to stderr, except with `--json`.

Exit codes: 0 ok, 2 bad input (unknown policy, unreadable trace, empty window, the measured
traces absent).
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from gpufleet.adapters.local.records import write_records
from gpufleet.cli.output import CliError, ErrorCode, invalid, print_json
from gpufleet.cli.plan import add_price_region_argument, prices_as_of
from gpufleet.domain.catalog import load_bundled
from gpufleet.sim.engine import SimResult, Workload, simulate
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.measured import BAMBOO_DIR, SKYPILOT_DIR, MeasuredDataMissing, MeasuredSpot
from gpufleet.sim.policies import BASELINES, GPUFLEET, POLICY_NAMES, build_policies
from gpufleet.sim.records import RecordWriter, trace_origin
from gpufleet.sim.report import cost_lower_bound_usd, settings_label, summary, write_report
from gpufleet.sim.settings import SimSettings
from gpufleet.sim.traces import FORMATS, TraceError, load_trace

# functions/gpufleet/cli/simulate.py -> the repository root, then ../shared/data.
_REPO_ROOT = Path(__file__).resolve().parents[3]
SHARED_DATA = _REPO_ROOT.parent / "shared" / "data"
_DEFAULTS = SimSettings()
DEFAULT_TRACE_DIRS: dict[str, str] = {
    "philly": "philly-2017-pollux-derived",
    "itp": "microsoft-itp-elasticflow-2021",
    "openb": "alibaba-openb-gpu-2023",
}
# What a fresh clone simulates: a week of Philly, shipped with its source and licence.
SAMPLE_TRACES: dict[str, str] = {"philly": "sim/data/philly-sample"}
# The market that needs no data (the measured traces may not be copied into the project).
DATA_FREE_MARKET = {"interruptions": "advisor", "spot_capacity": "unlimited"}


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive(text: str) -> float:
    value = _non_negative(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _share(text: str) -> float:
    value = _non_negative(text)
    if value > 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "simulate",
        help="replay a cluster trace through the scheduler and compare policies",
        description="Replay a real cluster trace (Philly, ITP, openb) through the same domain "
        "core the Lambdas use, on a simulated clock and spot market, and compare gpufleet "
        "with baseline policies by cost, wait and utilization.",
    )
    parser.add_argument(
        "--trace",
        metavar="PATH",
        help="trace file or folder (default: the format's folder in ../shared/data/traces)",
    )
    parser.add_argument("--format", required=True, choices=FORMATS, help="trace format")
    parser.add_argument(
        "--data",
        metavar="DIR",
        type=Path,
        default=SHARED_DATA,
        help="shared data folder: the measured spot traces and the default traces (%(default)s)",
    )
    parser.add_argument(
        "--start-days",
        type=_non_negative,
        default=0.0,
        metavar="S",
        help="window start, days after the trace's start (%(default)s)",
    )
    parser.add_argument(
        "--days", type=_positive, metavar="D", help="window length in days (default: all)"
    )
    add_price_region_argument(parser)
    parser.add_argument(
        "--min-gpu-memory-gib",
        type=_non_negative,
        default=16.0,
        help="GPU memory every job needs per GPU (%(default)s)",
    )
    parser.add_argument(
        "--high-share",
        type=_share,
        default=0.1,
        help="share of jobs made high priority when the trace has no QoS (%(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")
    parser.add_argument(
        "--policy", default=GPUFLEET, choices=POLICY_NAMES, help="policy (%(default)s)"
    )
    parser.add_argument(
        "--compare",
        default=",".join(BASELINES),
        metavar="P1,P2",
        help="baselines run in the same simulation, comma-separated, or 'none' (%(default)s)",
    )
    parser.add_argument(
        "--cap-gpus",
        type=int,
        help="GPUs all jobs may hold together (default: the window's peak demand, so nothing "
        "queues); lower it to see how the policies share a contended fleet",
    )
    market_choices = (
        (
            "--interruptions",
            "spot interruptions: 'measured' replays the preemptions measured on EC2 (Bamboo, "
            "SkyPilot) by Spot Advisor bucket; 'advisor' uses the Spot Advisor hazard",
        ),
        (
            "--spot-capacity",
            "spot pools: 'finite' hold what SkyPilot's availability traces could launch; "
            "'unlimited' fail launches at a fixed rate",
        ),
        (
            "--durations",
            "what plans know of a job's duration: 'history' the estimate from the team's "
            "past runs, as the Lambdas; 'oracle' the trace's true duration",
        ),
    )
    for flag, what in market_choices:
        field = flag[2:].replace("-", "_")
        # None: not given, so the default, or the data-free market when the data is absent.
        parser.add_argument(
            flag,
            choices=get_args(SimSettings.model_fields[field].annotation),
            help=f"{what} ({getattr(_DEFAULTS, field)})",
        )
    parser.add_argument(
        "--spot-pool-instances",
        type=int,
        default=_DEFAULTS.spot_pool_instances,
        metavar="N",
        help="instances a fully available spot pool holds (finite capacity) (%(default)s)",
    )
    parser.add_argument(
        "--hazard-scale",
        type=float,
        default=_DEFAULTS.hazard_scale,
        help="multiply the Spot Advisor interruption rates (--interruptions advisor only) "
        "(%(default)s)",
    )
    parser.add_argument("--report", metavar="DIR", help="write PNG plots and DIR/index.html")
    parser.add_argument(
        "--records",
        metavar="DIR",
        type=Path,
        help="write the --policy run's job records and usage to DIR, in the stack's shapes, "
        "for `gpufleet review --records DIR`",
    )
    parser.set_defaults(run=run)


def _policy_names(args: argparse.Namespace) -> list[str]:
    names = [args.policy]
    if args.compare.strip().lower() not in ("", "none"):
        for name in (n.strip() for n in args.compare.split(",")):
            if name not in POLICY_NAMES:
                raise ValueError(
                    f"unknown policy {name!r} in --compare; known: {', '.join(POLICY_NAMES)}"
                )
            if name and name not in names:
                names.append(name)
    return names


def _trace_path(args: argparse.Namespace) -> tuple[Path, bool]:
    """The trace to read, and whether it is the sample that ships with gpufleet."""
    if args.trace:
        return Path(args.trace), False
    path = Path(args.data) / "traces" / DEFAULT_TRACE_DIRS[args.format]
    if path.exists():
        return path, False
    sample = SAMPLE_TRACES.get(args.format)
    if sample is None:
        raise CliError(
            f"no --trace given and {path} does not exist: put the {args.format} trace there "
            f"(the shared data folder, --data DIR) or give --trace PATH; only philly has a "
            "sample that ships with gpufleet",
            ErrorCode.DATA_MISSING,
            {"looked_in": str(path)},
        )
    return Path(str(resources.files("gpufleet").joinpath(sample))), True


def _settings(
    args: argparse.Namespace,
) -> tuple[SimSettings, MeasuredSpot | None, str | None]:
    """The market settings, the measured traces they replay, and why the data-free market
    stands in for the default (None when it does not): the measured traces are read from
    --data, and may not be copied into the project."""
    asked = {
        field: getattr(args, field)
        for field in ("interruptions", "spot_capacity", "durations")
        if getattr(args, field) is not None
    }
    values = {
        "spot_pool_instances": args.spot_pool_instances,
        "hazard_scale": args.hazard_scale,
        **asked,
    }
    try:
        settings = SimSettings(**values)
        return settings, settings.load(args.data), None
    except MeasuredDataMissing as exc:
        missing = str(exc)
    # What was not asked for by flag falls back to the data-free market; what was stays.
    fallback = {field: value for field, value in DATA_FREE_MARKET.items() if field not in asked}
    settings = SimSettings(**{**values, **fallback})
    if not fallback or settings.needs_data:
        raise CliError(missing, ErrorCode.DATA_MISSING, {"data": str(args.data)})
    flags = " ".join(f"--{field.replace('_', '-')} {value}" for field, value in fallback.items())
    reason = (
        f"the measured spot traces are not in {args.data}: running the data-free market "
        f"({flags}); for the measured one, give --data DIR holding {BAMBOO_DIR} and "
        f"{SKYPILOT_DIR}"
    )
    return settings, None, reason


def run(args: argparse.Namespace) -> int:
    progress = _progress(args)
    started = time.perf_counter()
    try:
        names = _policy_names(args)
        path, sample = _trace_path(args)
        if sample:
            progress(
                f"no {Path(args.data) / 'traces' / DEFAULT_TRACE_DIRS[args.format]}: running on "
                f"the sample that ships with gpufleet ({path}, see its SOURCE.md)"
            )
        mapping = TraceMapping(
            region=args.price_region,
            min_gpu_memory_gib=args.min_gpu_memory_gib,
            high_share=args.high_share,
        )
        trace = load_trace(path, args.format, args.start_days, args.days)
        settings, measured, fallback = _settings(args)
        if fallback:
            progress(fallback)
    except (ValueError, TraceError, ValidationError) as exc:
        raise invalid(str(exc)) from None
    if not len(trace):
        raise invalid(f"no jobs in the window ({path}, start {args.start_days:g} days)")
    progress(f"read {len(trace)} jobs from {path} in {time.perf_counter() - started:.1f} s")
    catalog = load_bundled()
    try:
        workload = Workload.from_trace(trace, mapping)
        policies = build_policies(
            names, workload, catalog=catalog, region=args.price_region, cap_gpus=args.cap_gpus
        )
        lower_bound = cost_lower_bound_usd(workload, catalog, args.price_region)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    writer = None
    if args.records is not None:
        if policies[0].static_pool is not None:
            raise invalid(
                f"--records: {policies[0].name} runs its jobs on one shared pool, so they hold "
                "no instances of their own to record; pick another --policy"
            )
        origin = trace_origin(trace.origin)
        writer = RecordWriter(workload, catalog, origin, until=trace.window_end_seconds)
    results: list[SimResult] = []
    started = time.perf_counter()
    engine = settings.engine_config()
    for number, policy in enumerate(policies, start=1):
        progress(f"simulating {policy.name} ({number}/{len(policies)}) ...")
        market = settings.market(catalog, args.price_region, args.seed, measured)
        observer = writer if number == 1 else None
        results.append(
            simulate(
                workload, policy, seed=args.seed, market=market, config=engine, observer=observer
            )
        )
        progress(f"  {policy.name}: {results[-1].wall_seconds:.1f} s")
    wall = time.perf_counter() - started
    if writer is not None:
        export = writer.export(
            args.price_region, trace.window_start_seconds, results[0].end_seconds
        )
        written = write_records(args.records, export, writer.jobs(), writer.usage())
        progress(f"wrote {written} job records of {policies[0].name} to {args.records}")
    context = {
        "trace": {
            "format": args.format,
            "path": str(path),
            "sample": sample,
            "start_days": args.start_days,
            "days": args.days,
            "jobs": len(trace),
            "gpu_hours": round(trace.gpu_hours, 2),
            "skipped": dict(sorted(trace.skipped.items())),
        },
        "region": args.price_region,
        "prices_as_of": prices_as_of(catalog)["date"],
        "seed": args.seed,
        "settings": {
            **settings.describe(),
            **({"data": str(measured.root)} if measured is not None else {}),
        },
        # Why the market is the data-free one although no flag asked for it (else None).
        "market_fallback": fallback,
        "cap_gpus": policies[0].queue.max_gpus,
        "descriptions": {p.name: p.description for p in policies},
    }
    document = summary(results, lower_bound, context=context, sim_wall_seconds=wall)
    if args.report:
        progress(f"writing the report to {args.report} ...")
        write_report(args.report, results, document)
    if args.json:
        print_json(document)
    else:
        _print_table(document, results)
        if args.report:
            print(f"\nreport: {Path(args.report) / 'index.html'}")
    return 0


def _progress(args: argparse.Namespace) -> Any:
    """Progress on stderr, for people: none with --json."""

    def say(message: str) -> None:
        if not args.json:
            print(f"gpufleet simulate: {message}", file=sys.stderr, flush=True)

    return say


def _print_table(document: dict[str, Any], results: list[SimResult]) -> None:
    trace = document["trace"]
    print(
        f"{trace['format']} {trace['path']}: {trace['jobs']} jobs, "
        f"{trace['gpu_hours']:,.0f} GPU-hours; region {document['region']}, "
        f"seed {document['seed']}, cap {document['cap_gpus']} GPUs"
    )
    print(f"market: {settings_label(document)}")
    rows: list[tuple[str, Any]] = [
        ("completed / jobs", lambda m: f"{m['completed']}/{m['jobs']}"),
        ("cost USD", lambda m: f"{m['cost_usd']:,.0f}"),
        ("lower bound USD", lambda m: f"{m['cost_lower_bound_usd']:,.0f}"),
        ("cost / lower bound", lambda m: f"{m['cost_vs_lower_bound']:.2f}x"),
        ("GPU-h paid", lambda m: f"{m['gpu_hours_paid']:,.0f}"),
        ("GPU-h useful", lambda m: f"{m['gpu_hours_useful']:,.0f}"),
        ("utilization", lambda m: f"{m['utilization']:.1%}"),
        ("wait p50 s", lambda m: f"{m['wait_seconds']['p50']:,.0f}"),
        ("wait p95 s", lambda m: f"{m['wait_seconds']['p95']:,.0f}"),
        ("wait max s", lambda m: f"{m['wait_seconds']['max']:,.0f}"),
        *(
            (f"wait p95 s {p}", lambda m, p=p: _p95_of(m, p))
            for p in ("critical", "high", "normal", "low")
            if any(p in m["wait_seconds"]["by_priority"] for m in document["policies"].values())
        ),
        ("JCT p50 s", lambda m: f"{m['jct_seconds']['p50']:,.0f}"),
        ("interruptions", lambda m: str(m["interruptions"])),
        ("requeues", lambda m: str(m["requeues"])),
        ("on-demand fallbacks", lambda m: str(m["ondemand_fallbacks"])),
        ("preemptions", lambda m: str(m["preemptions"])),
        ("failed", lambda m: str(m["failed"])),
    ]
    metrics = document["policies"]
    width = max(14, *(len(n) + 2 for n in metrics))
    print(f"{'':22}" + "".join(f"{name:>{width}}" for name in metrics))
    for label, cell in rows:
        print(f"{label:22}" + "".join(f"{cell(m):>{width}}" for m in metrics.values()))
    for r in results:
        print(f"  {r.policy}: {r.wall_seconds:.2f} s simulated wall, {r.dispatch_passes} passes")
    print(f"sim wall: {document['sim_wall_seconds']:.2f} s")


def _p95_of(metrics: dict[str, Any], priority: str) -> str:
    by = metrics["wait_seconds"]["by_priority"].get(priority)
    return f"{by['p95']:,.0f}" if by else "-"
