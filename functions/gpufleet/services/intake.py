"""Intake: turn a submitted document into a stored job and a started lifecycle, or refuse it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.domain.job import Job, JobStatus, job_id_for_delivery
from gpufleet.domain.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec, spec_from_mapping
from gpufleet.domain.templates import Templates, apply_template
from gpufleet.ports import ObjectTooLarge, Ports
from gpufleet.topology import CONTROL_PLANE_SOURCE, DETAIL_JOB_REJECTED, DETAIL_JOB_STATUS_CHANGED

ERROR_SUFFIX = ".error.json"
# S3 refuses keys longer than this (UTF-8 bytes): a spec uploaded under a key that leaves no room
# for the suffix gets its refusal in the event only.
MAX_KEY_BYTES = 1024


@dataclass(frozen=True)
class IntakeOutcome:
    job_id: str | None
    error: dict[str, Any] | None = None

    @property
    def accepted(self) -> bool:
        return self.job_id is not None


class Prepare(Protocol):
    def __call__(self, job: Job) -> tuple[Job, dict[str, Any] | None]:
        """The new job as it is to be stored (QUEUED, or FAILED when nothing can run it), and
        the input its workflow starts from (None: no workflow)."""
        ...


class IntakeService:
    def __init__(self, ports: Ports, prepare: Prepare, templates: Templates | None = None) -> None:
        self._ports = ports
        self._prepare = prepare
        # The fleet config's resource templates: a spec naming one is stored resolved.
        self._templates: Templates = templates or {}

    def submit_object(self, key: str, delivery_key: str, source: str) -> IntakeOutcome:
        """A spec uploaded to the intake bucket; its error report goes next to it."""
        try:
            raw = self._ports.objects.get_bytes(key, MAX_SPEC_BYTES)
            spec = parse_spec(raw, "json" if key.endswith(".json") else "auto")
            spec = apply_template(spec, self._templates)
        except ObjectTooLarge as exc:
            return self._reject(
                SpecError(f"the spec is {exc.size} bytes; the limit is {exc.limit}"),
                source,
                error_key=key + ERROR_SUFFIX,
            )
        except SpecError as exc:
            return self._reject(exc, source, error_key=key + ERROR_SUFFIX)
        return self._accept(spec, delivery_key, source)

    def submit_document(self, document: object, delivery_key: str, source: str) -> IntakeOutcome:
        """A spec that arrived already parsed, e.g. an EventBridge event's detail."""
        try:
            spec = apply_template(spec_from_mapping(document), self._templates)
        except SpecError as exc:
            return self._reject(exc, source, error_key=None)
        return self._accept(spec, delivery_key, source)

    def _accept(self, spec: JobSpec, delivery_key: str, source: str) -> IntakeOutcome:
        now = self._ports.clock.now()
        submitted = Job(
            job_id=job_id_for_delivery(delivery_key),
            status=JobStatus.SUBMITTED,
            spec=spec,
            source=source,
            created_at=now,
            updated_at=now,
        )
        # Planned before it is stored: the job is stored once, already queued (or failed).
        job, workflow_input = self._prepare(submitted)
        if self._ports.jobs.put_new(job):
            detail = {"job_id": job.job_id, "name": spec.name, "team": spec.team}
            self._ports.events.publish(
                CONTROL_PLANE_SOURCE,
                DETAIL_JOB_STATUS_CHANGED,
                {**detail, "status": job.status.value, "reason": job.failure_reason},
            )
        # Started even for a redelivery: if the first delivery crashed between storing the job
        # and starting its lifecycle, this is what starts it. Starting twice is a no-op.
        if workflow_input is not None:
            self._ports.workflow.start(job.job_id, workflow_input)
        return IntakeOutcome(job_id=job.job_id)

    def _reject(self, error: SpecError, source: str, error_key: str | None) -> IntakeOutcome:
        report: dict[str, Any] = {**error.to_dict(), "source": source}
        if error_key is not None and len(error_key.encode()) <= MAX_KEY_BYTES:
            self._ports.objects.put_json(error_key, report)
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_REJECTED, report)
        return IntakeOutcome(job_id=None, error=report)


def is_error_report(key: str) -> bool:
    """Error reports are written under jobs/ too; they are never specs."""
    return key.endswith(ERROR_SUFFIX)


def describe(outcome: IntakeOutcome) -> Mapping[str, Any]:
    if outcome.accepted:
        return {"accepted": True, "job_id": outcome.job_id}
    return {"accepted": False, "error": outcome.error}
