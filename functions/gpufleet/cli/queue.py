"""`gpufleet queue`, `gpufleet cancel ID`, `gpufleet resize ID`, `gpufleet book`: the admission
queue by hand. Times are printed (and read) as ISO 8601, UTC."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpufleet.cli.output import invalid, print_json
from gpufleet.cli.table import add_raw_argument, printable
from gpufleet.cli.target import add_target_arguments, connect

if TYPE_CHECKING:
    from gpufleet.domain.queueing import Booking


def register(commands: Any) -> None:
    queue = commands.add_parser(
        "queue", help="waiting jobs in admission order, with the reason each waits"
    )
    add_target_arguments(queue)
    add_raw_argument(queue)
    queue.set_defaults(run=run_queue)

    cancel = commands.add_parser("cancel", help="cancel a waiting or running job")
    cancel.add_argument("job_id", metavar="ID")
    add_target_arguments(cancel)
    cancel.set_defaults(run=run_cancel)

    resize = commands.add_parser(
        "resize", help="give a job a new shape; a running job checkpoints and resumes on it"
    )
    resize.add_argument("job_id", metavar="ID")
    resize.add_argument("--gpus", type=int, help="GPUs per node")
    resize.add_argument("--nodes", type=int)
    resize.add_argument("--gpu-memory-gib", type=float)
    add_target_arguments(resize)
    resize.set_defaults(run=run_resize)

    book = commands.add_parser(
        "book", help="book GPUs for a team over a future window; --list, --cancel ID"
    )
    action = book.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="the bookings, by start")
    action.add_argument("--cancel", metavar="ID", help="cancel a booking")
    book.add_argument("--team")
    book.add_argument("--gpus", type=int)
    book.add_argument("--from", dest="start", help="ISO time, e.g. 2026-12-01T08:00Z")
    book.add_argument("--to", dest="end", help="ISO time")
    add_target_arguments(book)
    book.set_defaults(run=run_book)


def booking_document(booking: Booking) -> dict[str, Any]:
    """A booking as every command prints it: its window in ISO 8601."""
    from gpufleet.services.reports import utc_time

    return {**asdict(booking), "start": utc_time(booking.start), "end": utc_time(booking.end)}


def run_queue(args: argparse.Namespace) -> int:
    from gpufleet.services.queue_listing import queue_listing

    connection = connect(args)
    ports = connection.ports
    rows, bookings = queue_listing(ports, connection.settings.config.queue)
    names = {row.job_id: ports.jobs.get(row.job_id).spec.name for row in rows}
    if args.json:
        print_json(
            {
                "waiting": [{**asdict(row), "name": names[row.job_id]} for row in rows],
                "bookings": [booking_document(b) for b in bookings],
            }
        )
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
        shown = booking_document(booking)
        line = (
            f"booked: {booking.team} {booking.gpus} GPUs {shown['start']} .. {shown['end']} "
            f"({booking.booking_id})"
        )
        print(printable(line, args.raw))
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    summary = connect(args).lifecycle.cancel(args.job_id)
    if args.json:
        print_json(summary)
    else:
        print(f"{args.job_id}: {summary['status']}")
    return 0


def _parse_time(text: str) -> float:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # as every time the CLI prints: UTC
    return moment.timestamp()


def _print_booking(args: argparse.Namespace, booking: Booking, verb: str) -> None:
    shown = booking_document(booking)
    if args.json:
        print_json(shown)
    else:
        line = (
            f"{verb} {booking.booking_id}: {booking.team} {booking.gpus} GPUs "
            f"{shown['start']} .. {shown['end']}"
        )
        print(printable(line, False))


def run_book(args: argparse.Namespace) -> int:
    from gpufleet.services.bookings import book, cancel

    if args.list or args.cancel:
        if any(v is not None for v in (args.team, args.gpus, args.start, args.end)):
            raise invalid("--list and --cancel take no --team, --gpus, --from or --to")
        connection = connect(args)
        if args.cancel:
            _print_booking(args, cancel(connection.ports, args.cancel), "cancelled")
            return 0
        bookings = sorted(connection.ports.queue.bookings(), key=lambda b: b.start)
        if args.json:
            print_json({"bookings": [booking_document(b) for b in bookings]})
            return 0
        for booking in bookings:
            _print_booking(args, booking, "booked")
        if not bookings:
            print("  (no booking)")
        return 0
    missing = [
        f"--{n}"
        for n, v in (
            ("team", args.team),
            ("gpus", args.gpus),
            ("from", args.start),
            ("to", args.end),
        )
        if v is None
    ]
    if missing:
        raise invalid(f"a booking needs {', '.join(missing)}")
    try:
        start, end = _parse_time(args.start), _parse_time(args.end)
    except ValueError as exc:
        raise invalid(f"bad time (ISO 8601, e.g. 2026-12-01T08:00Z): {exc}") from None
    connection = connect(args)
    booking = book(
        connection.ports, connection.settings.config.queue, args.team, args.gpus, start, end
    )
    _print_booking(args, booking, "booked")
    return 0


def run_resize(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

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
        raise invalid("give at least one of --gpus, --nodes, --gpu-memory-gib")
    try:
        summary = connect(args).lifecycle.resize(args.job_id, changes)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise invalid(f"invalid shape: {where + ': ' if where else ''}{error['msg']}") from None
    if args.json:
        print_json(summary)
    else:
        print(f"{args.job_id}: resized")
    return 0
