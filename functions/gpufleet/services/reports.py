"""What the CLI reports about jobs: one job in detail, job listings, and cost by team, job or day.

Cost lines are `domain.cost.cost_report(job)`, whatever keys it carries (`job_costs`); adding them
up treats every numeric key as an amount except prices per hour, which do not add up across
jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpufleet.domain.cost import cost_report
from gpufleet.domain.job import Job, JobStatus
from gpufleet.ports import JobStore

# A team's listing with a status filter looks at this many of the team's newest jobs.
TEAM_DEPTH = 1000
# What a cost line says about its job before the figures of its cost report; a group adds "jobs".
LINE_IDENTITY = ("job", "name", "team", "day", "status")


class CostGrouping(StrEnum):
    TEAM = "team"
    JOB = "job"
    DAY = "day"


def utc_day(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).date().isoformat()


def utc_time(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def job_costs(job: Job) -> dict[str, Any]:
    """The job's cost report as the CLI shows it. A multi-stage job ran on several instance
    types, each stage on its own: its stages carry their prices per hour, and the job shows
    none (an average of them would be a price no instance had)."""
    report = cost_report(job)
    if job.spec.stages:
        report["hourly_usd"] = None
    return report


def job_detail(job: Job, current_wait_seconds: float | None = None) -> dict[str, Any]:
    """Everything `gpufleet status ID` shows about a job, JSON-ready. `current_wait_seconds`:
    how long a waiting job has been in the admission queue this time (the record counts each
    wait once it ends), so that a job that waits shows it."""
    placement = job.placement
    resources = job.effective_spec.resources
    return {
        "id": job.job_id,
        "name": job.spec.name,
        "team": job.spec.team,
        "priority": job.spec.priority.value,
        "status": job.status.value,
        "submitted_at": utc_time(job.created_at),
        "updated_at": utc_time(job.updated_at),
        "source": job.source,
        "gpus": resources.gpus,
        "nodes": resources.nodes,
        "instance_type": placement.instance_type if placement else None,
        "capacity_type": placement.capacity_type if placement else None,
        "zone": placement.zone if placement else None,
        "instances": list(placement.instance_ids) if placement else [],
        "waited_seconds": round(job.waited_seconds + (current_wait_seconds or 0.0), 3),
        **job_costs(job),
        "attempts": job.attempts,
        "retries": job.total("retries"),
        "interruptions": job.total("interruptions"),
        "preemptions": job.total("preemptions"),
        "ondemand_fallback": job.ondemand_fallback,
        "on_demand_only": job.on_demand_only,
        "exit_code": job.exit_code,
        "failure_reason": job.failure_reason,
        "flags": list(job.flags),
        # A multi-stage job's stages, in order: where each ran, what it cost (they add up to
        # cost_usd); empty for other jobs.
        "stages": job.stage_summaries(),
        # A child of an array or sweep: the array's id and its index there (docs/arrays.md).
        **({"array_id": job.array_id, "array_index": job.array_index} if job.array_id else {}),
    }


def find_jobs(
    store: JobStore, status: JobStatus | None = None, team: str | None = None, limit: int = 50
) -> list[Job]:
    """The newest jobs, optionally of one status and one team, newest first."""
    if team is None:
        return store.list_jobs(status, limit)
    if status is None:
        return store.recent_for_team(team, limit)
    # No index has both keys: the team's index, filtered.
    return [j for j in store.recent_for_team(team, TEAM_DEPTH) if j.status is status][:limit]


def cost_lines(jobs: Iterable[Job], since: float | None = None) -> list[dict[str, Any]]:
    """One line per job submitted at or after `since` (epoch seconds): who, when, and its
    cost report. A job's cost counts on the (UTC) day it was submitted."""
    return [
        {
            "job": job.job_id,
            "name": job.spec.name,
            "team": job.spec.team,
            "day": utc_day(job.created_at),
            "status": job.status.value,
            **job_costs(job),
        }
        for job in sorted(jobs, key=lambda j: j.created_at)
        if since is None or job.created_at >= since
    ]


def figures(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The cost figures in `rows`, in the order the cost report gives them."""
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in LINE_IDENTITY and k != "jobs" and k not in names]
    return names


def _is_amount(key: str, value: object) -> bool:
    """A number that adds up across jobs: not a flag, not a price per hour."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not key.startswith("hourly_")
    )


def total_cost(lines: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The number of jobs and the sum of every amount in `lines` (absent values count 0)."""
    count = 0
    sums: dict[str, float] = {}
    for line in lines:
        count += 1
        for key, value in line.items():
            if _is_amount(key, value):
                sums[key] = sums.get(key, 0.0) + value
    return {"jobs": count, **{key: round(value, 6) for key, value in sums.items()}}


def group_costs(lines: Sequence[Mapping[str, Any]], by: CostGrouping) -> list[dict[str, Any]]:
    """The cost lines added up per team or per day (most expensive first, then by name), or
    per job, where each group is the job's own line."""
    if by is CostGrouping.JOB:
        rows = [dict(line) for line in lines]
    else:
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for line in lines:
            groups.setdefault(str(line[by.value]), []).append(line)
        rows = [{by.value: key, **total_cost(members)} for key, members in groups.items()]
    if by is CostGrouping.DAY:
        return sorted(rows, key=lambda row: row["day"])
    return sorted(rows, key=lambda row: (-(row.get("cost_usd") or 0.0), str(row[by.value])))
