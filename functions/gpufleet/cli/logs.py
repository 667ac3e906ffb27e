"""`gpufleet logs ID`: a job's container output, from the node agent's CloudWatch log group.

    gpufleet logs ID [--follow] [--json] [--raw]

Each run of the job on each instance is its own stream (`<job id>/<instance id>`); the events
of every stream come interleaved by time. `--follow` keeps reading until the job has ended.
`--json` prints one JSON object per event and line, so that a follow can be piped. A line is the
job's own output: control characters in it are printed escaped (`--raw`: as they are).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

from gpufleet import topology
from gpufleet.cli.table import add_raw_argument, printable
from gpufleet.cli.target import TargetError, add_target_arguments, connect, fail
from gpufleet.domain.job import JobNotFound

# FilterLogEvents takes at most this many stream names per call.
_STREAMS_PER_CALL = 100


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "logs", help="a job's container output (CloudWatch Logs)"
    )
    parser.add_argument("job_id", metavar="ID")
    parser.add_argument(
        "--follow", action="store_true", help="keep printing new output until the job ends"
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=2.0,
        help="between reads when following (%(default)s)",
    )
    add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    add_raw_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        connection = connect(args)
        job = connection.jobs.get(args.job_id)
    except (TargetError, JobNotFound) as exc:
        return fail(str(exc))
    if connection.agent_log_group is None:
        return fail("no agent log group: give --stack NAME, or set " + topology.ENV_AGENT_LOG_GROUP)
    logs = connection.client("logs")
    seen: set[str] = set()
    printed = 0
    start = 0
    try:
        while True:
            ended = job.status.terminal  # read before the events: none written after are lost
            for event in _events(logs, connection.agent_log_group, args.job_id, start):
                if event["eventId"] in seen:
                    continue
                seen.add(event["eventId"])
                start = max(start, int(event["timestamp"]))
                printed += 1
                print(_line(event, args.json, args.raw), flush=True)
            if not args.follow or ended:
                break
            time.sleep(args.poll_seconds)
            job = connection.jobs.get(args.job_id)
    except logs.exceptions.ResourceNotFoundException:
        return fail(f"log group {connection.agent_log_group} does not exist")
    except KeyboardInterrupt:
        return 130
    if not printed and not args.json:
        print(f"(no output from {args.job_id} yet)")
    return 0


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


def _line(event: dict[str, Any], as_json: bool, raw: bool) -> str:
    from gpufleet.services.reports import utc_time

    instance = str(event["logStreamName"]).rpartition("/")[2]
    when = utc_time(int(event["timestamp"]) / 1000)
    if as_json:
        return json.dumps({"time": when, "instance_id": instance, "message": event["message"]})
    return printable(f"{when}  {instance}  {event['message'].rstrip()}", raw)
