"""`gpufleet queue`, `gpufleet cancel ID`, `gpufleet book`: the admission queue by hand."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from gpufleet.cli.table import add_raw_argument, printable
from gpufleet.cli.target import TargetError, add_target_arguments, connect, fail


def register(commands: Any) -> None:
    queue = commands.add_parser(
        "queue", help="waiting jobs in admission order, with the reason each waits"
    )
    add_target_arguments(queue)
    queue.add_argument("--json", action="store_true")
    add_raw_argument(queue)
    queue.set_defaults(run=run_queue)

    cancel = commands.add_parser("cancel", help="cancel a waiting or running job")
    cancel.add_argument("job_id", metavar="ID")
    add_target_arguments(cancel)
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(run=run_cancel)

    resize = commands.add_parser(
        "resize", help="give a job a new shape; a running job checkpoints and resumes on it"
    )
    resize.add_argument("job_id", metavar="ID")
    resize.add_argument("--gpus", type=int, help="GPUs per node")
    resize.add_argument("--nodes", type=int)
    resize.add_argument("--gpu-memory-gib", type=float)
    add_target_arguments(resize)
    resize.add_argument("--json", action="store_true")
    resize.set_defaults(run=run_resize)

    book = commands.add_parser("book", help="book GPUs for a team over a future window")
    book.add_argument("--team", required=True)
    book.add_argument("--gpus", type=int, required=True)
    book.add_argument(
        "--from", dest="start", required=True, help="ISO time, e.g. 2026-12-01T08:00Z"
    )
    book.add_argument("--to", dest="end", required=True, help="ISO time")
    add_target_arguments(book)
    book.add_argument("--json", action="store_true")
    book.set_defaults(run=run_book)


def run_queue(args: argparse.Namespace) -> int:
    from gpufleet.services.dispatcher import queue_listing

    try:
        connection = connect(args)
        ports = connection.ports
    except TargetError as exc:
        return fail(str(exc))
    rows, bookings = queue_listing(ports, connection.settings.config.queue)
    names = {row.job_id: ports.jobs.get(row.job_id).spec.name for row in rows}
    if args.json:
        document = {
            "waiting": [{**asdict(row), "name": names[row.job_id]} for row in rows],
            "bookings": [asdict(b) for b in bookings],
        }
        print(json.dumps(document, indent=2))
        return 0
    header = (
        f"{'#':>3}  {'job':<24}{'name':<20}{'team':<12}{'priority':<10}{'gpus':>5}  "
        f"{'waited':>8}  reason"
    )
    print(header)
    for row in rows:
        print(
            printable(
                f"{row.position:>3}  {row.job_id:<24}{names[row.job_id]:<20}{row.team:<12}"
                f"{row.priority:<10}{row.gpus:>5}  {row.waited_seconds:>7.0f}s  {row.reason}",
                args.raw,
            )
        )
    if not rows:
        print("  (no job is waiting)")
    for booking in bookings:
        start = datetime.fromtimestamp(booking.start, UTC).isoformat(timespec="minutes")
        end = datetime.fromtimestamp(booking.end, UTC).isoformat(timespec="minutes")
        line = f"booked: {booking.team} {booking.gpus} GPUs {start} .. {end} ({booking.booking_id})"
        print(printable(line, args.raw))
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    from gpufleet.domain.job import JobNotFound
    from gpufleet.services.lifecycle_base import JobAlreadyEnded

    try:
        summary = connect(args).lifecycle.cancel(args.job_id)
    except (TargetError, JobNotFound, JobAlreadyEnded) as exc:
        return fail(str(exc))
    print(json.dumps(summary, indent=2) if args.json else f"{args.job_id}: {summary['status']}")
    return 0


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def run_book(args: argparse.Namespace) -> int:
    from gpufleet.domain.queueing import BookingRefused
    from gpufleet.services.bookings import book

    try:
        start, end = _parse_time(args.start), _parse_time(args.end)
    except ValueError as exc:
        return fail(f"bad time: {exc}")
    try:
        connection = connect(args)
        booking = book(
            connection.ports, connection.settings.config.queue, args.team, args.gpus, start, end
        )
    except (TargetError, BookingRefused) as exc:
        return fail(str(exc))
    print(json.dumps(asdict(booking)) if args.json else f"booked {booking.booking_id}")
    return 0


def run_resize(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gpufleet.domain.job import JobNotFound
    from gpufleet.domain.selection import NoFeasibleOffering
    from gpufleet.services.lifecycle_base import JobAlreadyEnded

    changes = {
        key: value
        for key, value in (
            ("gpus", args.gpus),
            ("nodes", args.nodes),
            ("gpu_memory_gib", args.gpu_memory_gib),
        )
        if value is not None
    }
    if not changes:
        return fail("give at least one of --gpus, --nodes, --gpu-memory-gib")
    try:
        summary = connect(args).lifecycle.resize(args.job_id, changes)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        return fail(f"invalid shape: {where + ': ' if where else ''}{error['msg']}")
    except (TargetError, JobNotFound, JobAlreadyEnded, NoFeasibleOffering) as exc:
        return fail(str(exc))
    print(json.dumps(summary, indent=2) if args.json else f"{args.job_id}: resized")
    return 0
