"""`gpufleet logs ID`: a job's container output, from the node agent's CloudWatch log group.

    gpufleet logs ID [--follow] [--json] [--raw]

Each run of the job on each instance is its own stream (`<job id>/<instance id>`); the events
of every stream come interleaved by time. `--follow` keeps reading until the job has ended, then
says how it ended and exits with the job's code (`job_exit_code`), as `gpufleet run` does.
`--json` prints one JSON object per line (`{"event": "log", ...}`, and with `--follow` a last
`{"event": "ended", ...}`), so that a follow can be piped. A line is the job's own output:
control characters in it are printed escaped (`--raw`: as they are).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpufleet import topology
from gpufleet.cli.output import EXIT_INTERRUPTED, CliError, ErrorCode
from gpufleet.cli.table import add_raw_argument, printable
from gpufleet.cli.target import Connection, add_target_arguments, connect
from gpufleet.domain.job import JobStatus

if TYPE_CHECKING:
    from gpufleet.domain.job import Job

# FilterLogEvents takes at most this many stream names per call.
_STREAMS_PER_CALL = 100
# The exit codes of a job that has no code of its own (docs/cli.md, `gpufleet run`).
EXIT_JOB_FAILED = 125  # FAILED without an exit code: no capacity, timeout, lost node, budget
EXIT_JOB_CANCELLED = 126


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "logs", help="a job's container output (CloudWatch Logs)"
    )
    parser.add_argument("job_id", metavar="ID")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new output until the job ends, then exit with its code",
    )
    add_poll_argument(parser)
    add_target_arguments(parser)
    add_raw_argument(parser)
    parser.set_defaults(run=run)


def add_poll_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=2.0,
        help="between reads when following (%(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    connection = connect(args)
    job = connection.jobs.get(args.job_id)
    printed = 0

    def show(event: dict[str, Any]) -> None:
        nonlocal printed
        printed += 1
        print(log_line(event, args.json, args.raw), flush=True)

    if not args.follow:
        LogReader(connection, job.job_id).read(show)
        if not printed and not args.json:
            print(f"(no output from {args.job_id} yet)")
        return 0
    try:
        job = follow_job(connection, job, args.poll_seconds, on_event=show)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return report_end(job, args.json, args.raw)


class LogReader:
    """The job's output, read again and again: each read yields only events not seen yet."""

    def __init__(self, connection: Connection, job_id: str) -> None:
        if connection.agent_log_group is None:
            raise CliError(
                "no agent log group: give --stack NAME, or set " + topology.ENV_AGENT_LOG_GROUP,
                ErrorCode.NO_TARGET,
            )
        self._group = connection.agent_log_group
        self._logs = connection.client("logs")
        self._job_id = job_id
        self._seen: set[str] = set()
        self._start = 0

    def read(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        try:
            for event in _events(self._logs, self._group, self._job_id, self._start):
                if event["eventId"] in self._seen:
                    continue
                self._seen.add(event["eventId"])
                self._start = max(self._start, int(event["timestamp"]))
                on_event(event)
        except self._logs.exceptions.ResourceNotFoundException:
            raise CliError(f"log group {self._group} does not exist", ErrorCode.NOT_FOUND) from None


def follow_job(
    connection: Connection,
    job: Job,
    poll_seconds: float,
    on_event: Callable[[dict[str, Any]], None],
    on_job: Callable[[Job], None] | None = None,
) -> Job:
    """Print the job's output as it comes until the job has ended; `on_job` hears every new
    read of the job. The job as it ended."""
    reader = LogReader(connection, job.job_id)
    while True:
        if on_job is not None:
            on_job(job)
        ended = job.status.terminal  # read before the events: none written after are lost
        reader.read(on_event)
        if ended:
            return job
        time.sleep(poll_seconds)
        job = connection.jobs.get(job.job_id)


def job_exit_code(job: Job) -> int:
    """The code `run` and `logs --follow` exit with: the job's own, 0 when it succeeded;
    EXIT_JOB_FAILED for a failure without one, EXIT_JOB_CANCELLED when it was cancelled."""
    if job.status is JobStatus.SUCCEEDED:
        return 0
    if job.status is JobStatus.CANCELLED:
        return EXIT_JOB_CANCELLED
    return job.exit_code if job.exit_code else EXIT_JOB_FAILED


def job_event(event: str, job: Job) -> dict[str, Any]:
    """What every event of a followed job says: which job, its status, where it runs."""
    placement = job.placement
    return {
        "event": event,
        "job_id": job.job_id,
        "status": job.status.value,
        "instance_type": placement.instance_type if placement else None,
        "capacity_type": placement.capacity_type if placement else None,
        "zone": placement.zone if placement else None,
    }


def ending(job: Job) -> dict[str, Any]:
    """How the job ended, as the last line of a follow says it."""
    from gpufleet.services.reports import job_costs, utc_time

    return {
        **job_event("ended", job),
        "exit_code": job.exit_code,
        "failure_reason": job.failure_reason,
        "cost_usd": job_costs(job)["cost_usd"],
        "ended_at": utc_time(job.updated_at),
        "cli_exit_code": job_exit_code(job),
    }


def report_end(job: Job, as_json: bool, raw: bool) -> int:
    """Say how the job ended (stdout with --json, stderr for people); its exit code."""
    end = ending(job)
    if as_json:
        print(json.dumps(end), flush=True)
    else:
        where = end["instance_type"] or "no instance"
        if end["capacity_type"]:
            where += f" ({end['capacity_type']})"
        text = f"{job.job_id}: {end['status']} on {where}"
        if end["exit_code"] is not None:
            text += f", exit code {end['exit_code']}"
        reason = end["failure_reason"]
        if (
            reason
            and job.status is not JobStatus.SUCCEEDED
            and reason != f"exit code {job.exit_code}"
        ):
            text += f" ({reason})"
        text += f", cost ${end['cost_usd'] or 0:.6f}"
        print(f"gpufleet: {printable(text, raw)}", file=sys.stderr, flush=True)
    return int(end["cli_exit_code"])


def _events(logs: Any, group: str, job_id: str, start: int) -> Iterator[dict[str, Any]]:
    """The job's events from `start` (epoch ms) on, in time order per batch of streams."""
    streams = _streams(logs, group, job_id)
    for first in range(0, len(streams), _STREAMS_PER_CALL):
        request: dict[str, Any] = {
            "logGroupName": group,
            "logStreamNames": streams[first : first + _STREAMS_PER_CALL],
            "startTime": start,
        }
        while True:
            page = logs.filter_log_events(**request)
            yield from page.get("events", [])
            token = page.get("nextToken")
            if not token or token == request.get("nextToken"):
                break
            request["nextToken"] = token


def _streams(logs: Any, group: str, job_id: str) -> list[str]:
    names: list[str] = []
    paginator = logs.get_paginator("describe_log_streams")
    prefix = topology.agent_log_stream_prefix(job_id)
    for page in paginator.paginate(logGroupName=group, logStreamNamePrefix=prefix):
        names += [stream["logStreamName"] for stream in page.get("logStreams", [])]
    return names


def log_line(event: dict[str, Any], as_json: bool, raw: bool) -> str:
    from gpufleet.services.reports import utc_time

    instance = str(event["logStreamName"]).rpartition("/")[2]
    when = utc_time(int(event["timestamp"]) / 1000)
    if as_json:
        return json.dumps(
            {"event": "log", "time": when, "instance_id": instance, "message": event["message"]}
        )
    return printable(f"{when}  {instance}  {event['message'].rstrip()}", raw)
