"""Intake: turn a submitted document into a stored job and a started lifecycle, or refuse it.

Every upload under jobs/ and every event gets a verdict: a job, or a refusal (an error report
next to the upload, `<key>.error.json`, and a `Job Rejected` event, both bounded in size). Two
kinds of object are not submissions and are only logged: intake's own error reports (written
under jobs/ too, so their notifications come back here) and the empty folder markers the S3
console's "Create folder" leaves. A spec uploaded under a key ending in `.error.json` is not
taken for a report: it is refused, its report next to it as for any other key.

Who submits decides the team (`domain/submitters.py`): an upload outside `jobs/<team>/`, an
event from a source other than `gpufleet.team.<team>` (or an account gpufleet.yaml's
`submitters:` does not allow the team), and a spec claiming a team other than the one it was
submitted as, are refused like any invalid spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.domain.arrays import (
    Submission,
    child_job_id,
    child_spec,
    submission_from_mapping,
    submission_job_ids,
    with_job_ids,
)
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import Job, JobNotFound, JobStatus, is_job_id
from gpufleet.domain.node_access import check_access
from gpufleet.domain.notify import check_notify
from gpufleet.domain.spec import (
    MAX_SPEC_BYTES,
    FieldError,
    JobSpec,
    SpecError,
    format_for,
    load_document,
)
from gpufleet.domain.submitters import (
    Submitter,
    event_submitter,
    submission_refusal,
    upload_submitter,
)
from gpufleet.domain.templates import apply_template
from gpufleet.ports import ObjectMissing, ObjectTooLarge, Ports, QueueEntry
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    DETAIL_JOB_QUEUED,
    DETAIL_JOB_REJECTED,
    DETAIL_JOB_STATUS_CHANGED,
)

ERROR_SUFFIX = ".error.json"
# Between the submission times of consecutive children of an array.
CHILD_SPACING_SECONDS = 1e-6
# S3 refuses keys longer than this (UTF-8 bytes): a spec uploaded under a key that leaves no room
# for the suffix gets its refusal in the event only.
MAX_KEY_BYTES = 1024


class ErrorReport(BaseModel):
    """A refusal as intake writes it next to an upload and publishes it (`Job Rejected`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error: Literal["InvalidJobSpec"]
    message: str
    fields: list[FieldError]
    source: str  # the refused delivery: s3://bucket/key, or event:<id>
    version_id: str | None = None  # the refused upload's object version


@dataclass(frozen=True)
class IntakeOutcome:
    job_ids: tuple[str, ...] = ()  # of the jobs submitted, each after those it depends on
    error: dict[str, Any] | None = None
    ignored: str | None = None  # why an object under jobs/ is no submission

    @property
    def accepted(self) -> bool:
        return bool(self.job_ids)

    @property
    def job_id(self) -> str | None:
        """The first job's id (a submission's only one, mostly); None when refused."""
        return self.job_ids[0] if self.job_ids else None


class Planner(Protocol):
    def prepare(self, job: Job) -> tuple[Job, dict[str, Any] | None]:
        """The new job as it is to be stored (QUEUED, or FAILED when nothing can run it), and
        the input its workflow starts from (None: no workflow)."""
        ...

    def array_entries(
        self, children: Sequence[Job], workflow_input: Mapping[str, Any]
    ) -> list[QueueEntry]:
        """The queue entries of an array's children, planned as the array was."""
        ...


class IntakeService:
    def __init__(
        self,
        ports: Ports,
        planner: Planner,
        config: FleetConfig | None = None,
        *,
        account: str = "",
        region: str = "",
        checkpoint_uri: str = "",
    ) -> None:
        self._ports = ports
        self._planner = planner
        # The fleet config: its resource templates (a spec naming one is stored resolved), and
        # what the nodes can reach (volumes, secrets, registries): a spec naming more is refused.
        self._config = config or FleetConfig()
        # The deployment's: a spec's notify topic must be in them (and its team's).
        self._account = account
        self._region = region
        # The deployment's checkpoint location: a spec's checkpoint must be in its team's folder.
        self._checkpoint_uri = checkpoint_uri

    def submit_object(
        self, key: str, delivery_key: str, source: str, version_id: str | None = None
    ) -> IntakeOutcome:
        """A spec uploaded to the intake bucket: the version the notification names (the
        latest without one); its error report goes next to it and names that version."""
        reject_as = {"error_key": key + ERROR_SUFFIX, "version_id": version_id}
        try:
            raw = self._ports.objects.get_bytes(key, MAX_SPEC_BYTES, version_id)
        except ObjectTooLarge as exc:
            error = SpecError(f"the spec is {exc.size} bytes; the limit is {exc.limit}")
            return self._reject(error, source, **reject_as)
        except ObjectMissing:
            error = SpecError("the upload was deleted before intake could read it")
            return self._reject(error, source, **reject_as)
        ignored = _not_a_submission(key, raw, source)
        if ignored is not None:
            return IntakeOutcome(ignored=ignored)
        submitter = upload_submitter(key)
        try:
            refusal = key_refusal(key) or self._submitter_refusal(submitter, ())
            if refusal is not None:
                raise refusal
            document = load_document(raw, format_for(key))
            jobs = self._runnable(submission_from_mapping(document), submitter, delivery_key)
        except SpecError as exc:
            return self._reject(exc, source, **reject_as)
        return self._accept(jobs, source)

    def submit_event(
        self, document: object, delivery_key: str, source: str, event_source: str, account: str
    ) -> IntakeOutcome:
        """A spec sent as an event's detail, from `event_source`, put by a principal of
        `account` (the event's own fields)."""
        return self.submit_document(
            document, delivery_key, source, event_submitter(event_source, account)
        )

    def submit_document(
        self, document: object, delivery_key: str, source: str, submitter: Submitter
    ) -> IntakeOutcome:
        """A spec that arrived already parsed, made by `submitter`."""
        try:
            refusal = self._submitter_refusal(submitter, ())
            if refusal is not None:
                raise refusal
            jobs = self._runnable(submission_from_mapping(document), submitter, delivery_key)
        except SpecError as exc:
            return self._reject(exc, source)
        return self._accept(jobs, source)

    def _submitter_refusal(self, submitter: Submitter, teams: tuple[str, ...]) -> SpecError | None:
        return submission_refusal(submitter, teams, self._config.submitters)

    def _runnable(
        self, submission: Submission, submitter: Submitter, delivery_key: str
    ) -> list[tuple[str, JobSpec]]:
        """The submission's jobs as stored, each with its id (derived from the delivery), in
        dependency order: made as their own teams, templates resolved, checked against what
        nodes can reach and where their status changes may go, dependencies on names of the
        submission rewritten as ids and those on ids naming jobs that exist."""
        teams = tuple(spec.team for spec in submission.jobs)
        refusal = self._submitter_refusal(submitter, teams) or self._unknown_dependencies(
            submission
        )
        if refusal is not None:
            raise refusal
        job_ids = submission_job_ids(submission, delivery_key)
        jobs = []
        for spec in submission.jobs:
            stored = check_access(
                apply_template(spec, self._config.templates), self._config, self._checkpoint_uri
            )
            stored = check_notify(stored, self._config.teams, self._account, self._region)
            jobs.append((job_ids[spec.name], with_job_ids(stored, job_ids)))
        return jobs

    def _unknown_dependencies(self, submission: Submission) -> SpecError | None:
        """A dependency on a job id that names no job (AWS Batch refuses such a dependsOn)."""
        names = {spec.name for spec in submission.jobs}
        several = len(submission.jobs) > 1
        fields = [
            FieldError(
                field=f"jobs[{at}].depends_on[{d}]" if several else f"depends_on[{d}]",
                message=f"no job {dep.job} exists",
            )
            for at, spec in enumerate(submission.jobs)
            for d, dep in enumerate(spec.depends_on)
            if dep.job not in names and is_job_id(dep.job) and not self._exists(dep.job)
        ]
        if not fields:
            return None
        return SpecError(f"{len(fields)} dependenc(ies) on jobs that do not exist", fields)

    def _exists(self, job_id: str) -> bool:
        try:
            self._ports.jobs.get(job_id)
        except JobNotFound:
            return False
        return True

    def _accept(self, jobs: list[tuple[str, JobSpec]], source: str) -> IntakeOutcome:
        """Store each job (planned first: stored once, already queued or failed) and start its
        lifecycle, dependencies before their dependants."""
        now = self._ports.clock.now()
        for job_id, spec in jobs:
            submitted = Job(
                job_id=job_id,
                status=JobStatus.SUBMITTED,
                spec=spec,
                source=source,
                created_at=now,
                updated_at=now,
            )
            job, workflow_input = self._planner.prepare(submitted)
            if spec.is_array and workflow_input is not None:
                self._accept_array(job, workflow_input)
                continue
            if self._ports.jobs.put_new(job):
                detail = job.status_event(None)
                self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_STATUS_CHANGED, detail)
            # Started even for a redelivery: if the first delivery crashed between storing the
            # job and starting its lifecycle, this is what starts it. Starting twice is a no-op.
            if workflow_input is not None:
                self._ports.workflow.start(job.job_id, workflow_input)
        return IntakeOutcome(job_ids=tuple(job_id for job_id, _ in jobs))

    def _accept_array(self, prepared: Job, workflow_input: Mapping[str, Any]) -> None:
        """An array or sweep (docs/arrays.md): its own record (SUBMITTED: it runs nothing
        itself) and one child a point, each QUEUED and in the admission queue with no
        workflow: the dispatcher starts a child's when it admits it, so open executions track
        admitted children, not submitted ones. An array nothing can run fails whole, as a job
        does, with no children.

        The children are stored (BatchWriteItem, which cannot refuse what exists) only while
        the array's record is missing, and before it: no child was queued yet then. They are
        queued after it, by a write that a repeated delivery makes again harmlessly (a child
        waiting, admitted or ended keeps its place or its end)."""
        spec, now = prepared.spec, prepared.created_at
        children = [
            prepared.model_copy(
                update={
                    "job_id": child_job_id(prepared.job_id, index),
                    "spec": child_spec(spec, index),
                    "array_id": prepared.job_id,
                    "array_index": index,
                    # A microsecond apart, in index order: the queue (FIFO by submission
                    # time, to the microsecond) admits them in that order.
                    "created_at": now + index * CHILD_SPACING_SECONDS,
                    "updated_at": now + index * CHILD_SPACING_SECONDS,
                }
            )
            for index in range(spec.size)
        ]
        array = prepared.model_copy(
            update={
                "status": JobStatus.SUBMITTED,
                "estimated_cost_usd": round((prepared.estimated_cost_usd or 0.0) * spec.size, 6),
            }
        )
        if not self._exists(array.job_id):
            self._ports.jobs.put_many(children)
            if self._ports.jobs.put_new(array):
                detail = array.status_event(None)
                self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_STATUS_CHANGED, detail)
        self._ports.queue.enqueue_all(self._planner.array_entries(children, workflow_input))
        detail = {"job_id": array.job_id, "team": spec.team, "priority": spec.priority.value}
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_QUEUED, detail)

    def _reject(
        self,
        error: SpecError,
        source: str,
        error_key: str | None = None,
        version_id: str | None = None,
    ) -> IntakeOutcome:
        report = ErrorReport.model_validate(
            {**error.to_dict(), "source": source, "version_id": version_id}
        ).model_dump(exclude_none=True)
        if error_key is not None and len(error_key.encode()) <= MAX_KEY_BYTES:
            self._ports.objects.put_json(error_key, report)
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_REJECTED, report)
        return IntakeOutcome(error=report)


def key_refusal(key: str) -> SpecError | None:
    """Why no spec can be submitted under `key`, or None. The CLI checks it before uploading."""
    if len(key.encode()) > MAX_KEY_BYTES:
        return SpecError(f"an S3 key is at most {MAX_KEY_BYTES} bytes (UTF-8)")
    if key.endswith(ERROR_SUFFIX):
        return SpecError(
            f"a key ending in {ERROR_SUFFIX} is where intake writes its error reports: "
            "upload the spec under another name",
            [FieldError(field="(key)", message=f"ends in {ERROR_SUFFIX}")],
        )
    return None


def _not_a_submission(key: str, raw: bytes, source: str) -> str | None:
    """Why the object under `key` is not a submission at all, or None when it is one."""
    if key.endswith("/") and not raw:
        return "an empty folder marker (the S3 console's Create folder)"
    if key.endswith(ERROR_SUFFIX) and _is_report_of(raw, source.removesuffix(ERROR_SUFFIX)):
        return "intake's own error report"
    return None


def _is_report_of(raw: bytes, spec_source: str) -> bool:
    try:
        return ErrorReport.model_validate_json(raw).source == spec_source
    except ValidationError:
        return False


def describe(outcome: IntakeOutcome) -> Mapping[str, Any]:
    if outcome.accepted:
        return {"accepted": True, "job_id": outcome.job_id, "job_ids": list(outcome.job_ids)}
    if outcome.ignored is not None:
        return {"accepted": False, "ignored": outcome.ignored}
    return {"accepted": False, "error": outcome.error}
