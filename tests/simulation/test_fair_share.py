"""Fair share over a simulated day: two teams with equal shares that both keep a 16-GPU fleet
busy get GPU-hours within 10% of each other, though one of them submitted all its work first;
with fair share off, the team that came first takes the whole day."""

from __future__ import annotations

from collections import defaultdict

from gpufleet.domain.job import Job
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.domain.settlement import RunEnd, Settlement
from gpufleet.domain.spec import SpotPolicy
from gpufleet.sim.engine import SimPolicy, Workload, simulate
from gpufleet.sim.mapping import TraceMapping, to_spec
from gpufleet.sim.market import MarketConfig
from gpufleet.sim.traces import TraceJob

DAY = 24 * 3600.0
FLEET_GPUS = 16
# Each team alone could keep the fleet busy for the day: 600 jobs of 30 to 60 minutes on one
# GPU are about 450 GPU-hours, the fleet has 384 in a day.
JOBS_PER_TEAM = 600


def two_teams() -> Workload:
    """Team `first` submits all its jobs at the start; team `second` ten minutes later."""
    jobs = [
        TraceJob(
            f"{team}-{i:03d}",
            submit_seconds=offset + i * 0.01,
            duration_seconds=1800.0 + (i * 7919) % 1800,
            gpus=1,
            team=team,
        )
        for team, offset in (("first", 0.0), ("second", 600.0))
        for i in range(JOBS_PER_TEAM)
    ]
    mapping = TraceMapping(high_share=0.0, spot=SpotPolicy.NEVER)
    return Workload(tuple(jobs), tuple(to_spec(j, mapping) for j in jobs), mapping, "two-teams")


class GpuHoursOfTheDay:
    """GPU-hours each team's runs held during the first day (a run across its end counts up to
    it), as the settlements say."""

    def __init__(self) -> None:
        self.by_team: dict[str, float] = defaultdict(float)

    def run_settled(
        self, record: Job, end: RunEnd, settlement: Settlement, worked_from: float | None
    ) -> None:
        started = end.at - settlement.run_held_seconds
        held = max(0.0, min(end.at, DAY) - started)
        self.by_team[record.spec.team] += record.spec.resources.total_gpus * held / 3600

    def ended_queued(self, job_id: str, reason: str, at: float) -> None:
        raise AssertionError(f"{job_id} never ran: {reason}")


def day_of(*, fair_share: bool) -> dict[str, float]:
    queue = QueuePolicy(
        max_gpus=FLEET_GPUS,
        max_instances=FLEET_GPUS,
        reserve_share=0.0,
        fair_share=fair_share,
        # Quotas as large as the fleet: nothing but the order of the queue shares it out.
        teams={team: TeamQuota(gpus=FLEET_GPUS) for team in ("first", "second")},
    )
    observer = GpuHoursOfTheDay()
    result = simulate(
        two_teams(),
        SimPolicy(name="gpufleet", queue=queue),
        seed=1,
        market_config=MarketConfig(spot_launch_failure=0.0),
        observer=observer,
    )
    assert result.completed == result.jobs == 2 * JOBS_PER_TEAM
    return dict(observer.by_team)


def test_equal_shares_get_gpu_hours_within_ten_percent_over_a_busy_day() -> None:
    hours = day_of(fair_share=True)
    first, second = hours["first"], hours["second"]
    assert first + second > 0.9 * FLEET_GPUS * 24  # the fleet was kept busy all day
    assert abs(first - second) <= 0.1 * max(first, second), hours


def test_without_fair_share_the_team_that_came_first_takes_the_day() -> None:
    hours = day_of(fair_share=False)
    assert hours.get("second", 0.0) < 0.1 * hours["first"], hours
