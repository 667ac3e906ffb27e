"""What an admission pass reads beside the queue: the verdicts of the waiting jobs'
dependencies and the month's spend of the teams with a budget. The dispatcher's passes and
`gpufleet queue`'s listing read them alike, so the listing shows what the next pass decides."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.domain.arrays import (
    DependencyVerdict,
    Readiness,
    dependency_verdict,
    held_on,
    settles,
)
from gpufleet.domain.cost import spend_this_month_usd
from gpufleet.domain.job import JobNotFound, JobStatus
from gpufleet.domain.queueing import QueuedJob, QueuePolicy
from gpufleet.domain.spec import Dependency, DependencyMode
from gpufleet.ports import JobStore, Ports
from gpufleet.services.arrays import children_statuses

# Why a job the policy never saw waits (`PassResult.waiting`, `gpufleet queue`).
WAITS_FOR_DEPENDENCIES = "dependencies"


class DependencyStatuses:
    """The verdicts of waiting jobs' dependencies, each dependency's job read once a pass: of
    an array, its children's statuses in index order (a child waiting is judged by its own
    index, for `mode: element`)."""

    def __init__(self, jobs: JobStore) -> None:
        self._jobs = jobs
        self._statuses: dict[str, list[JobStatus] | None] = {}

    def verdict(self, job: QueuedJob) -> DependencyVerdict:
        ended = self._dependencies(job)
        if ended is None:
            # Intake refuses a dependency on no job: only a store that lost it gets here.
            missing = next(d.job for d in job.depends_on if self._statuses_of(d.job) is None)
            return DependencyVerdict(Readiness.CANCEL, f"dependency {missing} does not exist")
        return dependency_verdict(ended, job.array_index)

    def held_on(self, job: QueuedJob) -> Dependency | None:
        """The dependency the job waits in the queue held on (`arrays.held_on`); None: in its
        stream (no dependency, or one missing: the pass cancels it)."""
        ended = self._dependencies(job) if job.depends_on else None
        return None if ended is None else held_on(ended, job.array_index)

    def read_elements(self, holds: Iterable[Dependency]) -> None:
        """Read at once the statuses of the elements jobs are held on (`arrays.element_of`:
        each one child, a plain job), 100 to a read, not one read each."""
        ids = sorted(
            {d.job for d in holds if d.mode is DependencyMode.ELEMENT} - set(self._statuses)
        )
        found = self._jobs.statuses(ids) if ids else {}
        for job_id in ids:
            self._statuses[job_id] = [found[job_id]] if job_id in found else None

    def settles(self, dependency: Dependency) -> bool:
        """Whether the jobs held on `dependency` are to be judged again (a missing one: yes,
        so that the pass cancels them)."""
        statuses = self._statuses_of(dependency.job)
        return statuses is None or settles(dependency, statuses)

    def _dependencies(self, job: QueuedJob) -> list[tuple[Dependency, list[JobStatus]]] | None:
        """Each dependency with its statuses; None when one's job does not exist."""
        ended = []
        for dep in job.depends_on:
            statuses = self._statuses_of(dep.job)
            if statuses is None:
                return None
            ended.append((dep, statuses))
        return ended

    def _statuses_of(self, job_id: str) -> list[JobStatus] | None:
        if job_id not in self._statuses:
            self._statuses[job_id] = self._read(job_id)
        return self._statuses[job_id]

    def _read(self, job_id: str) -> list[JobStatus] | None:
        try:
            job = self._jobs.get(job_id)
        except JobNotFound:
            return None
        return children_statuses(self._jobs, job) if job.spec.is_array else [job.status]


# A team's jobs read to total its spend this month.
SPEND_HISTORY = 1000


def team_spend(ports: Ports, policy: QueuePolicy, now: float) -> dict[str, float]:
    """Month-to-date spend of every team that has a monthly budget (and only those)."""
    return {
        team: spend_this_month_usd(ports.jobs.recent_for_team(team, SPEND_HISTORY), now)
        for team, quota in sorted(policy.teams.items())
        if quota.monthly_budget_usd is not None
    }
