"""`gpufleet submit FILE`, `gpufleet status [ID]`, `gpufleet list`: jobs in and out.

    gpufleet submit job.yaml [--wait SECONDS] [--json] [--raw]   (a spec, or a `jobs:` list)
    gpufleet status ID [--json] [--raw]     (with the peaks and means of its usage)
    gpufleet list [--status S] [--team T] [--limit N] [--json] [--raw]
    gpufleet list --array ID [--json]       (an array's children counted per status)

Every command takes the target arguments (`--stack`, `--endpoint-url`, ...) and keeps the output
contract (gpufleet.cli.output): exit 0 ok, 2 bad input, a refused spec, an unknown job or no
target. Names, keys and reasons are printed with control characters escaped (`--raw`: as they
are).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpufleet.cli.output import CliError, ErrorCode, invalid, print_json
from gpufleet.cli.table import add_raw_argument, printable, render, render_fields
from gpufleet.cli.target import Connection, add_target_arguments, connect
from gpufleet.domain.arrays import Submission, submission_from_mapping, submission_job_ids
from gpufleet.domain.job import Job, JobNotFound, JobStatus, s3_delivery_key
from gpufleet.domain.spec import SpecError, format_for, load_document
from gpufleet.domain.submitters import spec_upload_key
from gpufleet.services.intake import ERROR_SUFFIX, ErrorReport, key_refusal

if TYPE_CHECKING:
    from gpufleet.ports import JobStore

LIST_COLUMNS = (
    ("id", "job"),
    ("name", "name"),
    ("team", "team"),
    ("status", "status"),
    ("instance_type", "instance"),
    ("capacity_type", "capacity"),
    ("cost_usd", "cost $"),
)


def register(commands: Any) -> None:
    submit = commands.add_parser(
        "submit", help="validate a job spec and upload it to the intake bucket"
    )
    submit.add_argument("file", metavar="FILE", help="job spec, YAML or JSON")
    add_submit_wait(submit)
    add_target_arguments(submit)
    add_raw_argument(submit)
    submit.set_defaults(run=run_submit)

    status = commands.add_parser("status", help="one job in detail; without ID, like `list`")
    status.add_argument("job_id", nargs="?", metavar="ID")
    _add_list_filters(status)
    add_target_arguments(status)
    add_raw_argument(status)
    status.set_defaults(run=run_status)

    listing = commands.add_parser("list", help="jobs, newest first")
    _add_list_filters(listing)
    listing.add_argument(
        "--array", metavar="ID", help="an array's or sweep's children, counted per status"
    )
    add_target_arguments(listing)
    add_raw_argument(listing)
    listing.set_defaults(run=run_list)


def _add_list_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", choices=[s.value for s in JobStatus], help="only this status")
    parser.add_argument("--team", help="only this team's jobs")
    parser.add_argument("--limit", type=int, default=50, help="at most this many (%(default)s)")


def add_submit_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the control plane to take the job (%(default)s; 0: not)",
    )


# -- submit ------------------------------------------------------------------------------------


def run_submit(args: argparse.Namespace) -> int:
    _, upload, job_ids, job = submit_file(args)
    job_id = job_ids[0]
    status = job.status.value if job else None
    document = {
        "accepted": True,
        "job_id": job_id,
        "job_ids": job_ids,
        "status": status,
        "failure_reason": job.failure_reason if job else None,
        "key": upload.key,
        "version_id": upload.version_id,
    }
    if args.json:
        print_json(document)
    else:
        print(
            printable(
                f"{job_id}  {status or 'uploaded'}  (s3://{upload.bucket}/{upload.key})", args.raw
            )
        )
    if len(job_ids) > 1 and not args.json:
        print(printable(f"and {len(job_ids) - 1} more: {' '.join(job_ids[1:])}", args.raw))
    if job is not None and job.failure_reason:
        # Taken, but it will not run (e.g. nothing in the catalog fits it).
        print(f"gpufleet: {job_id}: {printable(job.failure_reason, args.raw)}", file=sys.stderr)
    if job is None and args.wait > 0:
        print(
            f"gpufleet: the control plane has not recorded {job_id} yet; "
            f"`gpufleet status {job_id}` shows it once it has",
            file=sys.stderr,
        )
    return 0


def submit_file(args: argparse.Namespace) -> tuple[Connection, Upload, list[str], Job | None]:
    """`args.file` checked as intake checks it, uploaded and waited for (`args.wait`): the one
    submission of `submit` and `run`. The ids of its jobs (each after those it depends on) and
    the first job. Raises CliError for a file it cannot read or a spec refused here or by
    intake (nothing is uploaded when it is refused here)."""
    path = Path(args.file)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}", ErrorCode.NOT_FOUND) from None
    # Under its team's folder (jobs/<team>/: who may upload there is who may submit for the
    # team). The same checks intake makes, format chosen by the same rule: a spec refused here
    # would be refused there, so it is not uploaded.
    key = spec_upload_key(raw, path.name)
    try:
        refusal = key_refusal(key)
        if refusal is not None:
            raise refusal
        submission = submission_from_mapping(load_document(raw, format_for(key)))
    except SpecError as exc:
        raise _refused(key, exc.to_dict()) from None
    if args.wait < 0:
        raise invalid("--wait must be >= 0")
    connection = connect(args)
    upload, job_ids, job, report = submit_spec(connection, key, raw, args.wait, submission)
    if report is not None:
        # Refused by the control plane (e.g. a template its config does not define).
        raise _refused(key, report)
    return connection, upload, job_ids, job


def _refused(key: str, error: dict[str, Any]) -> CliError:
    """A refused spec as the contract reports it: intake's report, keyed as every error is."""
    details = {"key": key, **{k: v for k, v in error.items() if k not in ("error", "message")}}
    return CliError(f"{key} refused: {error.get('message')}", ErrorCode.INVALID_JOB_SPEC, details)


def submit_spec(
    connection: Connection, key: str, raw: bytes, wait_seconds: float, submission: Submission
) -> tuple[Upload, list[str], Job | None, dict[str, Any] | None]:
    """Upload a submission (`raw`, parsed as `submission`) where `aws s3 cp` puts it and wait
    for intake to take it: the one submit path (`gpufleet submit`, `gpufleet doctor --smoke`).
    The upload, its jobs' ids, the first job (None if not recorded yet) and intake's error
    report (if it refused the submission)."""
    s3 = connection.client("s3")
    upload = _upload(s3, connection.settings.intake_bucket, key, raw)
    job_ids, job, report = _await_intake(connection.jobs, s3, upload, submission, wait_seconds)
    return upload, job_ids, job, report


@dataclass(frozen=True)
class Upload:
    bucket: str
    key: str
    version_id: str | None
    etag: str
    at: datetime  # S3's clock: a report written before this upload cannot be about it

    def job_ids(self, submission: Submission) -> list[list[str]]:
        """The ids intake can give the jobs of this upload, in the submission's order, for each
        way it may name the delivery: by the object version (the stack's bucket is versioned,
        so S3's notification carries one, as the emulator's do) or, when the notification has
        none (an unversioned bucket), by the ETag."""
        markers = [m for m in (self.version_id, self.etag) if m]
        return [
            list(submission_job_ids(submission, s3_delivery_key(self.bucket, self.key, m)).values())
            for m in markers
        ]


def _upload(s3: Any, bucket: str, key: str, raw: bytes) -> Upload:
    response = s3.put_object(Bucket=bucket, Key=key, Body=raw)
    version_id = response.get("VersionId")
    head = s3.head_object(
        Bucket=bucket, Key=key, **({"VersionId": version_id} if version_id else {})
    )
    return Upload(bucket, key, version_id, str(response["ETag"]).strip('"'), head["LastModified"])


def _await_intake(
    jobs: JobStore, s3: Any, upload: Upload, submission: Submission, wait_seconds: float
) -> tuple[list[str], Job | None, dict[str, Any] | None]:
    """(the jobs' ids, the first job or None if not recorded yet, the error report if
    refused). Intake stores a submission's jobs in one invocation: the first stands for all."""
    candidates = upload.job_ids(submission)
    deadline = time.monotonic() + wait_seconds
    reports_read: set[str] = set()
    while True:
        for job_ids in candidates:
            try:
                return job_ids, jobs.get(job_ids[0]), None
            except JobNotFound:
                continue
        report = _error_report(s3, upload, reports_read)
        if report is not None:
            return candidates[0], None, report
        if time.monotonic() >= deadline:
            return candidates[0], None, None
        time.sleep(0.5)


def _error_report(s3: Any, upload: Upload, read: set[str]) -> dict[str, Any] | None:
    """The error report intake wrote for this upload, if it refused it: the version of
    `<key>.error.json` that names this upload's version (another upload of the same key, even in
    the same second, has its own). `read` holds the report versions already read."""
    if upload.version_id is None:
        return None  # an unversioned bucket: no report can be told to be this upload's
    report_key = upload.key + ERROR_SUFFIX
    listing = s3.list_object_versions(Bucket=upload.bucket, Prefix=report_key)
    for version in listing.get("Versions", []):
        if (
            version["Key"] != report_key
            or version["VersionId"] in read
            or version["LastModified"] < upload.at
        ):
            continue
        read.add(version["VersionId"])
        body = s3.get_object(Bucket=upload.bucket, Key=report_key, VersionId=version["VersionId"])
        try:
            report = ErrorReport.model_validate_json(body["Body"].read())
        except ValidationError:
            continue  # not intake's
        if report.version_id == upload.version_id:
            return report.model_dump(exclude_none=True)
    return None


# -- status and list ---------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    if args.job_id is None:
        return run_list(args)
    from gpufleet.domain.usage_layout import summarize
    from gpufleet.services.reports import job_detail

    connection = connect(args)
    job = connection.jobs.get(args.job_id)
    detail = job_detail(job, current_wait_seconds=connection.current_wait_seconds(job))
    detail["usage"] = summarize(connection.usage.of_job(job.job_id)).as_dict()
    if args.json:
        print_json(detail)
    else:
        print(render_detail(detail, args.raw))
    return 0


def render_detail(detail: dict[str, Any], raw: bool = False) -> str:
    """`status ID` for people: a line per field, then a multi-stage job's stages as a table,
    then the peaks and means of its usage (from its nodes' usage documents)."""
    stages = detail.get("stages") or []
    usage = detail.get("usage") or {}
    fields = render_fields({k: v for k, v in detail.items() if k not in ("stages", "usage")}, raw)
    if stages:
        fields = f"{fields}\nstages:\n{render(stages, STAGE_COLUMNS, raw)}"
    if usage.get("samples"):
        rows = [
            {"what": label, "peak": usage[f"{key}_peak"], "mean": usage[f"{key}_mean"]}
            for key, label in USAGE_ROWS
        ]
        title = f"usage ({usage['nodes']} node(s), {usage['samples']} sample(s)):"
        fields = f"{fields}\n{title}\n{render(rows, USAGE_COLUMNS, raw)}"
    return fields


USAGE_ROWS = (
    ("gpu_util_percent", "GPU utilization %"),
    ("gpu_mem_mib", "GPU memory used MiB (fullest GPU)"),
    ("cpu_percent", "host CPU %"),
    ("host_mem_mib", "host memory used MiB"),
)
USAGE_COLUMNS = (("what", "usage"), ("peak", "peak"), ("mean", "mean"))


STAGE_COLUMNS = (
    ("name", "stage"),
    ("status", "status"),
    ("instance_type", "instance"),
    ("capacity_type", "capacity"),
    ("gpus", "gpus"),
    ("hourly_usd", "$/hour"),
    ("held_seconds", "held s"),
    ("cost_usd", "cost $"),
    ("retries", "retries"),
    ("reused_previous", "reused"),
)


def run_list(args: argparse.Namespace) -> int:
    from gpufleet.services.reports import find_jobs, job_detail

    if args.limit < 1:
        raise invalid("--limit must be >= 1")
    connection = connect(args)
    if getattr(args, "array", None):
        return _list_array(connection, args.array, args.json)
    status = JobStatus(args.status) if args.status else None
    jobs = find_jobs(connection.jobs, status, args.team, args.limit)
    details = [job_detail(job) for job in jobs]
    if args.json:
        print_json(details)
    elif details:
        print(render(details, LIST_COLUMNS, args.raw))
    else:
        print("(no jobs)")
    return 0


PROGRESS_WIDTH = 40


def _list_array(connection: Connection, array_id: str, as_json: bool) -> int:
    """`list --array ID`: the array's status and its children counted per status, with a
    progress bar of the ended ones when stdout is a terminal."""
    from gpufleet.services.arrays import array_progress

    array = connection.jobs.get(array_id)
    if not array.spec.is_array:
        raise invalid(f"{array_id} is a job, not an array or sweep")
    progress = array_progress(connection.jobs, array)
    if as_json:
        print_json(progress)
        return 0
    counts = progress["counts"]
    print(
        printable(f"{progress['id']} {progress['name']} ({progress['team']}): ", False)
        + f"{progress['status']}, {progress['size']} children"
    )
    rows = [{"status": status, "children": count} for status, count in counts.items() if count]
    print(render(rows, (("status", "status"), ("children", "children")), False))
    if sys.stdout.isatty():
        ended = sum(counts[s.value] for s in JobStatus if s.terminal)
        filled = ended * PROGRESS_WIDTH // progress["size"]
        bar = "#" * filled + "." * (PROGRESS_WIDTH - filled)
        print(f"[{bar}] {ended}/{progress['size']} ended")
    return 0
