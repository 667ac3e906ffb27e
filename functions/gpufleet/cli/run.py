"""`gpufleet run SPEC`: submit a job, follow it to its end, exit with its exit code.

    gpufleet run job.yaml [--wait 30] [--poll-seconds 2] [--cancel-on-interrupt] [--json] [--raw]

The spec is submitted as `gpufleet submit` submits it (same checks, same upload). Then each
change of the job's status (with where it runs) is printed on stderr and the container's output
on stdout, as it comes, until the job has ended; the last line says how it ended. The exit code
is the job's: 0 when it succeeded, the container's exit code when it failed with one, 125 when
it failed without one (no capacity, timeout, a lost node, its budget), 126 when it was
cancelled; before the job exists, the contract's 2 or 1. Ctrl-C detaches (exit 130) and leaves
the job running (`gpufleet logs ID --follow` picks it up again), unless `--cancel-on-interrupt`
cancels it first. `--json` prints one JSON object per line on stdout: `submitted`, `status`,
`log`, then `ended` (or `detached` / `cancelled`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

from gpufleet.cli.jobs import add_submit_wait, submit_file
from gpufleet.cli.logs import add_poll_argument, follow_job, job_event, log_line, report_end
from gpufleet.cli.output import EXIT_INTERRUPTED, EXIT_UNEXPECTED, CliError, ErrorCode
from gpufleet.cli.table import add_raw_argument, printable
from gpufleet.cli.target import add_target_arguments

if TYPE_CHECKING:
    from gpufleet.domain.job import Job


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="submit a job, stream its status and output, exit with its exit code",
        description="Submit a job spec (as `submit` does), print its status changes (stderr) "
        "and its output (stdout) until it ends, and exit with its exit code.",
    )
    parser.add_argument("file", metavar="SPEC", help="job spec, YAML or JSON")
    add_submit_wait(parser)
    add_poll_argument(parser)
    parser.add_argument(
        "--cancel-on-interrupt",
        action="store_true",
        help="Ctrl-C cancels the job (default: Ctrl-C detaches and the job keeps running)",
    )
    add_target_arguments(parser)
    add_raw_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    connection, upload, job_ids, job = submit_file(args)
    job_id = job_ids[0]  # a `jobs:` list: its first job, which the others follow
    _say(args, {"event": "submitted", "job_id": job_id, "key": upload.key}, f"{job_id} submitted")
    if job is None:
        raise CliError(
            f"the control plane has not recorded {job_id} within --wait {args.wait:g} s; "
            f"`gpufleet logs {job_id} --follow` follows it once it has",
            ErrorCode.UNEXPECTED,
            {"job_id": job_id},
            EXIT_UNEXPECTED,
        )
    shown: tuple[str, str | None] | None = None

    def on_job(current: Job) -> None:
        nonlocal shown
        placement = current.placement
        state = (current.status.value, placement.instance_type if placement else None)
        if state != shown:
            shown = state
            _say(args, _status_event(current), _status_text(current))

    def on_event(event: dict[str, Any]) -> None:
        print(log_line(event, args.json, args.raw), flush=True)

    try:
        job = follow_job(connection, job, args.poll_seconds, on_event=on_event, on_job=on_job)
    except KeyboardInterrupt:
        return _interrupted(args, connection, job_id)
    return report_end(job, args.json, args.raw)


def _interrupted(args: argparse.Namespace, connection: Any, job_id: str) -> int:
    if not args.cancel_on_interrupt:
        _say(
            args,
            {"event": "detached", "job_id": job_id},
            f"detached; {job_id} keeps running: `gpufleet logs {job_id} --follow` follows it, "
            f"`gpufleet cancel {job_id}` cancels it",
        )
        return EXIT_INTERRUPTED
    from gpufleet.services.lifecycle_base import JobAlreadyEnded

    with contextlib.suppress(JobAlreadyEnded):  # it ended meanwhile
        connection.lifecycle.cancel(job_id)
    status = connection.jobs.get(job_id).status.value
    _say(args, {"event": "cancelled", "job_id": job_id, "status": status}, f"{job_id}: {status}")
    return EXIT_INTERRUPTED


def _status_event(job: Job) -> dict[str, Any]:
    from gpufleet.services.reports import utc_time

    return {**job_event("status", job), "time": utc_time(job.updated_at), "stage": job.stage_name}


def _status_text(job: Job) -> str:
    event = _status_event(job)
    text = f"{event['time']}  {job.job_id}  {event['status']}"
    if event["stage"]:
        text += f"  stage {event['stage']}"
    if event["instance_type"]:
        text += f"  on {event['instance_type']} ({event['capacity_type']})"
    return text


def _say(args: argparse.Namespace, event: dict[str, Any], text: str) -> None:
    """Progress: a JSON line on stdout with --json, a line on stderr for people."""
    if args.json:
        print(json.dumps(event), flush=True)
    else:
        print(f"gpufleet: {printable(text, args.raw)}", file=sys.stderr, flush=True)
