"""`gpufleet cost`: what jobs cost, added up by team, job or day.

    gpufleet cost [--by team|job|day] [--since YYYY-MM-DD] [--json]

A job's cost counts on the UTC day it was submitted; `--since` keeps the jobs submitted on or
after that day. The columns are whatever the control plane's cost report holds (held seconds,
cost, storage, ...); prices per hour are shown per job, never added up.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime
from typing import Any

from gpufleet.cli.output import print_json
from gpufleet.cli.table import add_raw_argument, render
from gpufleet.cli.target import add_target_arguments, connect

# Every job the store holds is read: a report over all of history is the point.
ALL_JOBS = 1_000_000


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "cost", help="what jobs cost, by team, job or day"
    )
    parser.add_argument(
        "--by", choices=("team", "job", "day"), default="team", help="group by (%(default)s)"
    )
    parser.add_argument(
        "--since", type=_day, metavar="YYYY-MM-DD", help="jobs submitted on or after this day"
    )
    add_target_arguments(parser)
    add_raw_argument(parser)
    parser.set_defaults(run=run)


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day (YYYY-MM-DD): {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from gpufleet.services.reports import (
        LINE_IDENTITY,
        CostGrouping,
        cost_lines,
        figures,
        group_costs,
        total_cost,
    )

    connection = connect(args)
    since = (
        datetime.combine(args.since, datetime.min.time(), UTC).timestamp() if args.since else None
    )
    lines = cost_lines(connection.jobs.list_jobs(limit=ALL_JOBS), since)
    by = CostGrouping(args.by)
    rows = group_costs(lines, by)
    total = total_cost(lines)
    if args.json:
        document = {
            "by": by.value,
            "since": args.since.isoformat() if args.since else None,
            "rows": rows,
            "total": total,
        }
        print_json(document)
        return 0
    if not rows:
        print("(no jobs)")
        return 0
    who = list(LINE_IDENTITY) if by is CostGrouping.JOB else [by.value, "jobs"]
    columns = [(name, name) for name in who + figures(rows)]
    print(render([*rows, {by.value: "total", **total}], columns, args.raw))
    return 0
