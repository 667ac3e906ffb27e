"""The job store on DynamoDB: one item per job, status changes as conditional writes."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from gpufleet.adapters.aws.transactions import BACKOFF, Backoff, write
from gpufleet.domain.job import (
    ALLOWED_SOURCES,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    Placement,
)
from gpufleet.domain.spec import JobSpec
from gpufleet.errors import ConditionFailed
from gpufleet.ports import StatusChange

# Job field -> (DynamoDB attribute, kind). "json" fields are stored as JSON strings: they are
# read whole and never queried, and strings avoid DynamoDB's Decimal round-trip.
_FIELDS: dict[str, tuple[str, str]] = {
    "job_id": ("job_id", "str"),
    "status": ("status", "str"),
    "source": ("source", "str"),
    "created_at": ("created_ts", "num"),
    "updated_at": ("updated_ts", "num"),
    "version": ("version", "num"),
    "spec": ("spec", "json"),
    "placement": ("placement", "json"),
    "released_at": ("released_ts", "num"),
    "cost_usd": ("cost_usd", "num"),
    "failure_reason": ("failure_reason", "str"),
    "exit_code": ("exit_code", "num"),
    "attempts": ("attempts", "num"),
    "task_token": ("task_token", "str"),
    "run_result": ("run_result", "json"),
    "started_instances": ("started_instances", "json"),
    "drain_reason": ("drain_reason", "str"),
    "drain_requested_at": ("drain_requested_ts", "num"),
    "preempted_for": ("preempted_for", "str"),
    "preemptions": ("preemptions", "num"),
    "interruptions": ("interruptions", "num"),
    "retries": ("retries", "num"),
    "ondemand_fallback": ("ondemand_fallback", "num"),
    "on_demand_only": ("on_demand_only", "num"),
    "resources_override": ("resources_override", "json"),
    "flags": ("flags", "json"),
    "prior_cost_usd": ("prior_cost_usd", "num"),
    "prior_held_seconds": ("prior_held_seconds", "num"),
    "prior_storage_usd": ("prior_storage_usd", "num"),
    "storage_usd": ("storage_usd", "num"),
    "estimated_cost_usd": ("estimated_cost_usd", "num"),
    "first_admitted_at": ("first_admitted_ts", "num"),
    "waited_seconds": ("waited_seconds", "num"),
    "stage_index": ("stage_index", "num"),
    "stage_records": ("stage_records", "json"),
}


# The placement's instances as a string set, so that a node's report can be checked against
# them in the condition of the write it causes (`contains`), without reading the job first.
_HELD = "instance_ids"


def _held(placement: Placement | Mapping[str, Any]) -> dict[str, list[str]]:
    ids = placement.instance_ids if isinstance(placement, Placement) else placement["instance_ids"]
    return {"SS": sorted(ids)}


def iso_timestamp(epoch: float) -> str:
    """Sortable UTC timestamp for index sort keys."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _encode(kind: str, value: Any) -> dict[str, str]:
    if kind == "str":
        return {"S": str(value)}
    if kind == "num":
        return {"N": repr(value) if isinstance(value, float) else str(int(value))}
    if isinstance(value, JobSpec):
        # The form intake sized the spec by (`spec_from_mapping`): it fits the item.
        return {"S": value.stored_form()}
    if isinstance(value, BaseModel):
        return {"S": value.model_dump_json()}
    # Lists of models too (a multi-stage job's stage records).
    return {"S": json.dumps(to_jsonable_python(value), sort_keys=True)}


def _decode(kind: str, attribute: Mapping[str, str]) -> Any:
    if kind == "str":
        return attribute["S"]
    if kind == "num":
        text = attribute["N"]
        return float(text) if any(c in text for c in ".eE") else int(text)
    return json.loads(attribute["S"])


def job_to_item(job: Job) -> dict[str, dict[str, Any]]:
    item: dict[str, dict[str, Any]] = {}
    for field_name, (attribute, kind) in _FIELDS.items():
        value = getattr(job, field_name)
        if value is not None:
            item[attribute] = _encode(kind, value)
    if job.placement is not None and job.placement.instance_ids:
        item[_HELD] = _held(job.placement)
    # Index keys: status and team partitions sorted by submission time.
    item["team"] = {"S": job.spec.team}
    item["created_at"] = {"S": iso_timestamp(job.created_at)}
    return item


def item_to_job(item: Mapping[str, Mapping[str, str]]) -> Job:
    values: dict[str, Any] = {}
    for field_name, (attribute, kind) in _FIELDS.items():
        if attribute in item:
            values[field_name] = _decode(kind, item[attribute])
    values["spec"] = JobSpec.model_validate(values["spec"])
    if "placement" in values:
        values["placement"] = Placement.model_validate(values["placement"])
    return Job.model_validate(values)


class DynamoJobStore:
    def __init__(self, client: Any, table_name: str, backoff: Backoff = BACKOFF) -> None:
        """`backoff`: how a write that met a transaction on its job's item (an admission, a
        launch or a release checks or writes job items in transactions) is tried again."""
        self._client = client
        self._table = table_name
        self._backoff = backoff

    def _update(self, **request: Any) -> dict[str, Any]:
        return write(self._client.update_item, self._backoff, **request)

    def put_new(self, job: Job) -> bool:
        try:
            write(
                self._client.put_item,
                self._backoff,
                TableName=self._table,
                Item=job_to_item(job),
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ConditionFailed:
            return False
        return True

    def get(self, job_id: str) -> Job:
        response = self._client.get_item(
            TableName=self._table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        )
        if "Item" not in response:
            raise JobNotFound(job_id)
        return item_to_job(response["Item"])

    def transition(
        self,
        job_id: str,
        target: JobStatus,
        now: float,
        changes: Mapping[str, Any] | None = None,
        *,
        sources: Collection[JobStatus] | None = None,
        holding: str | None = None,
        version: int | None = None,
    ) -> Job:
        allowed = ALLOWED_SOURCES[target] if sources is None else sources
        if not allowed:
            raise IllegalTransition(job_id, None, target)
        change = StatusChange(
            job_id, target, frozenset(allowed), now, changes or {}, holding, version
        )
        try:
            response = self._update(
                **transition_write(self._table, change),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailed as failed:
            if not failed.item:
                raise JobNotFound(job_id) from None
            current = item_to_job(failed.item)
            raise IllegalTransition(job_id, current.status, target, current) from None
        return item_to_job(response["Attributes"])

    def update(self, job_id: str, now: float, changes: Mapping[str, Any]) -> Job:
        names, values, expression = _update_expression({**changes, "updated_at": now})
        try:
            response = self._update(
                TableName=self._table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression=expression,
                ConditionExpression="attribute_exists(job_id)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            raise JobNotFound(job_id) from None
        return item_to_job(response["Attributes"])

    def recent_for_team(self, team: str, limit: int) -> list[Job]:
        response = self._client.query(
            TableName=self._table,
            IndexName="by_team",
            KeyConditionExpression="team = :team",
            ExpressionAttributeValues={":team": {"S": team}},
            ScanIndexForward=False,
            Limit=limit,
        )
        return [item_to_job(item) for item in response.get("Items", [])]

    def list_jobs(self, status: JobStatus | None = None, limit: int = 1000) -> list[Job]:
        """The newest `limit` jobs (of one status, or of all): each status's newest from the
        status index, merged. No Scan: a scan's order is arbitrary, so its first `limit` items
        would not be the newest. The statuses are read in the order jobs move through them,
        so a job that moves on meanwhile is read twice (and kept once), never missed; one sent
        back to the queue between two reads can be (it is listed again next time)."""
        statuses = [status] if status is not None else list(JobStatus)
        newest: dict[str, Job] = {}
        for each in statuses:
            for job in self._newest_of(each, limit):
                newest[job.job_id] = job  # the later read: its newer status
        jobs = sorted(newest.values(), key=lambda job: job.created_at, reverse=True)
        return jobs[:limit]

    def _newest_of(self, status: JobStatus, limit: int) -> list[Job]:
        jobs: list[Job] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": "by_status",
            "KeyConditionExpression": "#status = :status",
            "ExpressionAttributeNames": {"#status": "status"},
            "ExpressionAttributeValues": {":status": {"S": status.value}},
            "ScanIndexForward": False,
            "Limit": limit,
        }
        while len(jobs) < limit:
            page = self._client.query(**kwargs)
            jobs.extend(item_to_job(item) for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return jobs[:limit]


def transition_write(table: str, change: StatusChange) -> dict[str, Any]:
    """The conditional UpdateItem of a status change: on its own (`transition`), or as one item
    of a transaction that spans the job store and the queue."""
    updates = {"status": change.target.value, "updated_at": change.now, **change.changes}
    names, values, expression = _update_expression(updates)
    names["#status"] = "status"
    placeholders = []
    for index, source in enumerate(sorted(change.sources)):
        values[f":from{index}"] = {"S": source.value}
        placeholders.append(f":from{index}")
    condition = f"attribute_exists(job_id) AND #status IN ({', '.join(placeholders)})"
    if change.holding is not None:
        names["#held"] = _HELD
        values[":instance"] = {"S": change.holding}
        condition += " AND contains(#held, :instance)"
    if change.version is not None:
        values[":version"] = _encode("num", change.version)
        condition += " AND #version = :version"
    return {
        "TableName": table,
        "Key": {"job_id": {"S": change.job_id}},
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }


def _update_expression(
    updates: Mapping[str, Any],
) -> tuple[dict[str, str], dict[str, dict[str, Any]], str]:
    names: dict[str, str] = {}
    values: dict[str, dict[str, Any]] = {}
    sets: list[str] = []
    removes: list[str] = []
    for index, (field_name, value) in enumerate(updates.items()):
        attribute, kind = _FIELDS[field_name]
        names[f"#f{index}"] = attribute
        if value is None:
            removes.append(f"#f{index}")
        else:
            values[f":v{index}"] = _encode(kind, value)
            sets.append(f"#f{index} = :v{index}")
        if field_name == "placement":  # the instance set follows the placement
            names["#held"] = _HELD
            held = _held(value) if value is not None else None
            if held is None or not held["SS"]:
                removes.append("#held")
            else:
                values[":held"] = held
                sets.append("#held = :held")
    # Every write counts one version (an item stored before versions starts from none).
    names["#version"] = "version"
    values[":one"] = {"N": "1"}
    expression = ""
    if sets:
        expression += "SET " + ", ".join(sets)
    if removes:
        expression += " REMOVE " + ", ".join(removes)
    expression += " ADD #version :one"
    return names, values, expression.strip()
