"""What `gpufleet status`, `list` and `cost` report, over in-memory jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.domain.cost import cost_report
from gpufleet.domain.job import Job, JobChanges, JobStatus, Placement
from gpufleet.domain.settlement import requeue_changes
from gpufleet.domain.spec import parse_spec
from gpufleet.services.reports import (
    CostGrouping,
    cost_lines,
    figures,
    find_jobs,
    group_costs,
    job_detail,
    total_cost,
)
from tests.helpers import local_ports

DAY1 = datetime(2026, 3, 1, 23, 0, tzinfo=UTC).timestamp()  # late on the 1st, UTC
DAY2 = datetime(2026, 3, 2, 1, 0, tzinfo=UTC).timestamp()


def make_job(
    job_id: str,
    team: str,
    created: float,
    held: float = 3600.0,
    hourly: float = 2.0,
    status: JobStatus = JobStatus.SUCCEEDED,
) -> Job:
    spec = parse_spec(f"name: {job_id}\nteam: {team}\nimage: img\ncommand: [x]\n")
    placement = Placement(
        instance_ids=["i-1"],
        instance_type="g5.xlarge",
        capacity_type="spot",
        hourly_usd=hourly,
        launched_at=created + 60,
    )
    return Job(
        job_id=job_id,
        status=status,
        spec=spec,
        source="s3://bucket/jobs/x.yaml",
        created_at=created,
        updated_at=created,
        placement=placement,
        released_at=created + 60 + held,
        cost_usd=round(hourly * held / 3600, 6),
    )


JOBS = [
    make_job("a", "vision", DAY1, held=3600, hourly=2.0),  # $2
    make_job("b", "vision", DAY2, held=1800, hourly=2.0),  # $1
    make_job("c", "nlp", DAY2 + 30, held=3600, hourly=5.0),  # $5
]


def test_a_cost_line_is_the_jobs_identity_and_its_cost_report_as_it_is() -> None:
    line = cost_lines([JOBS[0]])[0]
    assert line["job"] == "a" and line["team"] == "vision" and line["status"] == "SUCCEEDED"
    assert {k: line[k] for k in cost_report(JOBS[0])} == cost_report(JOBS[0])


def test_a_jobs_cost_counts_on_the_utc_day_it_was_submitted() -> None:
    assert [line["day"] for line in cost_lines(JOBS)] == ["2026-03-01", "2026-03-02", "2026-03-02"]


def test_since_keeps_jobs_submitted_at_or_after_it() -> None:
    lines = cost_lines(JOBS, since=DAY2)
    assert [line["job"] for line in lines] == ["b", "c"]


def test_by_team_adds_up_cost_and_held_time_and_counts_jobs_most_expensive_first() -> None:
    rows = group_costs(cost_lines(JOBS), CostGrouping.TEAM)
    assert [row["team"] for row in rows] == ["nlp", "vision"]
    vision = rows[1]
    assert vision["jobs"] == 2
    assert vision["cost_usd"] == pytest.approx(3.0)
    assert vision["held_seconds"] == pytest.approx(5400, abs=1)


def test_a_price_per_hour_is_never_added_up() -> None:
    rows = group_costs(cost_lines(JOBS), CostGrouping.TEAM)
    assert all("hourly_usd" not in row for row in rows)
    # Per job it stays: it is the job's own figure.
    assert group_costs(cost_lines(JOBS), CostGrouping.JOB)[0]["hourly_usd"] == pytest.approx(5.0)


def test_by_day_is_in_calendar_order() -> None:
    rows = group_costs(cost_lines(JOBS), CostGrouping.DAY)
    assert [(row["day"], row["jobs"]) for row in rows] == [("2026-03-01", 1), ("2026-03-02", 2)]
    assert rows[1]["cost_usd"] == pytest.approx(6.0)


def test_by_job_each_job_is_its_own_line() -> None:
    rows = group_costs(cost_lines(JOBS), CostGrouping.JOB)
    assert [row["job"] for row in rows] == ["c", "a", "b"]
    assert rows[0] == cost_lines([JOBS[2]])[0]


def test_any_amount_the_cost_report_adds_is_summed_without_being_named_here() -> None:
    lines = [
        {"job": "a", "team": "t", "cost_usd": 1.0, "storage_usd": 0.25, "estimate_usd": None},
        {"job": "b", "team": "t", "cost_usd": 2.0, "storage_usd": 0.5, "spot": True},
    ]
    total = total_cost(lines)
    assert total == {"jobs": 2, "cost_usd": 3.0, "storage_usd": 0.75}
    assert figures(lines) == ["cost_usd", "storage_usd", "estimate_usd", "spot"]


def test_nothing_to_report_totals_zero_jobs() -> None:
    assert total_cost([]) == {"jobs": 0}
    assert group_costs([], CostGrouping.TEAM) == []


def test_job_detail_says_where_it_ran_what_it_cost_and_what_happened() -> None:
    job = JOBS[0].model_copy(update={"retries": 1, "flags": ["low-utilization"]})
    detail = job_detail(job)
    assert detail["on_demand_only"] is False
    assert job_detail(job.model_copy(update={"on_demand_only": True}))["on_demand_only"]
    assert detail["id"] == "a"
    assert detail["instance_type"] == "g5.xlarge" and detail["capacity_type"] == "spot"
    assert detail["cost_usd"] == pytest.approx(2.0)
    assert detail["retries"] == 1 and detail["flags"] == ["low-utilization"]
    assert detail["submitted_at"] == "2026-03-01T23:00:00+00:00"


def test_find_jobs_filters_by_status_and_team_newest_first() -> None:
    store = local_ports().jobs
    running = make_job("d", "vision", DAY2 + 60, status=JobStatus.RUNNING)
    for job in [*JOBS, running]:
        store.put_new(job)
    assert [j.job_id for j in find_jobs(store, team="vision")] == ["d", "b", "a"]
    assert [j.job_id for j in find_jobs(store, JobStatus.SUCCEEDED, "vision")] == ["b", "a"]
    assert [j.job_id for j in find_jobs(store, JobStatus.RUNNING)] == ["d"]
    assert [j.job_id for j in find_jobs(store, limit=2)] == ["d", "c"]


def test_reserved_runs_are_costed_at_their_price_and_shown_apart_from_spot_and_on_demand() -> None:
    # One hour on spot at $2, preempted and requeued; then two hours on a Capacity Block at the
    # $1.5 the config prices it at.
    spot = make_job("r", "vision", DAY1, held=3600, hourly=2.0, status=JobStatus.RUNNING)
    assert spot.placement is not None and spot.released_at is not None
    requeued = spot.with_changes(requeue_changes(spot, spot.released_at))
    assert requeued.prior_capacity_usd == {"spot": pytest.approx(2.0)}
    launched = DAY1 + 7200
    block = Placement(
        instance_ids=["i-2"],
        instance_type="p5.48xlarge",
        capacity_type="reserved",
        reservation_id="cr-0fedcba9876543210",
        hourly_usd=1.5,
        launched_at=launched,
    )
    ended = requeued.with_changes(
        JobChanges(placement=block, released_at=launched + 7200, cost_usd=None)
    ).model_copy(update={"status": JobStatus.SUCCEEDED})
    report = cost_report(ended)
    assert (report["spot_usd"], report["on_demand_usd"], report["reserved_usd"]) == (
        pytest.approx(2.0),
        0.0,
        pytest.approx(3.0),
    )
    assert report["cost_usd"] == pytest.approx(
        report["spot_usd"]
        + report["on_demand_usd"]
        + report["reserved_usd"]
        + report["storage_usd"]
    )
    # `gpufleet cost` adds each up per team like any amount.
    [row] = group_costs(cost_lines([ended, JOBS[0]]), CostGrouping.TEAM)
    assert (row["spot_usd"], row["reserved_usd"]) == (pytest.approx(4.0), pytest.approx(3.0))
