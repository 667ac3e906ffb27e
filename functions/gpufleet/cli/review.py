"""`gpufleet review`: what to change, from the stack's job records and their usage.

    gpufleet review [--since 30d] [--team T] [--json] [--out DIR]

Right-size, waste and commitments (rules and their assumptions: `domain/review.py`), in dollars
at the bundled catalog's on-demand prices for the stack's region, over the jobs submitted in
the window. `--out DIR` also writes DIR/index.html with the same tables (HTML-escaped).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import html
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.cli.output import invalid, print_json
from gpufleet.cli.table import add_raw_argument, render
from gpufleet.cli.target import add_target_arguments, connect
from gpufleet.domain.forecast import HOUR, Interval, backtest, forecast, hourly_gpu_hours
from gpufleet.domain.review import (
    CAPACITY_BLOCKS,
    ReviewedJob,
    booked_block_prices,
    capacity_block_break_even,
    commitments,
    right_size,
    spend,
    waste,
)

if TYPE_CHECKING:
    from gpufleet.domain.boot import BootTarget
    from gpufleet.domain.catalog import Catalog
    from gpufleet.domain.job import Job, JobStatus
    from gpufleet.ports import UsageReader

ALL_JOBS = 100_000
DEFAULT_SINCE = "30d"
RIGHT_SIZE_COLUMNS = (
    ("team", "team"),
    ("name", "name"),
    ("jobs", "jobs"),
    ("instance_type", "ran on"),
    ("suggested_type", "fits"),
    ("node_hours", "node-h"),
    ("saving_usd", "saving $"),
)
WASTE_COLUMNS = (
    ("team", "team"),
    ("name", "name"),
    ("idle_gpu_hours", "idle GPU-h"),
    ("idle_usd", "idle $"),
    ("held_after_hours", "after-end GPU-h"),
    ("held_after_usd", "after-end $"),
    ("rework_hours", "rework GPU-h"),
    ("rework_usd", "rework $"),
)
COMMITMENT_COLUMNS = (
    ("family", "family"),
    ("on_demand_usd", "on-demand $"),
    ("baseline_usd_per_hour", "baseline $/h"),
    ("plan", "plan"),
    ("discount", "discount"),
    ("break_even_utilization", "break-even"),
    ("commit_usd_per_hour", "commit $/h"),
    ("saving_usd", "saving $"),
)


class JobLister(Protocol):
    """What the review reads of a job store (`ports.JobStore`, or a folder of records)."""

    def list_jobs(self, status: JobStatus | None = None, limit: int = 1000) -> list[Job]: ...


Source = tuple[JobLister, "UsageReader"]

FORECAST_COLUMNS = (("team", "team"), *((f"d{n}", f"day {n} GPU-h") for n in range(1, 8)))


def register(commands: Any) -> None:
    review = commands.add_parser(
        "review", help="right-size, waste and commitments from the jobs' records and usage"
    )
    review.add_argument(
        "--since",
        help="the window, back from now (default 30d; with --records, the records' window)",
    )
    review.add_argument("--team", help="only this team's jobs")
    review.add_argument(
        "--capacity-block",
        action="append",
        default=[],
        metavar="TYPE=USD",
        help="a Capacity Block's price per instance-hour (its upfront fee / hours / instances) "
        "for TYPE: the review prints the use at which it breaks even (repeatable)",
    )
    review.add_argument("--out", type=Path, help="also write DIR/index.html")
    review.add_argument(
        "--records",
        type=Path,
        metavar="DIR",
        help="review the job records and usage in DIR (`gpufleet simulate --records DIR`), "
        "not the stack's; the window ends at the records' end",
    )
    add_target_arguments(review)
    add_raw_argument(review)
    review.set_defaults(run=run_review)


def _window(since: str) -> int:
    from gpufleet.domain.spec import parse_duration

    try:
        return parse_duration(since)
    except ValueError as exc:
        raise invalid(f"--since: {exc}") from None


def _source(
    args: argparse.Namespace,
) -> tuple[Source, str, frozenset[BootTarget], float, float, dict[str, float]]:
    """Where the records are read (the stack, or a folder of them), the region, the
    deployment's bootable targets, the window and the prices of the Capacity Blocks the
    stack's config books (a folder of records has no config)."""
    if args.records is None:
        window = _window(args.since or DEFAULT_SINCE)  # bad input refused before connecting
        connection = connect(args)
        now = time.time()
        settings = connection.settings
        start = now - window
        booked = booked_block_prices(settings.config.reservations)
        return (
            (connection.jobs, connection.usage),
            settings.region,
            settings.bootable,
            start,
            now,
            booked,
        )
    from gpufleet.adapters.local.records import RecordsError, RecordsFolder
    from gpufleet.domain.boot import STOCK_TARGETS

    try:
        folder = RecordsFolder(args.records)
    except RecordsError as exc:
        raise invalid(str(exc)) from None
    export = folder.export
    start = export.start if args.since is None else export.end - _window(args.since)
    return (folder, folder), export.region, STOCK_TARGETS, start, export.end, {}


def _block_prices(given: Sequence[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for item in given:
        name, _, price = item.partition("=")
        try:
            value = float(price)
        except ValueError:
            value = math.nan
        if not name or not math.isfinite(value) or value <= 0:
            raise invalid(f"--capacity-block {item!r}: expected TYPE=USD, a positive price")
        prices[name] = value
    return prices


def run_review(args: argparse.Namespace) -> int:
    from gpufleet.domain.catalog import load_bundled

    given = _block_prices(args.capacity_block)  # bad input refused before reading
    (store, usage), region, bootable, start, now, booked = _source(args)
    block_prices = {**booked, **given}  # a price given on the command line wins
    with _no_cycle_collection():
        jobs = [
            job
            for job in store.list_jobs(limit=ALL_JOBS)
            if job.created_at >= start and (args.team is None or job.spec.team == args.team)
        ]
        reviewed = [
            ReviewedJob(job, tuple(usage.summaries_of_job(job.job_id)) if job.placement else ())
            for job in jobs
        ]
        catalog = load_bundled()
        document = review_document(reviewed, catalog, region, bootable, start, now)
    document["capacity_block_break_even"] = [
        asdict(b) for b in capacity_block_break_even(block_prices, catalog, region, bootable)
    ]
    document["since"] = args.since or (DEFAULT_SINCE if args.records is None else "the records")
    document["team"] = args.team
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "index.html").write_text(render_page(document))
    if args.json:
        print_json(document)
    else:
        print(render_text(document, args.raw))
    return 0


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cycle collector paused while the records are read: they are trees (no cycles to
    free), and a month's hold millions of objects that each full collection walks again (a
    third of the review's CPU on a Philly month)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def review_document(
    reviewed: Sequence[ReviewedJob],
    catalog: Catalog,
    region: str,
    bootable: frozenset[BootTarget],
    start: float,
    end: float,
) -> dict[str, Any]:
    sized = right_size(reviewed, catalog, region, bootable)
    origin = start - start % HOUR
    series = hourly_gpu_hours((used_interval(r.job, end) for r in reviewed), origin, end)
    checked = backtest(series)
    return {
        "region": region,
        "jobs": len(reviewed),
        "with_usage": sum(1 for r in reviewed if r.nodes),
        "spend": asdict(spend((r.job for r in reviewed), catalog, end)),
        "right_size": [asdict(r) for r in sized],
        "waste": [asdict(w) for w in waste(reviewed)],
        "commitments": [asdict(c) for c in commitments([r.job for r in reviewed], start, end)],
        "capacity_blocks": CAPACITY_BLOCKS,
        "forecast_gpu_hours": forecast(series),
        "forecast_backtest": asdict(checked),
    }


def used_interval(job: Job, now: float) -> Interval:
    """The GPUs a job held, from its (last) launch to its release (or now)."""
    placement = job.placement
    start = placement.launched_at if placement else job.created_at
    end = job.released_at if job.released_at is not None else (now if placement else start)
    gpus = job.effective_spec.resources.total_gpus
    return (job.spec.team, start, end, gpus)


def render_text(document: Mapping[str, Any], raw: bool = False) -> str:
    parts = [
        f"{document['jobs']} job(s), {document['with_usage']} with usage, in {document['region']}",
        spend_line(document["spend"]),
    ]
    for title, key, columns in (
        ("right-size", "right_size", RIGHT_SIZE_COLUMNS),
        ("waste", "waste", WASTE_COLUMNS),
        ("commitments", "commitments", COMMITMENT_COLUMNS),
    ):
        rows = document[key]
        parts.append(f"\n{title}:\n" + (render(rows, columns, raw) if rows else "(none)"))
    sources = sorted({c["source"] for c in document["commitments"]})
    if sources:
        parts.append("\ndiscounts from:\n" + "\n".join(f"  {s}" for s in sources))
    parts.append(f"\n{document['capacity_blocks']}")
    parts.extend(block_line(b) for b in document.get("capacity_block_break_even", []))
    parts.append("\nforecast, GPU-hours per day for the next 7 days:")
    for team, days in sorted(document["forecast_gpu_hours"].items()):
        parts.append(f"  {team}: " + " ".join(f"{v:g}" for v in days))
    parts.append(backtest_line(document["forecast_backtest"]))
    return "\n".join(parts)


def spend_line(spent: Mapping[str, Any]) -> str:
    return (
        f"spend: ${spent['cost_usd']:,.2f} for {spent['gpu_hours']:,.1f} GPU-hours held by "
        f"{spent['launched']} launched job(s)"
    )


def block_line(block: Mapping[str, Any]) -> str:
    return (
        f"  {block['instance_type']}: a block at ${block['block_usd_per_hour']:g}/h against "
        f"${block['on_demand_usd_per_hour']:g}/h on-demand breaks even at "
        f"{block['break_even_utilization']:.0%} of its hours"
    )


def backtest_line(checked: Mapping[str, Any]) -> str:
    if checked["wape"] is None:
        return "forecast error: needs two weeks of history to backtest"
    return (
        f"forecast error (backtest over {checked['cuts']} week(s), {checked['team_days']} "
        f"team-days): WAPE {checked['wape']:.1%}"
    )


def render_page(document: Mapping[str, Any]) -> str:
    e = html.escape

    def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
        if not rows:
            return "<p>(none)</p>"
        head = "".join(f"<th>{e(label)}</th>" for _, label in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(str(row[key]))}</td>" for key, _ in columns) + "</tr>"
            for row in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    forecast_rows = [
        {"team": team, **{f"d{n}": v for n, v in enumerate(days, start=1)}}
        for team, days in sorted(document["forecast_gpu_hours"].items())
    ]
    sources = "".join(
        f"<li>{e(s)}</li>" for s in sorted({c["source"] for c in document["commitments"]})
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpufleet review</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
</style></head><body>
<h1>gpufleet review</h1>
<p>{document["jobs"]} job(s), {document["with_usage"]} with usage, in {e(document["region"])},
since {e(str(document.get("since")))}, team {e(str(document.get("team") or "all"))}</p>
<p>{e(spend_line(document["spend"]))}</p>
<h2>Right-size</h2>{table(document["right_size"], RIGHT_SIZE_COLUMNS)}
<h2>Waste</h2>{table(document["waste"], WASTE_COLUMNS)}
<h2>Commitments</h2>{table(document["commitments"], COMMITMENT_COLUMNS)}
<p>Discounts from:</p><ul>{sources}</ul>
<p>{e(document["capacity_blocks"])}</p>
{"".join(f"<p>{e(block_line(b))}</p>" for b in document.get("capacity_block_break_even", []))}
<h2>Forecast</h2>{table(forecast_rows, FORECAST_COLUMNS)}
<p>{e(backtest_line(document["forecast_backtest"]))}</p>
</body></html>
"""
