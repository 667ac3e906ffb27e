"""The job store on DynamoDB: one item per job, status changes as conditional writes."""

from __future__ import annotations

import json
import types
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Union, get_args, get_origin

from gpufleet.adapters.aws.transactions import BACKOFF, Backoff, batch_get, batch_put, write
from gpufleet.domain.job import (
    ALLOWED_SOURCES,
    IllegalTransition,
    Job,
    JobChanges,
    JobNotFound,
    JobStatus,
)
from gpufleet.domain.spec import canonical_json
from gpufleet.errors import ConditionFailed
from gpufleet.ports import StatusChange

# The item is the job's JSON form (`model_dump(mode="json")`), one attribute per field, with
# what DynamoDB needs: a time (`*_at`) is kept as `*_ts`, which leaves `created_at` to the
# indexes' sortable timestamp; a field with no value (None) has no attribute; a structured
# value (the spec, the placement, lists) is kept as JSON text: read whole, never queried, and
# text avoids DynamoDB's Decimal round-trip of the numbers inside; a flag is a number (0, 1).


def _attribute(field_name: str) -> str:
    return field_name.removesuffix("_at") + "_ts" if field_name.endswith("_at") else field_name


def _is_scalar(annotation: Any) -> bool:
    """Whether a field of this type holds a string, a number or a flag (None aside)."""
    union = get_origin(annotation) in (Union, types.UnionType)
    kinds = get_args(annotation) if union else (annotation,)
    return all(
        kind is type(None) or (get_origin(kind) is None and issubclass(kind, str | int | float))
        for kind in kinds
    )


_FIELD_OF_ATTRIBUTE = {_attribute(name): name for name in Job.model_fields}
_STORED_AS_JSON = frozenset(
    name for name, field in Job.model_fields.items() if not _is_scalar(field.annotation)
)

# The placement's instances as a string set, so that a node's report can be checked against
# them in the condition of the write it causes (`contains`), without reading the job first.
_HELD = "instance_ids"


def _held(placement: Mapping[str, Any]) -> dict[str, list[str]]:
    return {"SS": sorted(placement["instance_ids"])}


def iso_timestamp(epoch: float) -> str:
    """Sortable UTC timestamp for index sort keys."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _encode(field_name: str, value: Any) -> dict[str, str]:
    """A field's value in its JSON form as an attribute value."""
    if field_name in _STORED_AS_JSON:
        return {"S": canonical_json(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bool):
        return {"N": str(int(value))}
    return {"N": repr(value)}  # an int, or a float's shortest exact form


def _decode(field_name: str, attribute: Mapping[str, str]) -> Any:
    if "N" in attribute:
        text = attribute["N"]
        return float(text) if any(c in text for c in ".eE") else int(text)
    text = attribute["S"]
    return json.loads(text) if field_name in _STORED_AS_JSON else text


def job_to_item(job: Job) -> dict[str, dict[str, Any]]:
    values = job.model_dump(mode="json", exclude={"spec"})
    # The form intake sized the spec by (`spec_from_mapping`): it fits the item.
    item: dict[str, dict[str, Any]] = {"spec": {"S": job.spec.stored_form()}}
    for field_name, value in values.items():
        if value is not None:
            item[_attribute(field_name)] = _encode(field_name, value)
    if job.placement is not None and job.placement.instance_ids:
        item[_HELD] = _held(values["placement"])
    # Index keys: status and team partitions sorted by submission time.
    item["team"] = {"S": job.spec.team}
    item["created_at"] = {"S": iso_timestamp(job.created_at)}
    return item


def item_to_job(item: Mapping[str, Mapping[str, str]]) -> Job:
    """The job an item holds; the index keys and the instance set, derived, are left out."""
    values = {
        _FIELD_OF_ATTRIBUTE[attribute]: _decode(_FIELD_OF_ATTRIBUTE[attribute], value)
        for attribute, value in item.items()
        if attribute in _FIELD_OF_ATTRIBUTE
    }
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

    def put_many(self, jobs: Sequence[Job]) -> None:
        batch_put(self._client, self._table, [job_to_item(job) for job in jobs], self._backoff)

    def get(self, job_id: str) -> Job:
        response = self._client.get_item(
            TableName=self._table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        )
        if "Item" not in response:
            raise JobNotFound(job_id)
        return item_to_job(response["Item"])

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        keys = [{"job_id": {"S": job_id}} for job_id in job_ids]
        items = batch_get(self._client, self._table, keys, ("job_id", "status"), self._backoff)
        return {item["job_id"]["S"]: JobStatus(item["status"]["S"]) for item in items}

    def transition(
        self,
        job_id: str,
        target: JobStatus,
        now: float,
        changes: JobChanges | None = None,
        *,
        sources: Collection[JobStatus] | None = None,
        holding: str | None = None,
        version: int | None = None,
    ) -> Job:
        allowed = ALLOWED_SOURCES[target] if sources is None else sources
        if not allowed:
            raise IllegalTransition(job_id, None, target)
        change = StatusChange(
            job_id, target, frozenset(allowed), now, changes or JobChanges(), holding, version
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

    def update(self, job_id: str, now: float, changes: JobChanges) -> Job:
        names, values, expression = _update_expression(changes, updated_at=now)
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
    names, values, expression = _update_expression(
        change.changes, status=change.target.value, updated_at=change.now
    )
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
        values[":version"] = _encode("version", change.version)
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
    changes: JobChanges, **written: Any
) -> tuple[dict[str, str], dict[str, dict[str, Any]], str]:
    """The update of the fields `changes` sets and of those the store `written` itself (the
    status, `updated_at`), in their JSON form as the item has them; a field set to None is
    removed."""
    updates = {**changes.model_dump(mode="json", include=changes.model_fields_set), **written}
    names: dict[str, str] = {}
    values: dict[str, dict[str, Any]] = {}
    sets: list[str] = []
    removes: list[str] = []
    for index, (field_name, value) in enumerate(updates.items()):
        names[f"#f{index}"] = _attribute(field_name)
        if value is None:
            removes.append(f"#f{index}")
        else:
            values[f":v{index}"] = _encode(field_name, value)
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
