"""Job changes are typed as the job is, and the DynamoDB item is the job's JSON form."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.domain.job import (
    FIXED_FIELDS,
    STORE_WRITTEN_FIELDS,
    InvalidJobChanges,
    Job,
    JobChanges,
    JobStatus,
    Placement,
)
from gpufleet.domain.spec import parse_spec
from gpufleet.errors import RefusedInput
from gpufleet.topology import JOBS_TABLE

SPEC = parse_spec("name: t\nteam: ml\nimage: img\ncommand: [x]\n")
JOB = Job(
    job_id="j-" + "a" * 20,
    status=JobStatus.RUNNING,
    spec=SPEC,
    source="test",
    created_at=100.0,
    updated_at=100.0,
    placement=Placement(
        instance_ids=["i-2", "i-1"],
        instance_type="g6.xlarge",
        capacity_type="spot",
        hourly_usd=1.25,
        launched_at=150.5,
    ),
    retries=1,
    run_result={"exit_code": 0},
)


def test_changes_name_every_field_of_a_job_but_those_fixed_or_written_by_the_store() -> None:
    changeable = set(Job.model_fields) - FIXED_FIELDS - STORE_WRITTEN_FIELDS
    assert set(JobChanges.model_fields) == changeable
    for name in changeable:
        job_type = Job.model_fields[name].annotation
        assert JobChanges.model_fields[name].annotation == Optional[job_type], name  # noqa: UP045


def test_changes_apply_only_the_fields_they_set_and_later_ones_win() -> None:
    changes = JobChanges(retries=2, failure_reason="x") | JobChanges(retries=3, placement=None)
    assert changes.fields() == {"retries": 3, "failure_reason": "x", "placement": None}
    changed = JOB.with_changes(changes)
    assert (changed.retries, changed.failure_reason, changed.placement) == (3, "x", None)
    assert changed.run_result == JOB.run_result and changed.version == JOB.version
    assert not JobChanges() and JOB.with_changes(JobChanges()) == JOB


def test_changes_refused_are_refused_input_naming_each_field() -> None:
    with pytest.raises(InvalidJobChanges) as refused:
        JobChanges.parse({"retires": 3, "retries": "three", "flags": None, "cost_usd": 0.5})
    assert isinstance(refused.value, RefusedInput)
    assert set(refused.value.fields) == {"retires", "retries", "flags"}
    assert "retires: no change sets it" in str(refused.value)
    assert JobChanges.parse({"cost_usd": 0.5, "placement": None}).fields() == {
        "cost_usd": 0.5,
        "placement": None,
    }


def test_the_item_is_the_jobs_json_form_with_the_keys_the_indexes_need() -> None:
    item = job_to_item(JOB)
    for index in JOBS_TABLE.indexes:
        for key in (index.partition_key, index.sort_key):
            assert key is not None and "S" in item[key], (index.name, key)
    assert item["created_at"]["S"].startswith("1970-01-01T00:01:40")  # sortable, for the indexes
    assert item["created_ts"] == {"N": "100.0"} and item["retries"] == {"N": "1"}
    assert item["instance_ids"] == {"SS": ["i-1", "i-2"]}  # what a report's write checks
    assert json.loads(item["placement"]["S"]) == JOB.placement.model_dump(mode="json")  # type: ignore[union-attr]
    assert "failure_reason" not in item  # no value, no attribute
    assert item_to_job(item) == JOB
