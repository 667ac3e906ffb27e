"""What an array's children add up to, read through the job store (docs/arrays.md).

The array's own record holds its spec and runs nothing: its progress is its children's
statuses (`domain/arrays.py:array_status`, `status_counts`), read here for the dispatcher's
dependencies, `gpufleet list --array` and the demo.
"""

from __future__ import annotations

from typing import Any

from gpufleet.domain.arrays import array_status, child_job_id, status_counts
from gpufleet.domain.job import Job, JobNotFound, JobStatus
from gpufleet.ports import JobStore


def children_statuses(jobs: JobStore, array: Job) -> list[JobStatus] | None:
    """Each child's status in index order; for an array that failed at intake (nothing could
    run it: no children were made; nothing else fails an array's record) FAILED for every
    child. None when a child is missing (only a store that lost it: intake stores the
    children before the array)."""
    if array.status is JobStatus.FAILED:
        return [JobStatus.FAILED] * array.spec.size
    children = [child_job_id(array.job_id, i) for i in range(array.spec.size)]
    found = jobs.statuses(children)  # 100 a read, not one read a child
    if len(found) != len(children):
        return None
    return [found[child] for child in children]


def array_progress(jobs: JobStore, array: Job) -> dict[str, Any]:
    """The array's status from its children's, and how many are in each status."""
    statuses = children_statuses(jobs, array)
    if statuses is None:
        raise JobNotFound(f"a child of {array.job_id}")
    return {
        "id": array.job_id,
        "name": array.spec.name,
        "team": array.spec.team,
        "size": array.spec.size,
        "status": array_status(statuses).value,
        "counts": {status.value: count for status, count in status_counts(statuses).items()},
    }
