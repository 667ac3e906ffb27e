"""`gpufleet doctor`: is this account and region ready for the first job?

    gpufleet doctor [--stack NAME] [--region R] [--endpoint-url URL] [--config FILE] [--json]
                    [--smoke] [--smoke-timeout SECONDS]

Reads only (credentials, the stack's outputs and SSM parameters, the spot service-linked role,
the EC2 vCPU quotas, the subnets' routes and endpoints, the alerts topic's subscribers) and
prints one line per check with a fix for each that failed. `--smoke` then, if every check
passed, runs one CPU-only job on the cheapest instance through the same path as `gpufleet
submit` and prints how long each step took, its status and its cost (this one launches an
instance: it costs a few cents at most).

Exit codes: 0 every check (and the smoke job) passed, 2 something failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.cli.output import invalid, print_json
from gpufleet.cli.table import render
from gpufleet.cli.target import Connection, TargetError, add_target_arguments, connect
from gpufleet.domain.readiness import (
    RELEASE_STATE,
    Check,
    CheckStatus,
    ProbeError,
    all_passed,
    smoke_timeline,
)
from gpufleet.domain.submitters import upload_key

if TYPE_CHECKING:
    from gpufleet.adapters.aws.account_probe import AwsAccountProbe
    from gpufleet.domain.job import Job

STEP_COLUMNS = (("name", "step"), ("at_seconds", "at_s"), ("latency_seconds", "latency_s"))
# One CPU-only job that only prints a line: the cheapest instance selection finds for it.
SMOKE_TEAM = "doctor"
SMOKE_KEY = upload_key(SMOKE_TEAM, "gpufleet-doctor-smoke.yaml")
# The run's time makes each upload's content (and so its ETag) new: every run is a new job,
# also where a notification names the upload by its ETag (the emulator's).
SMOKE_SPEC = """\
# gpufleet doctor --smoke: one CPU-only job end to end, on the cheapest instance.
name: doctor-smoke
team: {team}
image: public.ecr.aws/docker/library/busybox:stable
command: [echo, "gpufleet doctor: the smoke job ran"]
env: {{GPUFLEET_DOCTOR_RUN: "{run}"}}
resources: {{gpus: 0, vcpus: 1, memory_gib: 1}}
spot: auto
timeout: 15m
max_retries: 0
"""
POLL_SECONDS = 0.5


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="check that the account and region are ready for the first job",
        description="Check, reading only, what the first job needs in the account and region "
        "the target points at; --smoke then runs one CPU-only job end to end.",
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="then run one CPU-only job on the cheapest instance and time each step",
    )
    parser.add_argument(
        "--smoke-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="give the smoke job this long, then cancel it (%(default)s)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.adapters.aws.account_probe import AwsAccountProbe
    from gpufleet.domain.catalog import load_bundled
    from gpufleet.services.doctor import Target, diagnose, diagnose_without_region

    if args.smoke_timeout <= 0:
        raise invalid("--smoke-timeout must be > 0")
    connection: Connection | None = None
    error = None
    try:
        connection = connect(args)
    except TargetError as exc:
        error = str(exc)
    region = connection.settings.region if connection else _region(args)
    target = Target(region, args.stack, connection.settings if connection else None, error)
    probe = AwsAccountProbe(region) if region else None
    checks = diagnose(probe, target, load_bundled()) if probe else diagnose_without_region()
    ok = all_passed(checks)
    smoke: dict[str, Any] | None = None
    if args.smoke:
        if ok and connection is not None and probe is not None:
            smoke = run_smoke(connection, probe, args.smoke_timeout, quiet=args.json)
            ok = smoke["ok"]
        else:
            smoke = {"ok": False, "skipped": "a check failed: fix it first"}
            ok = False
    # The quotas are judged against this file's jobs: say which (the CLI's default when none).
    config_found = Path(args.config).exists()
    if args.json:
        document = {
            "ok": ok,
            "region": region,
            "stack": args.stack,
            "config": args.config,
            "config_found": config_found,
            "checks": [check.to_dict() for check in checks],
            "smoke": smoke,
        }
        print_json(document)
    else:
        found = "" if config_found else " (not found: the defaults, no templates)"
        print(
            f"gpufleet doctor: {region or 'no region'}, stack {args.stack or '-'}, "
            f"config {args.config}{found}"
        )
        print(render_checks(checks))
        if smoke is not None:
            print(_render_smoke(smoke))
    return 0 if ok else 2


def render_checks(checks: list[Check]) -> str:
    """One line per check, a fix under each that failed, and the verdict."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.status.value.upper():<4}  {check.name:<{width}}  {check.detail}")
        if check.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
    failures = sum(check.status is CheckStatus.FAIL for check in checks)
    lines.append("all checks passed" if not failures else f"{failures} check(s) failed")
    return "\n".join(lines)


def _region(args: argparse.Namespace) -> str | None:
    """The region without a target: the flag, the environment, else the profile's."""
    import boto3

    region: str | None = (
        args.region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or boto3.session.Session().region_name
    )
    return region


# -- --smoke -----------------------------------------------------------------------------------


def run_smoke(
    connection: Connection, probe: AwsAccountProbe, timeout: float, *, quiet: bool = False
) -> dict[str, Any]:
    """Submit the smoke job, follow it to its end (or cancel it at `timeout`), and time it."""
    from gpufleet.cli.jobs import submit_spec
    from gpufleet.domain.arrays import submission_from_mapping
    from gpufleet.domain.job import JobStatus
    from gpufleet.domain.spec import load_document

    started = time.monotonic()
    spec = SMOKE_SPEC.format(run=datetime.now(UTC).isoformat(), team=SMOKE_TEAM)
    upload, (job_id,), job, report = submit_spec(
        connection,
        SMOKE_KEY,
        spec.encode(),
        min(timeout, 120.0),
        submission_from_mapping(load_document(spec)),
    )
    if report is not None:
        return {"ok": False, "job_id": job_id, "error": report}
    if job is None:
        return {"ok": False, "job_id": job_id, "error": "intake did not record the job in time"}
    if not quiet:
        print(f"smoke job {job_id} (s3://{upload.bucket}/{upload.key})", file=sys.stderr)
    running_at = None
    deadline = started + timeout
    while not _ended(job) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        job = connection.jobs.get(job_id)
        if running_at is None and job.status is JobStatus.RUNNING and job.run_result is None:
            running_at = job.updated_at  # the node's start report wrote it
    timed_out = not _ended(job)
    if timed_out:
        job = _cancel(connection, job)
    release_started = _release_started(probe, connection.settings.job_state_machine_arn, job_id)
    steps = smoke_timeline(upload.at.timestamp(), job, running_at, release_started)
    placement = job.placement
    return {
        "ok": job.status is JobStatus.SUCCEEDED,
        "job_id": job_id,
        "status": job.status.value,
        "failure_reason": ("timed out, cancelled" if timed_out else None) or job.failure_reason,
        "instance_type": placement.instance_type if placement else None,
        "capacity_type": placement.capacity_type if placement else None,
        "cost_usd": job.cost_usd,
        "steps": [asdict(step) for step in steps],
    }


def _release_started(probe: AwsAccountProbe, state_machine_arn: str, job_id: str) -> float | None:
    """When the job's workflow moved on to release it; None where its history is not readable
    (the step is then shown as not seen)."""
    if not state_machine_arn:
        return None
    try:
        return probe.state_entered_at(state_machine_arn, job_id, RELEASE_STATE)
    except ProbeError:
        return None


def _ended(job: Job) -> bool:
    """Over, and its instances released (the final write records both)."""
    return job.status.terminal and (job.placement is None or job.released_at is not None)


def _cancel(connection: Connection, job: Job) -> Job:
    from gpufleet.services.lifecycle_base import JobAlreadyEnded

    with contextlib.suppress(JobAlreadyEnded):  # it ended meanwhile
        connection.lifecycle.cancel(job.job_id)
    return connection.jobs.get(job.job_id)


def _render_smoke(smoke: dict[str, Any]) -> str:
    if "skipped" in smoke:
        return f"smoke job: skipped ({smoke['skipped']})"
    if "error" in smoke:
        error = smoke["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return f"smoke job {smoke['job_id']}: {message}"
    where = smoke["instance_type"] or "no instance"
    if smoke["capacity_type"]:
        where += f" ({smoke['capacity_type']})"
    cost = f"${smoke['cost_usd']:.6f}" if smoke["cost_usd"] is not None else "-"
    ending = f"{smoke['job_id']}: {smoke['status']} on {where}, cost {cost}"
    if smoke["failure_reason"]:
        ending += f" ({smoke['failure_reason']})"
    return "\n".join(["", render(smoke["steps"], STEP_COLUMNS), ending])
